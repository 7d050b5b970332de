"""The judge's window, its reading of the answers and its taking of the GenRM roles, end to end
through the production path (make_judge's fleet of HttpJudges over an in-memory network, the
Comparator), in virtual time (#37 items 1, 4, 5):

- an attempt the simulated judge refuses with vLLM's 400 is resent once with a budget that fits,
  the window is learned from it and later attempts are fitted up front; one that cannot be
  fitted fails its comparison at once (`context_overflow`), never retried;
- the answer probe, at the fleet's first watch: Gym's protocol at a plain server is found
  (ERROR, `/readyz` reason) before any workload; a bare 500 that the instruct messages get
  through is the roles' refusal;
- a refusal naming a role, or replies in prose, make the replica's `roles_refused`.
"""

from __future__ import annotations

import logging
from collections.abc import MutableMapping
from typing import Any

import pytest
import trio
from asgi_judges import plain_openai_server, reply_json, request_json

from genrm_trio.config import Settings, settings_from_mapping
from genrm_trio.http.app import not_ready_reason
from genrm_trio.judge.answer_check import unread_fix
from genrm_trio.judge.attempts import Comparator
from genrm_trio.judge.base import JudgeCall, JudgeError, JudgeHTTPError
from genrm_trio.judge.factory import make_judge
from genrm_trio.judge.fleet import JudgeFleet
from genrm_trio.judge.prompt_check import NO_VERDICT_REPLIES
from genrm_trio.metrics import Metrics
from genrm_trio.testing.asgi import sim_asgi_app
from genrm_trio.testing.core import SimConfig
from genrm_trio.testing.network import MemoryNetwork, serve_asgi

URL = "http://judge.test:8000/v1"
LABEL = "judge.test:8000"


def settings(api: str = "chat_completions", **extra: Any) -> Settings:
    judge = {"base_url": URL, "api": api, **extra.pop("judge", {})}
    return settings_from_mapping({"judge": judge, **extra})


def fleet_of(app: Any, config: Settings) -> JudgeFleet:
    return make_judge(config, backend=MemoryNetwork(serve_asgi(app)))


# --- the context window ---------------------------------------------------------------------------

# 4132 characters: 1033 prompt tokens by the simulator's count (4 a token), the numbers
WINDOW_CALL = JudgeCall(
    [{"role": "user", "content": "q" * 3132}],
    "[quality=5] " + "a" * 488,
    "[quality=1] " + "b" * 488,
    None,
)


def window_settings(**judge: Any) -> Settings:
    return settings(
        genrm_responses_create_params={"input": [], "max_output_tokens": 2048},
        genrm_parse_retries=3,
        judge={"probe": False, **judge},
    )


async def test_an_overflow_is_resent_once_fitted_and_the_window_is_learned(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    app = sim_asgi_app(SimConfig(context_tokens=3000))
    config = window_settings()
    fleet = fleet_of(app, config)
    metrics = Metrics()
    metrics.watch_replicas(fleet.replica_stats)
    comparator = Comparator(fleet, config, metrics)
    caplog.set_level(logging.INFO, "genrm_trio.judge")
    with trio.fail_after(5):
        first = await comparator.compare(WINDOW_CALL, pair=(0, 1), judge_pass=0)
        second = await comparator.compare(WINDOW_CALL, pair=(1, 0), judge_pass=0)
    await fleet.aclose()
    assert (first.attempts, second.attempts) == (1, 1)  # the resend is part of the attempt
    assert first.selected.ranking == second.selected.ranking < 3.5  # scored: quality 5 over 1
    asked = [call.max_output_tokens for call in app.sim.calls]
    # 2048 refused; 3000 - 1033 - 16 fits; then fitted up front from the learned window with
    # the estimate of 4132 bytes / 3 = 1378 tokens
    assert asked == [2048, 1951, 3000 - 1378 - 16]
    assert app.sim.statistics().overflows == 1
    assert (
        "judge context window: window 3000 tokens, prompt 1033 tokens, output budget 2048 "
        "tokens; resending once with max_output_tokens 1951"
    ) in caplog.text

    def sample(name: str, labels: dict[str, str]) -> float | None:
        return metrics.registry.get_sample_value(name, labels)

    assert sample("genrm_trio_judge_calls_total", {"outcome": "context_overflow"}) == 1.0
    assert sample("genrm_trio_judge_calls_total", {"outcome": "completed"}) == 2.0
    assert sample("genrm_trio_judge_replica_context_overflows_total", {"replica": LABEL}) == 1.0
    assert sample("genrm_trio_judge_retries_total", {"cause": "http"}) == 0.0


async def test_a_configured_window_fits_the_first_attempt(
    autojump_clock: trio.testing.MockClock,
) -> None:
    app = sim_asgi_app(SimConfig(context_tokens=3000))
    config = window_settings(context_tokens=3000)
    fleet = fleet_of(app, config)
    with trio.fail_after(5):
        await Comparator(fleet, config, Metrics()).compare(WINDOW_CALL, pair=(0, 1), judge_pass=0)
    await fleet.aclose()
    assert [call.max_output_tokens for call in app.sim.calls] == [3000 - 1378 - 16]
    assert app.sim.statistics().overflows == 0


async def test_an_overflow_that_cannot_be_fitted_fails_at_once_with_the_numbers(
    autojump_clock: trio.testing.MockClock,
) -> None:
    app = sim_asgi_app(SimConfig(context_tokens=3000))
    config = window_settings(min_output_tokens=2000)
    fleet = fleet_of(app, config)
    with trio.fail_after(5), pytest.raises(JudgeError) as info:
        await Comparator(fleet, config, Metrics()).compare(WINDOW_CALL, pair=(0, 1), judge_pass=0)
    await fleet.aclose()
    assert len(app.sim.calls) == 1  # never retried unchanged, whatever genrm_parse_retries
    assert info.value.attempts == 1
    assert info.value.message == (
        f"GenRM judge {LABEL} /v1/chat/completions pair=(0, 1) deadline=1800.0s: "
        "ContextOverflow: the judge's context window is too small for this comparison: window "
        "3000 tokens, prompt 1033 tokens, output budget 2048 tokens; 1951 tokens fit, below "
        "judge.min_output_tokens (2000); fixes: a smaller "
        "genrm_responses_create_params.max_output_tokens, a judge with a longer context window "
        "(vLLM --max-model-len), or shorter answers"
    )


# --- the answer probe -----------------------------------------------------------------------------


async def watched(fleet: JudgeFleet, seconds: float = 1.0) -> None:
    """The fleet watched for `seconds` (as an engine watches it), then closed."""
    async with trio.open_nursery() as nursery:
        nursery.start_soon(fleet.keep_watch)
        await trio.sleep(seconds)
        nursery.cancel_scope.cancel()
    await fleet.aclose()


async def test_the_answer_probe_finds_gyms_protocol_at_a_plain_server_before_any_workload(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    seen: list[int] = []
    config = settings("genrm_model")
    fleet = fleet_of(plain_openai_server(seen), config)
    with caplog.at_level(logging.ERROR, "genrm_trio.judge"):
        await watched(fleet)
    assert len(seen) == 1  # one comparison
    [stats] = fleet.replica_stats()
    reason = (
        f"the start-up probe's answers of 4040 bytes gave a prompt of {seen[0]} tokens, fewer "
        "than they alone need (at most 32 bytes a token)"
    )
    assert stats.answers_unread == reason
    assert [r.getMessage() for r in caplog.records] == [
        f"the judge does not read the answers (replica {LABEL}): {reason}. Fix: judge.api "
        "genrm_model sends the answers in metadata, which only Gym's genrm_model server shows "
        "the model; for vLLM or any other OpenAI-compatible server set judge.api: "
        "chat_completions (or openai_responses)"
    ]
    assert not_ready_reason([stats], "genrm_model") == (
        f"the judge does not read the answers (replica {LABEL}): {reason}. Fix: "
        + unread_fix("genrm_model")
    )


@pytest.mark.parametrize("api", ["chat_completions", "openai_responses"])
async def test_the_answer_probe_passes_a_judge_that_reads_the_answers(
    autojump_clock: trio.testing.MockClock, api: str, caplog: pytest.LogCaptureFixture
) -> None:
    seen: list[int] = []
    fleet = fleet_of(plain_openai_server(seen), settings(api))
    with caplog.at_level(logging.INFO, "genrm_trio.judge"):
        await watched(fleet)
    [stats] = fleet.replica_stats()
    assert (stats.answers_unread, stats.roles_refused) == (None, None)
    assert seen[0] > 4040 // 32
    assert f"judge replica {LABEL} reads the answers" in caplog.text
    assert not_ready_reason([stats], api) is None


async def test_no_answer_probe_with_judge_probe_off(
    autojump_clock: trio.testing.MockClock,
) -> None:
    seen: list[int] = []
    await watched(
        fleet_of(plain_openai_server(seen), settings("genrm_model", judge={"probe": False}))
    )
    assert seen == []


def strict_template_server(statuses: list[int]) -> Any:
    """A server whose chat template raises on the GenRM roles, answering a bare 500 as
    transformers serve does, and that reads any other prompt."""

    async def app(scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        request = await request_json(receive)
        roles = {m["role"] for m in request["messages"]}
        if roles - {"system", "user", "assistant"}:
            statuses.append(500)
            await send(
                {
                    "type": "http.response.start",
                    "status": 500,
                    "headers": [(b"content-type", b"text/plain")],
                }
            )
            await send({"type": "http.response.body", "body": b"Internal Server Error"})
            return
        statuses.append(200)
        prompt = sum(len(m["content"]) for m in request["messages"]) // 4
        await reply_json(
            send,
            {
                "choices": [{"message": {"content": "x"}, "finish_reason": "length"}],
                "usage": {"prompt_tokens": prompt, "completion_tokens": 1},
            },
        )

    return app


async def test_a_bare_500_for_the_roles_is_found_by_the_instruct_messages(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    statuses: list[int] = []
    fleet = fleet_of(strict_template_server(statuses), settings())
    with caplog.at_level(logging.ERROR, "genrm_trio.judge"):
        await watched(fleet)
    assert statuses == [500, 200]  # the probe, then the same comparison in the instruct messages
    [stats] = fleet.replica_stats()
    reason = (
        "it refused the GenRM roles: JudgeHTTPError: HTTP 500; response=Internal Server Error, "
        "and the same comparison with judge.prompt: instruct got an answer"
    )
    assert stats.roles_refused == reason
    fix = "set judge.prompt: instruct (a system and a user message any instruct model reads)"
    assert [r.getMessage() for r in caplog.records] == [
        f"the judge does not take the GenRM roles (replica {LABEL}): {reason}. Fix: {fix}"
    ]
    assert not_ready_reason([stats], "chat_completions") == (
        f"the judge does not take the GenRM roles (replica {LABEL}): {reason}. Fix: {fix}"
    )


async def test_with_the_instruct_prompt_the_strict_template_serves(
    autojump_clock: trio.testing.MockClock,
) -> None:
    statuses: list[int] = []
    fleet = fleet_of(strict_template_server(statuses), settings(judge={"prompt": "instruct"}))
    await watched(fleet)
    assert statuses == [200]
    [stats] = fleet.replica_stats()
    assert (stats.roles_refused, stats.answers_unread) == (None, None)


# --- the workload's replies -----------------------------------------------------------------------


def scripted_server(status: int, body: bytes) -> Any:
    async def app(scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        await request_json(receive)
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(b"content-type", b"application/json")],
            }
        )
        await send({"type": "http.response.body", "body": body})

    return app


CALL = JudgeCall([{"role": "user", "content": "2+2?"}], "4", "5", None)


async def test_a_refusal_naming_a_role_is_found_once(caplog: pytest.LogCaptureFixture) -> None:
    body = (
        b'{"error": {"message": "Invalid value: \'response_1\'. Supported values are: '
        b"'system', 'assistant', 'user'.\", \"param\": \"messages[1].role\"}}"
    )
    fleet = fleet_of(scripted_server(400, body), settings(judge={"probe": False}))
    with caplog.at_level(logging.ERROR, "genrm_trio.judge"):
        for _ in range(2):
            with pytest.raises(JudgeHTTPError) as info:
                await fleet.attempt(CALL)
    await fleet.aclose()
    assert info.value.hint is not None and "set judge.prompt: instruct" in info.value.hint
    [stats] = fleet.replica_stats()
    assert stats.roles_refused is not None
    assert stats.roles_refused.startswith("it refused the GenRM roles: HTTP 400: ")
    assert len(caplog.records) == 1


async def test_prose_without_a_verdict_is_found(caplog: pytest.LogCaptureFixture) -> None:
    prose = (
        b'{"choices": [{"message": {"content": "Both answers are fine."}, "finish_reason": '
        b'"stop"}], "usage": {"prompt_tokens": 9, "completion_tokens": 5}}'
    )
    fleet = fleet_of(scripted_server(200, prose), settings(judge={"probe": False}))
    with caplog.at_level(logging.ERROR, "genrm_trio.judge"):
        for n in range(NO_VERDICT_REPLIES):
            assert fleet.replica_stats()[0].roles_refused is None, n
            await fleet.attempt(CALL)
    await fleet.aclose()
    assert fleet.replica_stats()[0].roles_refused == (
        f"its first {NO_VERDICT_REPLIES} completed replies held no verdict: it answers in prose"
    )
    assert len(caplog.records) == 1


async def test_budget_escalation_is_capped_by_the_window(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Each escalated budget is fitted too: the third attempt asks for what fits (1606), not
    2048, which the judge would refuse."""
    app = sim_asgi_app(SimConfig(context_tokens=3000))
    config = settings(
        genrm_responses_create_params={"input": [], "max_output_tokens": 512},
        genrm_parse_retries=3,
        genrm_parse_retry_sleep_s=0.0,
        judge={
            "probe": False,
            "context_tokens": 3000,
            "budget_escalation": {"factor": 2.0, "max_output_tokens": 8192},
        },
    )
    # a verdict needs 1500 output tokens; the same 4132 characters (1033 prompt tokens)
    call = JudgeCall(
        WINDOW_CALL.history,
        "[need=1500][quality=5] " + "a" * 477,
        "[quality=1] " + "b" * 488,
        None,
    )
    fleet = fleet_of(app, config)
    with trio.fail_after(5):
        result = await Comparator(fleet, config, Metrics()).compare(call, pair=(0, 1), judge_pass=0)
    await fleet.aclose()
    assert [c.max_output_tokens for c in app.sim.calls] == [512, 1024, 3000 - 1378 - 16]
    assert (result.attempts, result.escalations) == (3, 2)
    assert app.sim.statistics().overflows == 0
