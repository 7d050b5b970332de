"""The simulated judge in process: the `Judge` protocol on the shared core, no sockets.

It sleeps with `trio.sleep`, so `MockClock` virtual time drives its latency.
"""

from __future__ import annotations

from typing import final

from genrm_trio.judge.base import (
    JudgeBadJSON,
    JudgeCall,
    JudgeHTTPError,
    JudgeReply,
    JudgeTransportError,
    ReplyStatus,
)
from genrm_trio.testing.core import (
    DEFAULT_BUDGET_TOKENS,
    Decision,
    SimCall,
    SimConfig,
    SimCore,
    SimStatistics,
    prompt_length,
    token_count,
)
from genrm_trio.testing.faults import (
    DROP_MESSAGE,
    NOT_JSON_BODY,
    fault_text,
    http_fault,
    not_json_message,
)

__all__ = ["SimJudge"]


@final
class SimJudge:
    """The simulated judge as an in-process `Judge` (no HTTP): see `genrm_trio.testing`."""

    def __init__(self, config: SimConfig | None = None) -> None:
        self._core = SimCore(config if config is not None else SimConfig())

    @property
    def config(self) -> SimConfig:
        return self._core.config

    @property
    def endpoint(self) -> str:
        return "sim:0"

    @property
    def path(self) -> str:
        return "/v1/responses"

    @property
    def calls(self) -> list[SimCall]:
        """Every call received so far, in arrival order (empty if `record_calls` is off)."""
        return self._core.calls

    def statistics(self) -> SimStatistics:
        return self._core.statistics()

    async def attempt(self, call: JudgeCall) -> JudgeReply:
        decision = self._core.begin(call, "in_process")
        try:
            await self._core.serve(decision.delay_s)
            return self._reply(call, decision)
        finally:
            self._core.end()

    def _reply(self, call: JudgeCall, decision: Decision) -> JudgeReply:
        fault, rule = decision.fault, decision.rule
        input_tokens = token_count(prompt_length(call))
        if fault == "drop":
            raise JudgeTransportError("RemoteProtocolError", DROP_MESSAGE)
        if fault == "not_json":
            raise JudgeBadJSON(not_json_message(NOT_JSON_BODY))
        if fault is not None:
            http = http_fault(fault, rule)
            if http is not None:
                raise JudgeHTTPError(http.status, http.body, http.retry_after_s)
        budget = call.max_output_tokens or DEFAULT_BUDGET_TOKENS
        if fault == "budget_exhausted" or self._core.cut_off(decision, budget):
            return JudgeReply(ReplyStatus.BUDGET_EXHAUSTED, "", input_tokens, budget)
        text = fault_text(fault, rule, call.response_1, call.response_2, decision.verdict)
        status = ReplyStatus.COMPLETED if text.strip() else ReplyStatus.UNUSABLE
        tokens = decision.need if decision.need is not None else token_count(len(text))
        return JudgeReply(status, text, input_tokens, tokens)

    async def aclose(self) -> None:
        return None
