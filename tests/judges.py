"""A scripted fake `Judge` for exact engine tests.

Each attempt is decided by a script from the two answers shown (``response_1``, ``response_2``)
and the attempt's ordinal for that shown pair; latency is a ``trio.sleep`` so virtual time drives
it. Every attempt is recorded with its virtual start time, whether it finished or was cancelled,
and what a probe ``ContextVar`` held inside the call (context isolation tests).
"""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import trio

from genrm_trio.config import DEFAULT_COMPARISONS_PER_ROLLOUT, Settings
from genrm_trio.domain.model import (
    CompareFailed,
    CompareInput,
    CompareResult,
    Masked,
    MemberOutcome,
    RequestRejected,
    Scored,
    VerifyInput,
)
from genrm_trio.domain.scoring import NO_ADJUSTMENTS, JudgedComparison, plan_comparisons
from genrm_trio.engine.engine import Engine, open_engine
from genrm_trio.judge.base import (
    JudgeCall,
    JudgeHTTPError,
    JudgeReply,
    JudgeTransportError,
    ReplyStatus,
)

probe: ContextVar[str | None] = ContextVar("tests_probe", default=None)


def verdict_text(score_1: float, score_2: float, ranking: float) -> str:
    return json.dumps({"score_1": score_1, "score_2": score_2, "ranking": ranking})


def quality(answer: str) -> int:
    """The default quality of an answer ``a{i}...``: ``1 + i % 5``; anything else scores 3."""
    digits = ""
    for ch in answer[1:]:
        if not ch.isdigit():
            break
        digits += ch
    return 1 + int(digits) % 5 if answer.startswith("a") and digits else 3


def default_verdict(response_1: str, response_2: str) -> tuple[float, float, float]:
    """Scores are the answers' qualities; the ranking follows their difference."""
    q1, q2 = quality(response_1), quality(response_2)
    return float(q1), float(q2), 3.5 + (q2 - q1) / 2


def member_oriented(
    n: int,
    strategy: str,
    judges: int = 1,
    balance: str = "none",
    degree: int = DEFAULT_COMPARISONS_PER_ROLLOUT,
) -> list[JudgedComparison]:
    """The comparisons of a group of `n` answers `a0..` judged with `ScriptedJudge`'s default
    verdicts (`plan_comparisons`' plan), flipped back to member orientation: what the
    aggregation must have seen."""
    out = []
    for p in plan_comparisons(n, strategy, judges, balance, degree):
        first, second = p.shown
        verdict = default_verdict(f"a{first}", f"a{second}")
        out.append(JudgedComparison(p.i, p.j, p.k, p.to_member_orientation(verdict)))
    return out


@dataclass
class Step:
    """What one attempt does: wait ``delay`` seconds, then reply, raise, or hang forever."""

    delay: float = 0.0
    text: str | None = None  # reply text; None means the default verdict
    status: ReplyStatus = ReplyStatus.COMPLETED
    error: BaseException | None = None
    hang: bool = False
    input_tokens: int | None = 100
    output_tokens: int | None = 10


def ok(
    score_1: float, score_2: float, ranking: float, *, delay: float = 0.0, tokens: int = 10
) -> Step:
    return Step(delay=delay, text=verdict_text(score_1, score_2, ranking), output_tokens=tokens)


def http_error(
    status: int = 500, body: bytes = b"judge unavailable", *, delay: float = 0.0
) -> Step:
    return Step(delay=delay, error=JudgeHTTPError(status, body))


def connect_error(*, delay: float = 0.0) -> Step:
    return Step(delay=delay, error=JudgeTransportError("ConnectError", "connection refused"))


def boom(message: str = "kaboom", *, delay: float = 0.0) -> Step:
    """A non-judge error (a bug, request construction...): fails the cohort with 503."""
    return Step(delay=delay, error=RuntimeError(message))


def hang(*, delay: float = 0.0) -> Step:
    return Step(delay=delay, hang=True)


@dataclass
class Call:
    """One recorded attempt."""

    started: float
    call: JudgeCall
    probe: str | None
    ended: float | None = None
    cancelled: bool = False
    cancelled_at: float | None = None  # when the caller hung up

    @property
    def shown(self) -> tuple[str, str]:
        return (self.call.response_1, self.call.response_2)


Script = Callable[[str, str, int], Step | None]


@dataclass
class ScriptedJudge:
    """The `Judge` protocol, scripted per shown pair of answers.

    ``pairs`` maps ``(response_1, response_2)`` to a step, or to a list of steps consumed one per
    attempt (the last repeats). ``script`` is consulted first when given; returning None falls
    back to ``pairs`` and then to ``default`` (the default verdict after ``latency``).
    """

    pairs: Mapping[tuple[str, str], Step | list[Step]] = field(default_factory=dict)
    script: Script | None = None
    latency: float = 0.0
    calls: list[Call] = field(default_factory=list)
    closed: bool = False

    @property
    def endpoint(self) -> str:
        return "judge.test:8000"

    @property
    def path(self) -> str:
        return "/v1/responses"

    def count(self, response_1: str, response_2: str) -> int:
        return sum(1 for c in self.calls if c.shown == (response_1, response_2))

    @property
    def in_flight(self) -> int:
        return sum(1 for c in self.calls if c.ended is None and not c.cancelled)

    def _step(self, call: JudgeCall, ordinal: int) -> Step:
        r1, r2 = call.response_1, call.response_2
        if self.script is not None:
            step = self.script(r1, r2, ordinal)
            if step is not None:
                return step
        planned = self.pairs.get((r1, r2))
        if isinstance(planned, list):
            return planned[min(ordinal, len(planned) - 1)]
        if planned is not None:
            return planned
        return Step(delay=self.latency)

    async def attempt(self, call: JudgeCall) -> JudgeReply:
        ordinal = self.count(call.response_1, call.response_2)
        record = Call(trio.current_time(), call, probe.get())
        self.calls.append(record)
        step = self._step(call, ordinal)
        try:
            await trio.sleep(step.delay)
            if step.hang:
                await trio.sleep(math.inf)
        except BaseException:
            record.cancelled = True
            record.cancelled_at = trio.current_time()
            raise
        record.ended = trio.current_time()
        if step.error is not None:
            raise step.error
        text = step.text
        if text is None:
            text = verdict_text(*default_verdict(call.response_1, call.response_2))
        return JudgeReply(step.status, text, step.input_tokens, step.output_tokens)

    async def aclose(self) -> None:
        self.closed = True


# --- engine test helpers -------------------------------------------------------------------------

TEST_LIMIT_S = 3600.0  # every test is bounded by this much virtual time

BASE_SETTINGS: dict[str, Any] = {
    "num_rollouts_per_prompt": 2,
    "cohort_collection_timeout_s": 1.0,
    "cohort_evaluation_timeout_s": 1.0,
    "judge_request_timeout_s": 0.2,
    "genrm_parse_retries": 0,
    "genrm_parse_retry_sleep_s": 0.0,
}


def settings(**overrides: Any) -> Settings:
    return Settings.model_validate({**BASE_SETTINGS, **overrides})


def response(
    answer: str, *, reasoning: str = "", rid: str | None = None, extra: Any = None
) -> dict[str, Any]:
    output: list[dict[str, Any]] = []
    if reasoning:
        output.append(
            {"type": "reasoning", "summary": [{"type": "summary_text", "text": reasoning}]}
        )
    output.append(
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": answer}],
        }
    )
    body: dict[str, Any] = {"id": rid or f"resp-{answer}", "output": output}
    if extra is not None:
        body["extra"] = extra
    return body


def member(
    index: int | None,
    *,
    group: str | None = "g",
    attempt: int = 0,
    answer: str | None = None,
    reasoning: str = "",
    rid: str | None = None,
    prompt: Any = "Hello",
    principle: str | None = None,
    task_index: int | None = None,
    prompt_id: str | None = None,
    rubric_ids: tuple[int, ...] | None = None,
    baseline: str | None = None,
    attempt_given: bool = True,
) -> VerifyInput:
    """A `/verify` input for slot ``index``; the answer defaults to ``a{index}``."""
    text = answer if answer is not None else f"a{index}"
    metadata = {"baseline_response": baseline} if baseline is not None else None
    return VerifyInput(
        input=prompt,
        response=response(text, reasoning=reasoning, rid=rid),
        principle=principle,
        metadata=metadata,
        task_index=task_index,
        group_id=group,
        group_attempt=attempt,
        group_attempt_given=attempt_given,
        rollout_index=index,
        prompt_id=prompt_id,
        expected_rubric_ids=rubric_ids,
    )


def compare_input(answers: Sequence[str], *, principle: str | None = None) -> CompareInput:
    return CompareInput(
        history=[{"role": "user", "content": "Hello"}],
        responses=[response(a) for a in answers],
        principle=principle,
    )


Reply = MemberOutcome | RequestRejected


def scored(replies: Sequence[Any]) -> dict[int, dict[str, Any]]:
    """Each scored reply's row, by position."""
    return {i: dict(r.result) for i, r in enumerate(replies) if isinstance(r, Scored)}


def masked(replies: Sequence[Any]) -> dict[int, str]:
    """Each masked reply's reason, by position."""
    return {i: r.reason for i, r in enumerate(replies) if isinstance(r, Masked)}


def judge_error(pair: tuple[int, int]) -> str:
    """The failure text of comparison ``pair`` whose judge answered `http_error()`'s default
    500, under `settings()`'s judge and deadline."""
    return (
        f"GenRM judge judge.test:8000 /v1/responses pair={pair} deadline=0.2s: "
        "JudgeHTTPError: HTTP 500; response=judge unavailable"
    )


NO_ADJ = NO_ADJUSTMENTS  # the scoring tests' short name for it


async def verify(engine: Engine, item: VerifyInput) -> Reply:
    try:
        return await engine.verify(item)
    except RequestRejected as rejected:
        return rejected


async def gather(
    engine: Engine, items: Sequence[VerifyInput], *, stagger: float = 0.0
) -> list[Reply]:
    """Send ``items`` concurrently (``stagger`` seconds apart) and return their replies."""
    out: list[Reply | None] = [None] * len(items)

    async def one(position: int, item: VerifyInput) -> None:
        await trio.sleep(position * stagger)
        out[position] = await verify(engine, item)

    async with trio.open_nursery() as nursery:
        for position, item in enumerate(items):
            nursery.start_soon(one, position, item)
    assert all(r is not None for r in out)
    return [r for r in out if r is not None]


async def compare(engine: Engine, item: CompareInput) -> CompareResult | CompareFailed:
    try:
        return await engine.compare(item)
    except CompareFailed as failed:
        return failed


def assert_no_leaks(engine: Engine, judge: ScriptedJudge | None = None) -> None:
    stats = engine.statistics()
    assert stats.closed
    assert stats.cohorts == 0, stats
    assert stats.active_cohorts == 0, stats
    assert stats.terminal_records == 0, stats
    assert stats.watermarks == 0, stats
    assert stats.waiters == 0, stats
    assert stats.running_tasks == 0, stats
    assert stats.compares_in_flight == 0, stats
    if judge is not None:
        assert judge.in_flight == 0, [c for c in judge.calls if c.ended is None]


@asynccontextmanager
async def running(config: Settings, judge: ScriptedJudge, **kwargs: Any) -> AsyncIterator[Engine]:
    """An engine bounded by a virtual-time limit, leak-checked after it closes."""
    with trio.fail_after(TEST_LIMIT_S):
        async with open_engine(config, judge, **kwargs) as engine:
            yield engine
    assert_no_leaks(engine, judge)
