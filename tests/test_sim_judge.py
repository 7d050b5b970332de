"""The simulated judge (docs/embedding.md, "A judge"): verdicts, faults, counters, both HTTP APIs,
a real socket."""

from __future__ import annotations

import json
import logging
import math
import re
from functools import partial
from typing import Any

import httpx
import pytest
import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st
from sim_bodies import chat_body, client, responses_body, responses_text

from genrm_trio.judge.base import (
    JudgeAttemptError,
    JudgeBadJSON,
    JudgeCall,
    JudgeHTTPError,
    JudgeTransportError,
    ReplyStatus,
)
from genrm_trio.testing import FaultRule, SimConfig, SimJudge, serve_sim_judge, sim_asgi_app
from genrm_trio.testing.faults import FAULT_KINDS
from genrm_trio.testing.flags import parse_fault_rule, sim_config_from_args
from genrm_trio.testing.verdicts import answer_quality, sim_verdict, sim_verdict_text

HISTORY = [{"role": "system", "content": "Be fair."}, {"role": "user", "content": "What is 2+2?"}]


def call(r1: str = "four", r2: str = "4", principle: str | None = None) -> JudgeCall:
    return JudgeCall(HISTORY, r1, r2, principle)


_FENCE = re.compile(r"```\s*json\s*(.*?)```", re.IGNORECASE | re.DOTALL)


def fenced_verdict(text: str) -> dict[str, Any]:
    """The first fenced json block, decoded with Python json semantics (docs/scoring.md,
    "Overall verdict")."""
    blocks = _FENCE.findall(text)
    assert blocks, f"no fenced json block in {text[-200:]!r}"
    verdict = json.loads(blocks[0])
    assert isinstance(verdict, dict)
    return verdict


def assert_valid_verdict(text: str, r1: str, r2: str) -> None:
    verdict = fenced_verdict(text)
    assert set(verdict) == {"score_1", "score_2", "ranking"}
    assert verdict["score_1"] in range(1, 6)
    assert verdict["score_2"] in range(1, 6)
    assert 1 <= verdict["ranking"] <= 6
    assert (verdict["score_1"], verdict["score_2"], verdict["ranking"]) == sim_verdict(r1, r2)


# --- deterministic verdicts -------------------------------------------------------------------


def test_verdict_is_deterministic_and_parseable() -> None:
    answers = ["four", "4", "The answer is 4.", "", "None", "ünïcödé ✓", "x" * 5000]
    for r1 in answers:
        for r2 in answers:
            text = sim_verdict_text(r1, r2)
            assert text == sim_verdict_text(r1, r2)
            assert text.index("```json") > 0  # reasoning prose comes first
            assert_valid_verdict(text, r1, r2)


@given(st.text(), st.text())
def test_both_orientations_agree(a: str, b: str) -> None:
    s1, s2, r = sim_verdict(a, b)
    assert sim_verdict(b, a) == (s2, s1, 7 - r)
    assert (r < 3.5) == (s1 > s2 or (s1 == s2 and r == 3))


def test_quality_marker_forces_quality() -> None:
    assert answer_quality("great [quality=5] answer") == 5
    assert answer_quality("[quality=1] then [quality=4]") == 1  # the first marker wins
    assert answer_quality("[quality=9]") == answer_quality("[quality=9]")  # not a marker: hashed
    assert sim_verdict("a [quality=5]", "b [quality=1]") == (5, 1, 1)
    assert sim_verdict("a [quality=4]", "b [quality=3]") == (4, 3, 2)
    assert sim_verdict("a [quality=3]", "b [quality=4]") == (3, 4, 5)
    assert sim_verdict("a [quality=1]", "b [quality=5]") == (1, 5, 6)
    tie = sim_verdict("a [quality=3]", "b [quality=3]")
    assert tie[:2] == (3, 3) and tie[2] in (3, 4)
    assert sim_verdict("same", "same")[2] == 3.5
    assert fenced_verdict(sim_verdict_text("same", "same"))["ranking"] == 3.5


def test_hashed_qualities_cover_the_scale() -> None:
    assert {answer_quality(f"answer {i}") for i in range(100)} == {1, 2, 3, 4, 5}


# --- in-process judge -------------------------------------------------------------------------


async def test_normal_reply_latency_usage_and_recording(
    autojump_clock: trio.testing.MockClock,
) -> None:
    judge = SimJudge(SimConfig(latency_s=2.5))
    assert (judge.endpoint, judge.path) == ("sim:0", "/v1/responses")
    with trio.fail_after(10):
        start = trio.current_time()
        reply = await judge.attempt(call(principle="Prefer correct answers."))
        assert trio.current_time() - start == 2.5
    assert reply.status is ReplyStatus.COMPLETED
    assert reply.text == sim_verdict_text("four", "4")
    prompt = "Be fair." + "What is 2+2?" + "Prefer correct answers." + "four" + "4"
    assert reply.input_tokens == len(prompt) // 4
    assert reply.output_tokens == len(reply.text) // 4
    [seen] = judge.calls
    assert (seen.response_1, seen.response_2, seen.principle) == (
        "four",
        "4",
        "Prefer correct answers.",
    )
    assert list(seen.history) == HISTORY
    assert (seen.api, seen.fault, seen.started_at) == ("in_process", None, start)
    stats = judge.statistics()
    assert (stats.calls, stats.faults, stats.in_flight, stats.max_in_flight) == (1, 0, 0, 1)
    await judge.aclose()


def _rule(kind: str, **kw: Any) -> FaultRule:
    return FaultRule(fault=kind, match="BAD", **kw)  # type: ignore[arg-type]


async def _attempt(rule: FaultRule, latency: float = 1.0) -> tuple[Any, float, SimJudge]:
    judge = SimJudge(SimConfig(latency_s=latency, rules=[rule]))
    with trio.fail_after(10_000):
        start = trio.current_time()
        try:
            result: Any = await judge.attempt(call("BAD answer", "fine answer"))
        except JudgeAttemptError as error:
            result = error
        return result, trio.current_time() - start, judge


@pytest.mark.parametrize(
    ("kind", "status", "body", "retryable", "retry_after"),
    [
        ("http_500", 500, b"judge unavailable", True, None),
        ("http_429", 429, b'{"error": "rate limited"}', True, 1.0),
        ("http_401", 401, b'{"error": "unauthorized"}', False, None),
        ("http_error", 503, b"judge offline", True, None),
    ],
)
async def test_http_faults_in_process(
    autojump_clock: trio.testing.MockClock,
    kind: str,
    status: int,
    body: bytes,
    retryable: bool,
    retry_after: float | None,
) -> None:
    error, elapsed, judge = await _attempt(_rule(kind))
    assert isinstance(error, JudgeHTTPError)
    assert (error.status, error.body, error.retryable, error.retry_after) == (
        status,
        body,
        retryable,
        retry_after,
    )
    assert error.describe().startswith(f"JudgeHTTPError: HTTP {status}; response=")
    assert elapsed == 1.0
    stats = judge.statistics()
    assert (stats.faults, dict(stats.faults_by_kind), stats.in_flight) == (1, {kind: 1}, 0)
    assert judge.calls[0].fault == kind


async def test_http_fault_options(autojump_clock: trio.testing.MockClock) -> None:
    error, _, _ = await _attempt(_rule("http_429", retry_after_s=7))
    assert isinstance(error, JudgeHTTPError) and error.retry_after == 7.0
    error, _, _ = await _attempt(_rule("http_error", status=408, body="busy"))
    assert isinstance(error, JudgeHTTPError)
    assert (error.status, error.body, error.retryable, error.retry_after) == (
        408,
        b"busy",
        True,
        None,
    )
    error, _, _ = await _attempt(_rule("http_error", status=404))
    assert isinstance(error, JudgeHTTPError) and not error.retryable


async def test_drop_and_not_json_in_process(autojump_clock: trio.testing.MockClock) -> None:
    error, elapsed, _ = await _attempt(_rule("drop"))
    assert isinstance(error, JudgeTransportError)
    assert error.retryable and error.type_name == "RemoteProtocolError"
    assert error.describe().startswith("RemoteProtocolError: peer closed connection")
    assert elapsed == 1.0
    error, _, _ = await _attempt(_rule("not_json"))
    assert isinstance(error, JudgeBadJSON) and not error.retryable
    assert error.describe().startswith("JSONDecodeError: Expecting value")


async def test_reply_faults_in_process(autojump_clock: trio.testing.MockClock) -> None:
    r1, r2 = "BAD answer", "fine answer"
    reply, elapsed, _ = await _attempt(_rule("budget_exhausted"))
    assert reply.status is ReplyStatus.BUDGET_EXHAUSTED and reply.text == ""
    assert reply.output_tokens == 16384 and elapsed == 1.0

    reply, _, _ = await _attempt(_rule("empty"))
    assert (reply.status, reply.text, reply.output_tokens) == (ReplyStatus.UNUSABLE, "", 0)

    reply, _, _ = await _attempt(_rule("garbage"))
    assert reply.status is ReplyStatus.COMPLETED and reply.text.strip()
    assert "{" not in reply.text

    reply, _, _ = await _attempt(_rule("nan"))
    assert reply.status is ReplyStatus.COMPLETED
    assert math.isnan(fenced_verdict(reply.text)["score_1"])

    reply, _, _ = await _attempt(_rule("out_of_range"))
    verdict = fenced_verdict(reply.text)
    assert verdict["score_1"] == 9
    assert verdict["score_2"] == sim_verdict(r1, r2)[1]

    reply, _, _ = await _attempt(_rule("huge", huge_chars=100_000))
    assert reply.status is ReplyStatus.COMPLETED
    assert len(reply.text) > 100_000
    assert reply.text.endswith(sim_verdict_text(r1, r2))
    assert reply.output_tokens == len(reply.text) // 4
    assert_valid_verdict(reply.text, r1, r2)


async def test_slow_fault_adds_delay_and_can_exceed_a_deadline(
    autojump_clock: trio.testing.MockClock,
) -> None:
    reply, elapsed, _ = await _attempt(_rule("slow", delay_s=30))
    assert elapsed == 31.0
    assert reply.text == sim_verdict_text("BAD answer", "fine answer")

    judge = SimJudge(SimConfig(latency_s=1, rules=[_rule("slow")]))  # default delay 3600 s
    start = trio.current_time()
    with pytest.raises(trio.TooSlowError), trio.fail_after(1800):
        await judge.attempt(call("BAD", "ok"))
    assert trio.current_time() - start == 1800
    assert judge.statistics().in_flight == 0
    assert judge.statistics().faults_by_kind == {"slow": 1}


@pytest.mark.parametrize(
    ("position", "first", "second", "both"),
    [
        ("first", True, False, True),
        ("second", False, True, True),
        ("either", True, True, True),
        ("both", False, False, True),
    ],
)
async def test_position_selection(
    autojump_clock: trio.testing.MockClock, position: str, first: bool, second: bool, both: bool
) -> None:
    judge = SimJudge(
        SimConfig(rules=[FaultRule("http_500", match="[fail]", position=position)])  # type: ignore[arg-type]
    )

    async def faulted(r1: str, r2: str) -> bool:
        try:
            await judge.attempt(call(r1, r2))
        except JudgeHTTPError:
            return True
        return False

    with trio.fail_after(10):
        assert await faulted("x [fail]", "y") is first
        assert await faulted("x", "y [fail]") is second
        assert await faulted("x [fail]", "y [fail]") is both
        assert await faulted("x", "y") is False
    assert judge.statistics().calls == 4


async def test_times_limit_then_recovery_and_rule_order(
    autojump_clock: trio.testing.MockClock,
) -> None:
    judge = SimJudge(
        SimConfig(
            rules=[
                FaultRule("http_500", match="flaky", times=1),
                FaultRule("empty", match="flaky", times=2),
                FaultRule("drop", match="never-sent"),
            ]
        )
    )
    outcomes: list[str] = []
    with trio.fail_after(10):
        for _ in range(5):
            try:
                reply = await judge.attempt(call("flaky one", "other"))
            except JudgeHTTPError:
                outcomes.append("500")
            else:
                outcomes.append(reply.status.value)
    assert outcomes == ["500", "unusable", "unusable", "completed", "completed"]
    assert [c.fault for c in judge.calls] == ["http_500", "empty", "empty", None, None]
    assert judge.statistics().faults_by_kind == {"http_500": 1, "empty": 2}


async def test_times_zero_never_fires(autojump_clock: trio.testing.MockClock) -> None:
    judge = SimJudge(SimConfig(rules=[FaultRule("drop", times=0)]))
    with trio.fail_after(10):
        reply = await judge.attempt(call())
    assert reply.status is ReplyStatus.COMPLETED


async def _faulted_pairs(config: SimConfig, pairs: list[tuple[str, str]]) -> set[tuple[str, str]]:
    judge = SimJudge(config)
    faulted: set[tuple[str, str]] = set()
    with trio.fail_after(10):
        for r1, r2 in pairs:
            try:
                await judge.attempt(call(r1, r2))
            except JudgeTransportError:
                faulted.add((r1, r2))
    assert judge.statistics().faults == len(faulted)
    return faulted


async def test_rate_faults_are_seeded_and_order_independent(
    autojump_clock: trio.testing.MockClock,
) -> None:
    pairs = [(f"answer {i}", f"answer {i + 1}") for i in range(400)]
    config = SimConfig(fault_rate=0.25, fault_kind="drop", seed=7)
    first = await _faulted_pairs(config, pairs)
    assert 60 <= len(first) <= 140
    assert await _faulted_pairs(config, pairs) == first
    assert await _faulted_pairs(config, pairs[::-1]) == first  # scheduling order does not matter
    other_seed = await _faulted_pairs(SimConfig(fault_rate=0.25, fault_kind="drop", seed=8), pairs)
    assert other_seed != first
    assert await _faulted_pairs(SimConfig(fault_rate=1.0, fault_kind="drop"), pairs[:5]) == set(
        pairs[:5]
    )


async def test_rate_faults_redraw_on_repeats_and_rules_win(
    autojump_clock: trio.testing.MockClock,
) -> None:
    judge = SimJudge(SimConfig(fault_rate=0.5, fault_kind="empty", seed=3))
    with trio.fail_after(10):
        statuses = [(await judge.attempt(call())).status for _ in range(64)]
    assert set(statuses) == {ReplyStatus.COMPLETED, ReplyStatus.UNUSABLE}  # retries can recover

    judge = SimJudge(
        SimConfig(fault_rate=1.0, fault_kind="empty", rules=[FaultRule("garbage", match="four")])
    )
    with trio.fail_after(10):
        garbage = await judge.attempt(call())
        empty = await judge.attempt(call("five", "six"))
    assert "{" not in garbage.text and garbage.status is ReplyStatus.COMPLETED
    assert empty.status is ReplyStatus.UNUSABLE


async def test_jitter_is_seeded_and_bounded(autojump_clock: trio.testing.MockClock) -> None:
    async def latencies(seed: int) -> list[float]:
        judge = SimJudge(SimConfig(latency_s=1.0, jitter_s=0.5, seed=seed))
        out = []
        with trio.fail_after(100):
            for i in range(20):
                start = trio.current_time()
                await judge.attempt(call(f"a{i}", "b"))
                out.append(round(trio.current_time() - start, 9))
        return out

    first = await latencies(1)
    assert all(1.0 <= t <= 1.5 for t in first)
    assert len(set(first)) > 10
    assert await latencies(1) == first
    assert await latencies(2) != first


async def test_concurrency_statistics(autojump_clock: trio.testing.MockClock) -> None:
    judge = SimJudge(SimConfig(latency_s=1.0))
    with trio.fail_after(10):
        start = trio.current_time()
        async with trio.open_nursery() as nursery:
            for i in range(10):
                nursery.start_soon(judge.attempt, call(f"a{i}", "b"))
            await trio.sleep(0.5)
            assert judge.statistics().in_flight == 10
        assert trio.current_time() - start == 1.0
    stats = judge.statistics()
    assert (stats.calls, stats.in_flight, stats.max_in_flight) == (10, 0, 10)
    with trio.fail_after(10):
        await judge.attempt(call())
    assert judge.statistics().max_in_flight == 10  # a high-water mark
    assert len(judge.calls) == 11


async def test_record_calls_off_still_counts(autojump_clock: trio.testing.MockClock) -> None:
    judge = SimJudge(SimConfig(record_calls=False))
    with trio.fail_after(10):
        await judge.attempt(call())
    assert judge.calls == []
    assert judge.statistics().calls == 1


# --- configuration ----------------------------------------------------------------------------


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="unknown fault"):
        FaultRule("explode")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown position"):
        FaultRule("drop", position="middle")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="times"):
        FaultRule("drop", times=-1)
    with pytest.raises(ValueError, match="fault_rate"):
        SimConfig(fault_rate=1.5)
    with pytest.raises(ValueError, match="latency_s"):
        SimConfig(latency_s=-1)
    with pytest.raises(ValueError, match="unknown fault"):
        SimConfig(fault_kind="explode")  # type: ignore[arg-type]
    config = SimConfig(rules=[FaultRule("drop")])
    assert config.rules == (FaultRule("drop"),)  # stored as a tuple: the config stays immutable


def test_cli_mapping() -> None:
    rule = parse_fault_rule("http_429,match=[fail],position=first,times=2,retry_after=3")
    assert rule == FaultRule(
        "http_429", match="[fail]", position="first", times=2, retry_after_s=3.0
    )
    assert parse_fault_rule("slow,delay=2.5") == FaultRule("slow", delay_s=2.5)
    assert parse_fault_rule("huge,chars=10") == FaultRule("huge", huge_chars=10)
    assert parse_fault_rule("http_error,status=502,body=down") == FaultRule(
        "http_error", status=502, body="down"
    )
    with pytest.raises(ValueError, match="unknown fault"):
        parse_fault_rule("boom")
    with pytest.raises(ValueError, match="bad fault option"):
        parse_fault_rule("drop,colour=red")
    with pytest.raises(ValueError, match="bad value for times"):
        parse_fault_rule("drop,times=many")
    config = sim_config_from_args(
        latency_ms=250,
        jitter_ms=50,
        seed=4,
        fault_rate=0.1,
        fault_kind="drop",
        faults=["empty,match=x"],
    )
    assert config == SimConfig(
        latency_s=0.25,
        jitter_s=0.05,
        seed=4,
        fault_rate=0.1,
        fault_kind="drop",
        rules=(FaultRule("empty", match="x"),),
        record_calls=False,
    )
    with pytest.raises(ValueError, match="unknown fault kind"):
        sim_config_from_args(fault_kind="boom")
    assert set(FAULT_KINDS) >= {"budget_exhausted", "drop", "not_json", "huge", "slow"}


# --- over HTTP (ASGI, virtual time) -----------------------------------------------------------


async def test_responses_api_over_asgi(autojump_clock: trio.testing.MockClock) -> None:
    app = sim_asgi_app(SimConfig(latency_s=0.75))
    async with client(app) as http:
        with trio.fail_after(10):
            start = trio.current_time()
            response = await http.post("/responses", json=responses_body("four", "4", "Be right."))
            assert trio.current_time() - start == 0.75
    assert response.status_code == 200
    body = response.json()
    assert (body["status"], body["model"], body["incomplete_details"]) == (
        "completed",
        "judge-x",
        None,
    )
    assert responses_text(body) == sim_verdict_text("four", "4")
    prompt_chars = len("Be fair." + "What is 2+2?" + "Be right." + "four" + "4")
    assert body["usage"]["input_tokens"] == prompt_chars // 4
    assert body["usage"]["output_tokens"] == len(sim_verdict_text("four", "4")) // 4
    [seen] = app.sim.calls
    assert (seen.api, seen.response_1, seen.response_2, seen.principle) == (
        "genrm_model",
        "four",
        "4",
        "Be right.",
    )
    assert list(seen.history) == HISTORY
    assert app.sim.statistics().in_flight == 0


async def test_responses_body_has_every_field_openai_response_requires() -> None:
    # NeMo Gym's openai_model validates the upstream reply as openai's `Response` (the Gym
    # trial's `genrm_model` is an openai_model in front of this judge): a missing required field
    # there is an HTTP 500 for every comparison.
    app = sim_asgi_app(SimConfig())
    async with client(app) as http:
        with trio.fail_after(10):
            response = await http.post("/responses", json=responses_body("four", "4"))
    body = response.json()
    required = {"id", "created_at", "model", "object", "output"}
    required |= {"parallel_tool_calls", "tool_choice", "tools"}
    assert required <= body.keys()
    assert (body["parallel_tool_calls"], body["tool_choice"], body["tools"]) == (False, "auto", [])
    usage = body["usage"]
    assert usage["input_tokens_details"] == {"cached_tokens": 0}
    assert usage["output_tokens_details"] == {"reasoning_tokens": 0}


async def test_chat_completions_over_asgi(autojump_clock: trio.testing.MockClock) -> None:
    app = sim_asgi_app(SimConfig(latency_s=0.25))
    async with client(app) as http:
        with trio.fail_after(10):
            start = trio.current_time()
            response = await http.post(
                "/chat/completions", json=chat_body("four", "4", "Be right.")
            )
            assert trio.current_time() - start == 0.25
            no_principle = await http.post("/chat/completions", json=chat_body("a", "b"))
    assert response.status_code == 200
    body = response.json()
    [choice] = body["choices"]
    assert choice["finish_reason"] == "stop"
    assert choice["message"]["content"] == sim_verdict_text("four", "4")
    assert body["usage"]["completion_tokens"] == len(choice["message"]["content"]) // 4
    assert body["usage"]["prompt_tokens"] > 0
    first, second = app.sim.calls
    assert (first.api, first.principle, list(first.history)) == (
        "chat_completions",
        "Be right.",
        HISTORY,
    )
    assert (second.response_1, second.response_2, second.principle) == ("a", "b", None)
    assert no_principle.json()["choices"][0]["message"]["content"] == sim_verdict_text("a", "b")


async def test_malformed_requests_are_refused(autojump_clock: trio.testing.MockClock) -> None:
    app = sim_asgi_app()
    async with client(app) as http:
        with trio.fail_after(10):
            wrong_order = chat_body("a", "b")
            wrong_order["messages"].reverse()
            assert (await http.post("/chat/completions", json=wrong_order)).status_code == 400
            no_metadata = responses_body("a", "b")
            del no_metadata["metadata"]
            assert (await http.post("/responses", json=no_metadata)).status_code == 400
            assert (await http.post("/responses", content=b"{nope")).status_code == 400
            assert (await http.get("/responses")).status_code == 405
            assert (await http.post("/nowhere", json={})).status_code == 404
    stats = app.sim.statistics()
    assert (stats.calls, stats.bad_requests) == (0, 3)


async def test_models_health_and_api_key(autojump_clock: trio.testing.MockClock) -> None:
    app = sim_asgi_app(SimConfig(api_key="s3cret"))
    async with client(app) as http:
        with trio.fail_after(10):
            health = await http.get("http://sim.test/health")
            assert health.status_code == 200 and health.json() == {"status": "ok"}
            assert (await http.get("/models")).status_code == 401
            assert (await http.post("/responses", json=responses_body("a", "b"))).status_code == 401
            auth = {"Authorization": "Bearer s3cret"}
            models = await http.get("/models", headers=auth)
            assert models.status_code == 200
            assert models.json()["data"][0]["id"] == "genrm-sim"
            ok = await http.post("/responses", json=responses_body("a", "b"), headers=auth)
            assert ok.status_code == 200
    assert app.sim.statistics().calls == 1


API_CASES = [
    ("/responses", responses_body),
    ("/chat/completions", chat_body),
]


@pytest.mark.parametrize(("path", "make"), API_CASES)
@pytest.mark.parametrize(
    ("kind", "status", "body", "content_type", "retry_after"),
    [
        ("http_500", 500, b"judge unavailable", "text/plain", None),
        ("http_429", 429, b'{"error": "rate limited"}', "application/json", "1"),
        ("http_401", 401, b'{"error": "unauthorized"}', "application/json", None),
        ("http_error", 503, b"judge offline", "text/plain", None),
    ],
)
async def test_http_status_faults(
    autojump_clock: trio.testing.MockClock,
    path: str,
    make: Any,
    kind: str,
    status: int,
    body: bytes,
    content_type: str,
    retry_after: str | None,
) -> None:
    app = sim_asgi_app(SimConfig(latency_s=0.5, rules=[_rule(kind, times=1)]))
    async with client(app) as http:
        with trio.fail_after(10):
            start = trio.current_time()
            response = await http.post(path, json=make("BAD", "ok"))
            assert trio.current_time() - start == 0.5
            recovered = await http.post(path, json=make("BAD", "ok"))
    assert response.status_code == status
    assert response.content == body
    assert response.headers["content-type"] == content_type
    assert response.headers.get("retry-after") == retry_after
    assert recovered.status_code == 200
    assert app.sim.statistics().faults_by_kind == {kind: 1}


async def test_retry_after_is_configurable_over_http(
    autojump_clock: trio.testing.MockClock,
) -> None:
    app = sim_asgi_app(SimConfig(rules=[_rule("http_429", retry_after_s=7)]))
    async with client(app) as http:
        with trio.fail_after(10):
            response = await http.post("/responses", json=responses_body("BAD", "ok"))
    assert (response.status_code, response.headers["retry-after"]) == (429, "7")


async def test_budget_exhausted_over_http(autojump_clock: trio.testing.MockClock) -> None:
    app = sim_asgi_app(SimConfig(rules=[_rule("budget_exhausted")]))
    async with client(app) as http:
        with trio.fail_after(10):
            responses = (await http.post("/responses", json=responses_body("BAD", "ok"))).json()
            chat = (await http.post("/chat/completions", json=chat_body("BAD", "ok"))).json()
    assert responses["status"] == "incomplete"
    assert responses["incomplete_details"] == {"reason": "max_output_tokens"}
    assert responses_text(responses) == ""  # no message item: reasoning only
    assert responses["usage"]["output_tokens"] == 512  # the request's max_output_tokens
    assert chat["choices"][0]["finish_reason"] == "length"
    assert "{" not in chat["choices"][0]["message"]["content"]
    assert chat["usage"]["completion_tokens"] == 512


@pytest.mark.parametrize(("path", "make"), API_CASES)
async def test_text_faults_over_http(
    autojump_clock: trio.testing.MockClock, path: str, make: Any
) -> None:
    rules = [
        FaultRule("empty", match="E"),
        FaultRule("garbage", match="G"),
        FaultRule("nan", match="N"),
        FaultRule("out_of_range", match="O"),
        FaultRule("huge", match="H", huge_chars=50_000),
    ]
    app = sim_asgi_app(SimConfig(rules=rules))

    def text_of(body: dict[str, Any]) -> str:
        if path == "/responses":
            assert body["status"] == "completed"
            return responses_text(body)
        assert body["choices"][0]["finish_reason"] == "stop"
        content = body["choices"][0]["message"]["content"]
        assert isinstance(content, str)
        return content

    async with client(app) as http:
        with trio.fail_after(10):
            texts = {}
            for marker in "EGNOH":
                response = await http.post(path, json=make(marker, "ok"))
                assert response.status_code == 200
                texts[marker] = text_of(response.json())
    assert texts["E"] == ""
    assert texts["G"].strip() and "{" not in texts["G"]
    assert math.isnan(fenced_verdict(texts["N"])["score_1"])
    assert fenced_verdict(texts["O"])["score_1"] == 9
    assert len(texts["H"]) > 50_000
    assert_valid_verdict(texts["H"], "H", "ok")


@pytest.mark.parametrize(("path", "make"), API_CASES)
async def test_not_json_and_drop_over_asgi(
    autojump_clock: trio.testing.MockClock, path: str, make: Any
) -> None:
    app = sim_asgi_app(
        SimConfig(rules=[FaultRule("not_json", match="J"), FaultRule("drop", match="D")])
    )
    async with client(app) as http:
        with trio.fail_after(10):
            response = await http.post(path, json=make("J", "ok"))
            assert response.status_code == 200
            assert response.headers["content-type"] == "text/plain"
            with pytest.raises(json.JSONDecodeError):
                json.loads(response.content)
            with pytest.raises(httpx.RemoteProtocolError, match="peer closed connection"):
                await http.post(path, json=make("D", "ok"))
    assert app.sim.statistics().in_flight == 0


async def test_slow_over_http_is_cancellable(autojump_clock: trio.testing.MockClock) -> None:
    app = sim_asgi_app(SimConfig(latency_s=1, rules=[FaultRule("slow", match="S", delay_s=60)]))
    async with client(app) as http:
        start = trio.current_time()
        with trio.move_on_after(5) as scope:
            await http.post("/responses", json=responses_body("S", "ok"))
        assert scope.cancelled_caught and trio.current_time() - start == 5
        with trio.fail_after(100):
            response = await http.post("/responses", json=responses_body("S", "ok"))
        assert trio.current_time() - start == 5 + 61
    assert response.status_code == 200
    assert app.sim.statistics().in_flight == 0


# --- a real socket (real clock) ---------------------------------------------------------------


@pytest.mark.slow
async def test_serve_sim_judge_on_a_real_socket(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="genrm_trio.sim_judge.h1")
    app = sim_asgi_app(SimConfig(latency_s=0.01, rules=[FaultRule("drop", match="DROP")]))
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            port = await nursery.start(serve_sim_judge, app)
            assert isinstance(port, int) and port > 0
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}/v1") as http:
                assert (await http.get("/models")).status_code == 200
                responses = await http.post("/responses", json=responses_body("four", "4"))
                chat = await http.post("/chat/completions", json=chat_body("four", "4"))
                with pytest.raises(httpx.RemoteProtocolError):
                    await http.post("/responses", json=responses_body("DROP", "4"))
            nursery.cancel_scope.cancel()
    assert responses.status_code == 200
    assert responses_text(responses.json()) == sim_verdict_text("four", "4")
    assert chat.status_code == 200
    assert chat.json()["choices"][0]["message"]["content"] == sim_verdict_text("four", "4")
    assert [c.api for c in app.sim.calls] == ["genrm_model", "chat_completions", "genrm_model"]
    # the drop is intended: nothing is logged as an error
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


@pytest.mark.slow
async def test_serve_sim_judge_from_a_config() -> None:
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            port = await nursery.start(
                partial(serve_sim_judge, SimConfig(), host="127.0.0.1", port=0)
            )
            async with httpx.AsyncClient() as http:
                health = await http.get(f"http://127.0.0.1:{port}/health")
            nursery.cancel_scope.cancel()
    assert health.status_code == 200


# --- sticky faults and the /stats route (for benchmarks) -------------------------------------


async def test_sticky_faults_fail_every_retry_of_a_drawn_pair(
    autojump_clock: trio.testing.MockClock,
) -> None:
    judge = SimJudge(SimConfig(fault_rate=0.3, fault_kind="http_500", seed=5, sticky_faults=True))
    pairs = [(f"answer {i}", f"answer {i + 1}") for i in range(100)]
    fates: dict[tuple[str, str], list[bool]] = {}
    with trio.fail_after(10):
        for r1, r2 in pairs:
            for _ in range(4):
                try:
                    await judge.attempt(call(r1, r2))
                    fates.setdefault((r1, r2), []).append(False)
                except JudgeHTTPError:
                    fates.setdefault((r1, r2), []).append(True)
    assert all(len(set(results)) == 1 for results in fates.values())  # same fate every attempt
    failing = sum(results[0] for results in fates.values())
    assert 10 <= failing <= 50


async def test_stats_route_reports_counters(autojump_clock: trio.testing.MockClock) -> None:
    app = sim_asgi_app(SimConfig())
    async with client(app) as http:
        with trio.fail_after(10):
            reply = await http.post("/responses", json=responses_body("a", "b"))
            assert reply.status_code == 200
            stats = await http.get("http://sim.test/stats")
    assert stats.status_code == 200
    assert stats.json()["calls"] == 1
    assert stats.json()["in_flight"] == 0
