"""Output-budget escalation (`judge.budget_escalation`, docs/scoring.md "Output-budget
escalation"): the comparator's budgets per attempt through a real HttpJudge over scripted
bytes (tests/scripted.py), for both judge APIs, in virtual time — exact attempt counts, the exact
budget every request carried, log lines, counters; and "off" is today's request, byte for byte."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio
import trio.testing
from comparator_rig import (
    CALL,
    EMPTY,
    MALFORMED,
    PAIR,
    RUBRIC,
    Rig,
    http,
    raw,
    reply,
    valid,
)
from judges import compare, compare_input, gather, member
from loading import load_script
from scripted import Reply, Script

from genrm_trio.config import Settings
from genrm_trio.domain.model import CompareFailed, Scored
from genrm_trio.domain.scoring import ESCALATION_RATE, ComparisonStats, group_metrics
from genrm_trio.domain.verdict import Verdict
from genrm_trio.engine.engine import open_engine
from genrm_trio.judge.apis import chat_body, chat_params, responses_body
from genrm_trio.judge.base import JudgeCall, Usage
from genrm_trio.judge.client import make_http_judge
from genrm_trio.testing import SimConfig, SimJudge, sim_asgi_app
from genrm_trio.testing.asgi import SimJudgeApp
from genrm_trio.testing.network import MemoryNetwork, serve_asgi
from genrm_trio.testing.verdicts import sim_verdict_text

BOUND = 1000
APIS = ["responses", "chat_completions"]
BUDGET_KEY = {"responses": "max_output_tokens", "chat_completions": "max_tokens"}


# how each API's cut reply is named in the exhaustion WARNING
CUT_WORDS = {
    "responses": "response is incomplete (reason=max_output_tokens)",
    "chat_completions": "finish_reason=length (the reply reached max_tokens)",
}


def exhausted(api: str, tokens: int | None = None) -> Reply:
    """A reply cut off by the output budget, as each API says it (usage = `tokens`)."""
    if api == "responses":
        body: dict[str, Any] = {
            "status": "incomplete",
            "incomplete_details": {"reason": "max_output_tokens"},
            "output": [{"type": "reasoning", "summary": []}],
        }
        if tokens is not None:
            body["usage"] = {"input_tokens": 100, "output_tokens": tokens}
    else:
        body = {"choices": [{"message": {"content": "Let me think..."}, "finish_reason": "length"}]}
        if tokens is not None:
            body["usage"] = {"prompt_tokens": 100, "completion_tokens": tokens}
    return raw(body)


def answered(api: str, tokens: int | None = None) -> Reply:
    text = json.dumps({"score_1": 4, "score_2": 2, "ranking": 1})
    if api == "responses":
        if tokens is None:
            return valid()
        body: dict[str, Any] = {
            "status": "completed",
            "output": [{"type": "message", "content": [{"type": "output_text", "text": text}]}],
            "usage": {"input_tokens": 100, "output_tokens": tokens},
        }
    else:
        body = {"choices": [{"message": {"content": text}, "finish_reason": "stop"}]}
        if tokens is not None:
            body["usage"] = {"prompt_tokens": 100, "completion_tokens": tokens}
    return raw(body)


def malformed(api: str) -> Reply:
    """A completed reply without a verdict (a parse failure)."""
    if api == "responses":
        return MALFORMED
    return raw({"choices": [{"message": {"content": "Both are fine."}, "finish_reason": "stop"}]})


def rig(
    api: str,
    *answers: Reply,
    retries: int = 1,
    budget: int = 1341,
    escalation: dict[str, Any] | None = None,
) -> Rig:
    judge: dict[str, Any] = {"api": api}
    if escalation is not None:
        judge["budget_escalation"] = escalation
    return Rig(
        Script(*answers),
        judge=judge,
        genrm_parse_retries=retries,
        genrm_responses_create_params={
            "input": [],
            "max_output_tokens": budget,
            "temperature": 0.6,
        },
    )


def budgets(r: Rig, api: str) -> list[int]:
    """The output budget every request the judge received asked for, in order."""
    return [body[BUDGET_KEY[api]] for body in r.script.bodies]


def escalation_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.getMessage().startswith("GenRM output budget escalated")
    ]


# --- off: today's behaviour ---------------------------------------------------------------------


@pytest.mark.parametrize("api", APIS)
async def test_off_every_attempt_asks_for_the_configured_budget(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture, api: str
) -> None:
    r = rig(api, exhausted(api), retries=3)
    with caplog.at_level(logging.INFO, "genrm_trio.judge"), trio.fail_after(BOUND):
        error = await r.fail()
    assert budgets(r, api) == [1341, 1341, 1341, 1341]
    assert error.message == (
        "Judge returned no completed answer after 4 attempts (4 of them exhausted "
        "max_output_tokens=1341 without emitting a verdict; raise the budget or constrain the "
        "judge's reasoning)"
    )
    assert (error.attempts, error.escalations) == (4, 0)
    assert escalation_lines(caplog) == []
    assert r.metric("genrm_trio_judge_budget_escalations_total") == 0
    assert r.comparator.statistics().escalations == 0


@pytest.mark.parametrize("api", APIS)
async def test_off_request_bytes_are_todays(
    autojump_clock: trio.testing.MockClock, api: str
) -> None:
    """The body of every attempt equals the body built from the call without a budget of its
    own, i.e. from the create params alone, as before escalation existed."""
    r = rig(api, exhausted(api), malformed(api), answered(api), retries=2)
    with trio.fail_after(BOUND):
        await r.compare()
    params = r.settings.judge_create_params
    if api == "responses":
        expected = responses_body(params, CALL)
    else:
        chat, instructions, _ = chat_params(params)
        expected = chat_body(chat, instructions, CALL)
    assert r.script.calls == 3
    assert all(json.dumps(body) == json.dumps(expected) for body in r.script.bodies)


# --- on -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("api", APIS)
async def test_escalated_attempt_scores_the_comparison(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture, api: str
) -> None:
    r = rig(api, exhausted(api, 1341), answered(api, 2100), escalation={"factor": 2.0})
    with caplog.at_level(logging.INFO, "genrm_trio.judge"), trio.fail_after(BOUND):
        result = await r.compare((2, 5))
    assert result.selected == Verdict(4, 2, 1)
    assert (result.attempts, result.escalations) == (2, 1)
    assert budgets(r, api) == [1341, 2682]
    # the token metrics see both attempts, the escalated one included
    assert result.usage == Usage(200, 1341 + 2100, budget_hit=True)
    assert escalation_lines(caplog) == [
        "GenRM output budget escalated for pair (2, 5) (judge 0): attempt 2/2 asks for "
        "max_output_tokens 1341 -> 2682"
    ]
    assert r.metric("genrm_trio_judge_budget_escalations_total") == 1
    assert r.metric("genrm_trio_judge_retries_total", cause="budget") == 1
    stats = r.comparator.statistics()
    assert (stats.escalations, stats.calls, stats.retries, stats.failures) == (1, 2, 1, 0)


@pytest.mark.parametrize("api", APIS)
async def test_escalation_stops_at_the_cap_and_keeps_the_attempt_count(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture, api: str
) -> None:
    r = rig(
        api,
        exhausted(api, 7),
        retries=4,
        escalation={"factor": 2.0, "max_output_tokens": 4000},
    )
    with caplog.at_level(logging.INFO, "genrm_trio.judge"), trio.fail_after(BOUND):
        error = await r.fail((3, 7))
    assert budgets(r, api) == [1341, 2682, 4000, 4000, 4000]
    assert (error.attempts, error.escalations) == (5, 2)
    assert error.usage == Usage(500, 35, budget_hit=True)
    assert error.message == (
        "Judge returned no completed answer after 5 attempts (5 of them exhausted "
        "max_output_tokens from 1341 up to 4000 without emitting a verdict; raise the budget or "
        "constrain the judge's reasoning)"
    )
    assert escalation_lines(caplog) == [
        "GenRM output budget escalated for pair (3, 7) (judge 0): attempt 2/5 asks for "
        "max_output_tokens 1341 -> 2682",
        "GenRM output budget escalated for pair (3, 7) (judge 0): attempt 3/5 asks for "
        "max_output_tokens 2682 -> 4000",
    ]
    # each exhaustion WARNING names the budget that attempt actually had
    assert [
        r.getMessage()
        for r in caplog.records
        if r.getMessage().startswith("GenRM output budget ex")
    ] == [
        f"GenRM output budget exhausted for pair (3, 7) (attempt {n}/5, max_output_tokens={b}): "
        f"{CUT_WORDS[api]} and contains no verdict"
        for n, b in zip(range(1, 6), [1341, 2682, 4000, 4000, 4000], strict=True)
    ]
    assert r.metric("genrm_trio_judge_budget_escalations_total") == 2
    assert r.comparator.statistics().escalations == 2


@pytest.mark.parametrize("api", APIS)
async def test_other_failures_neither_escalate_nor_reset_the_budget(
    autojump_clock: trio.testing.MockClock, api: str
) -> None:
    r = rig(
        api,
        http(500),
        EMPTY if api == "responses" else raw({"choices": []}),  # unusable: no escalation
        exhausted(api),
        http(503),
        malformed(api),  # a parse failure: no escalation either
        answered(api),
        retries=5,
        escalation={},
    )
    with trio.fail_after(BOUND):
        result = await r.compare()
    assert budgets(r, api) == [1341, 1341, 1341, 2682, 2682, 2682]
    assert (result.attempts, result.escalations) == (6, 1)


@pytest.mark.parametrize("api", APIS)
async def test_exhausted_final_attempt_does_not_escalate(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture, api: str
) -> None:
    r = rig(api, exhausted(api), retries=1, escalation={})
    with caplog.at_level(logging.INFO, "genrm_trio.judge"), trio.fail_after(BOUND):
        error = await r.fail()
    assert budgets(r, api) == [1341, 2682]
    assert error.escalations == 1
    assert len(escalation_lines(caplog)) == 1
    assert r.metric("genrm_trio_judge_budget_escalations_total") == 1


@pytest.mark.parametrize("api", APIS)
async def test_each_comparison_starts_from_the_configured_budget(
    autojump_clock: trio.testing.MockClock, api: str
) -> None:
    r = rig(api, exhausted(api), answered(api), retries=1, escalation={})
    r.script.answers = [exhausted(api), answered(api), exhausted(api), answered(api)]
    with trio.fail_after(BOUND):
        first = await r.compare((0, 1))
        second = await r.compare((1, 2))
    assert budgets(r, api) == [1341, 2682, 1341, 2682]
    assert (first.escalations, second.escalations) == (1, 1)
    assert r.comparator.statistics().escalations == 2


async def test_escalated_comparison_that_falls_back_keeps_its_escalation(
    autojump_clock: trio.testing.MockClock,
) -> None:
    r = rig("responses", exhausted("responses"), MALFORMED, escalation={})
    with trio.fail_after(BOUND):
        result = await r.compare()
    assert result.selected == Verdict(3.0, 3.0, 3.5)  # the default-score fallback
    assert (result.overall_parse_failed, result.attempts, result.escalations) == (True, 2, 1)
    assert budgets(r, "responses") == [1341, 2682]


async def test_rubric_mode_escalates_too(autojump_clock: trio.testing.MockClock) -> None:
    r = Rig(
        Script(exhausted("responses"), reply(RUBRIC)),
        judge={"budget_escalation": {}},
        genrm_parse_retries=1,
        score_source="rubric_mean",
        genrm_responses_create_params={"input": [], "max_output_tokens": 1341},
    )
    with trio.fail_after(BOUND):
        result = await r.compare(expected_rubric_ids=[1, 2])
    assert result.selected == Verdict(4.0, 2.0, 2.5)
    assert (result.attempts, result.escalations) == (2, 1)
    assert budgets(r, "responses") == [1341, 2682]


async def test_fractional_factor_rounds_up(autojump_clock: trio.testing.MockClock) -> None:
    r = rig("responses", exhausted("responses"), retries=3, escalation={"factor": 1.5})
    with trio.fail_after(BOUND):
        await r.fail()
    assert budgets(r, "responses") == [1341, 2012, 3018, 4527]


async def test_escalation_keeps_the_pacing(autojump_clock: trio.testing.MockClock) -> None:
    """Sleeps are the configured 0.2 s between attempts, with or without escalation."""
    times = []
    for escalation in (None, {}):
        r = rig("responses", exhausted("responses"), retries=2, escalation=escalation)
        with trio.fail_after(BOUND):
            start = trio.current_time()
            await r.fail()
        times.append([round(t - start, 6) for t in r.script.times])
    assert times == [[0.0, 0.2, 0.4], [0.0, 0.2, 0.4]]


async def test_a_call_with_its_own_budget_starts_there(
    autojump_clock: trio.testing.MockClock,
) -> None:
    r = rig("responses", exhausted("responses"), answered("responses"), escalation={})
    call = JudgeCall(CALL.history, CALL.response_1, CALL.response_2, None, max_output_tokens=3000)
    with trio.fail_after(BOUND):
        result = await r.comparator.compare(call, pair=PAIR, judge_pass=0)
    assert budgets(r, "responses") == [3000, 6000]
    assert result.escalations == 1


# --- through the engine: the sim judge over HTTP, both APIs -------------------------------------

HARD = "[need=2000] a0"  # every attempt of a pair with it needs 2,000 output tokens


def engine_settings(api: str, escalation: dict[str, Any] | None, **overrides: Any) -> Settings:
    judge: dict[str, Any] = {"base_url": "http://sim.test/v1", "api": api}
    if escalation is not None:
        judge["budget_escalation"] = escalation
    data: dict[str, Any] = {
        "num_rollouts_per_prompt": 4,
        "comparison_strategy": "circular",
        "cohort_collection_timeout_s": 10.0,
        "cohort_evaluation_timeout_s": 60.0,
        "judge_request_timeout_s": 5.0,
        "genrm_parse_retries": 1,  # two attempts, as in the validation run
        "genrm_parse_retry_sleep_s": 0.5,
        "genrm_responses_create_params": {"input": [], "max_output_tokens": 1341},
        "judge": judge,
        **overrides,
    }
    return Settings.model_validate(data)


@asynccontextmanager
async def sim_engine(config: Settings, sim: SimConfig | None = None) -> AsyncIterator[Any]:
    """An engine whose HttpJudge reaches a simulated judge app over an in-memory network (the
    app served as `sim-judge` serves it); yields (engine, app)."""
    app = sim_asgi_app(sim if sim is not None else SimConfig())
    judge = make_http_judge(config, backend=MemoryNetwork(serve_asgi(app)))
    with trio.fail_after(BOUND):
        async with open_engine(config, judge) as engine:
            yield engine, app


def calls_by_pair(app: SimJudgeApp) -> dict[tuple[str, str], list[int | None]]:
    """The budgets the judge received, per shown pair, in arrival order."""
    out: dict[tuple[str, str], list[int | None]] = {}
    for c in app.sim.calls:
        out.setdefault((c.response_1, c.response_2), []).append(c.max_output_tokens)
    return out


def verdict_tokens(r1: str, r2: str) -> int:
    """What the sim reports for a verdict without a length need: its text's length // 4."""
    return len(sim_verdict_text(r1, r2)) // 4


@pytest.mark.parametrize("api", APIS)
async def test_off_masks_the_comparisons_whose_verdict_needs_more(
    autojump_clock: trio.testing.MockClock, api: str
) -> None:
    answers = [HARD, "a1", "a2", "a3"]
    async with sim_engine(engine_settings(api, None)) as (engine, app):
        replies = await gather(engine, [member(i, answer=a) for i, a in enumerate(answers)])
    assert [type(r).__name__ for r in replies] == ["Masked", "Masked", "Scored", "Masked"]
    row = replies[2].result
    assert ESCALATION_RATE not in row  # off: today's row
    assert (
        row["genrm_failed_comparison_rate_per_group"],
        row["genrm_masked_rollout_rate_per_group"],
    ) == (0.5, 0.75)
    assert calls_by_pair(app) == {
        (HARD, "a1"): [1341, 1341],
        ("a1", "a2"): [1341],
        ("a2", "a3"): [1341],
        ("a3", HARD): [1341, 1341],
    }


@pytest.mark.parametrize("api", APIS)
async def test_on_scores_the_comparisons_the_escalated_budget_fits(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture, api: str
) -> None:
    answers = [HARD, "a1", "a2", "a3"]
    config = engine_settings(api, {"factor": 2.0, "max_output_tokens": 32768})
    with caplog.at_level(logging.INFO, "genrm_trio.judge"):
        async with sim_engine(config) as (engine, app):
            replies = await gather(engine, [member(i, answer=a) for i, a in enumerate(answers)])
            escalations = engine.metrics.registry.get_sample_value(
                "genrm_trio_judge_budget_escalations_total"
            )
            stats = engine.statistics().judge
    assert all(isinstance(r, Scored) for r in replies), replies
    assert calls_by_pair(app) == {
        (HARD, "a1"): [1341, 2682],
        ("a1", "a2"): [1341],
        ("a2", "a3"): [1341],
        ("a3", HARD): [1341, 2682],
    }
    row = replies[0].result
    assert row[ESCALATION_RATE] == 0.5  # 2 of 4 comparisons escalated
    assert row["genrm_failed_comparison_rate_per_group"] == 0.0
    # the escalated attempts are in the token metrics: 1,341 cut off + 2,000 answered, twice
    easy = verdict_tokens("a1", "a2") + verdict_tokens("a2", "a3")
    assert row["genrm_output_tokens_total_per_group"] == 2 * (1341 + 2000) + easy
    assert row["genrm_max_output_tokens_hit_rate_per_group"] == 0.5
    assert (escalations, stats.escalations, stats.calls) == (2.0, 2, 6)
    assert sorted(escalation_lines(caplog)) == [
        "GenRM output budget escalated for pair (0, 1) (judge 0): attempt 2/2 asks for "
        "max_output_tokens 1341 -> 2682",
        "GenRM output budget escalated for pair (3, 0) (judge 0): attempt 2/2 asks for "
        "max_output_tokens 1341 -> 2682",
    ]


@pytest.mark.parametrize("api", APIS)
async def test_need_beyond_the_escalated_budget_still_masks(
    autojump_clock: trio.testing.MockClock, api: str
) -> None:
    answers = ["[need=3000] a0", "a1", "a2", "a3"]
    async with sim_engine(engine_settings(api, {"factor": 2.0})) as (engine, app):
        replies = await gather(engine, [member(i, answer=a) for i, a in enumerate(answers)])
    assert [type(r).__name__ for r in replies] == ["Masked", "Masked", "Scored", "Masked"]
    assert replies[2].result[ESCALATION_RATE] == 0.5  # failed comparisons count as escalated
    assert "max_output_tokens from 1341 up to 2682" in replies[0].reason
    assert app.sim.statistics().calls == 6


@pytest.mark.parametrize("api", APIS)
async def test_fixed_baseline_with_passes_and_position_balance(
    autojump_clock: trio.testing.MockClock, api: str
) -> None:
    config = engine_settings(
        api,
        {"factor": 2.0},
        num_rollouts_per_prompt=2,
        comparison_mode="fixed_baseline",
        num_judges_per_comparison=2,
        position_balance="alternate",
    )
    baseline = "[need=2000] the baseline"
    async with sim_engine(config) as (engine, app):
        replies = await gather(engine, [member(i, baseline=baseline) for i in range(2)])
    assert all(isinstance(r, Scored) for r in replies), replies
    assert replies[0].result[ESCALATION_RATE] == 1.0
    budgets_seen = sorted(c.max_output_tokens or 0 for c in app.sim.calls)
    assert budgets_seen == [1341] * 4 + [2682] * 4  # 2 members x 2 passes, each escalated once
    shown_first = {c.response_1 == baseline for c in app.sim.calls}
    assert shown_first == {True, False}  # both orientations were judged


@pytest.mark.parametrize("api", APIS)
async def test_compare_escalates_instead_of_failing(
    autojump_clock: trio.testing.MockClock, api: str
) -> None:
    answers = [HARD, "a1", "a2"]
    item = compare_input(answers)
    off = engine_settings(api, None, comparison_strategy="all_pairs", num_judges_per_comparison=2)
    async with sim_engine(off) as (engine, _):
        failed = await compare(engine, item)
    assert isinstance(failed, CompareFailed)
    assert "exhausted max_output_tokens=1341" in str(failed)
    on = engine_settings(
        api, {"factor": 2.0}, comparison_strategy="all_pairs", num_judges_per_comparison=2
    )
    async with sim_engine(on) as (engine, app):
        result = await compare(engine, item)
    assert not isinstance(result, CompareFailed)
    assert result.metrics is not None
    assert result.metrics[ESCALATION_RATE] == 4 / 6  # (0,1), (0,2) at both passes
    assert len(app.sim.calls) == 6 + 4


async def test_singleton_row_carries_the_rate_only_when_on(
    autojump_clock: trio.testing.MockClock,
) -> None:
    for escalation, expected in ((None, False), ({}, True)):
        config = engine_settings("responses", escalation, num_rollouts_per_prompt=1)
        async with sim_engine(config) as (engine, _):
            reply = await engine.verify(member(0))
        assert isinstance(reply, Scored)
        assert (ESCALATION_RATE in reply.result) is expected
        if expected:
            assert reply.result[ESCALATION_RATE] == 0.0


async def test_in_process_sim_judge_escalates_too(autojump_clock: trio.testing.MockClock) -> None:
    config = engine_settings("responses", {"factor": 2.0})
    judge = SimJudge(SimConfig())
    with trio.fail_after(BOUND):
        async with open_engine(config, judge) as engine:
            answers = [HARD, "a1", "a2", "a3"]
            replies = await gather(engine, [member(i, answer=a) for i, a in enumerate(answers)])
    assert all(isinstance(r, Scored) for r in replies)
    assert [c.max_output_tokens for c in judge.calls if HARD in (c.response_1, c.response_2)] == [
        1341,
        1341,
        2682,
        2682,
    ]


def test_group_metrics_escalation_rate() -> None:
    stats = [
        ComparisonStats(False, False, False, 100, 3341, True, escalated=True),
        ComparisonStats(True, False, False, 100, 4023, True, escalated=True),  # failed anyway
        ComparisonStats(False, False, False, 100, 900, False),
        ComparisonStats(False, False, False, None, None, False),
    ]
    on = group_metrics(stats, rubric_mode=False, masked=2, members=4, escalation=True)
    off = group_metrics(stats, rubric_mode=False, masked=2, members=4)
    assert on[ESCALATION_RATE] == 0.5
    assert ESCALATION_RATE not in off
    assert {k: v for k, v in on.items() if k != ESCALATION_RATE} == off
    assert list(on)[-1] == ESCALATION_RATE
    assert (
        group_metrics([], rubric_mode=False, masked=0, members=1, escalation=True)[ESCALATION_RATE]
        == 0.0
    )


# --- the benchmark script still runs and counts what it says ------------------------------------


def load_benchmark() -> Any:
    return load_script("benchmarks/budget_escalation.py", "budget_escalation_bench")


async def test_budget_escalation_benchmark_counts(autojump_clock: trio.testing.MockClock) -> None:
    bench = load_benchmark()
    scenario = bench.Scenario("validation-A3", "validation", 1341, 2)
    off = await bench.run(scenario, False, 6, 0)
    on = await bench.run(scenario, True, 6, 0)
    # the third attempt asks for 5,364 tokens, above every need of the preset: nothing fails
    assert (on.failed_comparisons, on.masked_rollouts_mean) == (0, 0.0)
    assert off.failed_comparisons > 0 and off.masked_rollouts_mean > 0
    assert off.escalated_comparison_share == 0.0
    assert 0.0 < on.escalated_comparison_share < 1.0
    assert on.attempts_per_comparison < off.attempts_per_comparison
    assert [v["scenario"] for v in bench.verdicts([off, on])] == ["validation-A3"]


# --- how a cut reply and a strict chat template are named (issue 28 item 4) -----------------------


async def test_a_chat_reply_cut_after_its_verdict_is_named_for_what_it_is(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    """A reply cut at the budget is never a completed answer, even holding a verdict; the words
    say which it was."""
    verdict = '{"score_1": 4, "score_2": 2, "ranking": 2}'
    holding = raw(
        {"choices": [{"message": {"content": verdict + " and so"}, "finish_reason": "length"}]}
    )
    r = rig("chat_completions", holding, exhausted("chat_completions"), retries=1)
    with caplog.at_level(logging.WARNING, "genrm_trio.judge"), trio.fail_after(BOUND):
        error = await r.fail((3, 7))
    assert error.message == (
        "Judge returned no completed answer after 2 attempts (2 of them exhausted "
        "max_output_tokens=1341: 1 cut after writing a verdict, which a reply cut at the budget "
        "does not count as, 1 without emitting one; raise the budget or constrain the judge's "
        "reasoning)"
    )
    assert [rec.getMessage() for rec in caplog.records] == [
        "GenRM output budget exhausted for pair (3, 7) (attempt 1/2, max_output_tokens=1341): "
        "finish_reason=length (the reply reached max_tokens) and holds a verdict, which a reply "
        "cut at the budget does not count as",
        "GenRM output budget exhausted for pair (3, 7) (attempt 2/2, max_output_tokens=1341): "
        "finish_reason=length (the reply reached max_tokens) and contains no verdict",
    ]


@pytest.mark.parametrize("api", ["chat_completions", "openai_responses", "genrm_model"])
async def test_an_http_500_hints_at_the_chat_template_where_custom_roles_are_sent(
    autojump_clock: trio.testing.MockClock, api: str
) -> None:
    r = rig(api, http(500, b'{"detail": "unknown role: principle"}'), retries=0)
    with trio.fail_after(BOUND):
        error = await r.fail()
    path = "/v1/chat/completions" if api == "chat_completions" else "/v1/responses"
    reason = 'JudgeHTTPError: HTTP 500; response={"detail": "unknown role: principle"}'
    if api != "genrm_model":  # Gym's genrm_model server builds the prompt itself
        reason += (
            "; hint: the judge's chat template must accept the roles principle, response_1 and "
            f"response_2, which judge.api {api} sends with judge.prompt: genrm; for any other "
            "model set judge.prompt: instruct"
        )
    assert (
        error.message == f"GenRM judge judge.test:8000 {path} pair=(0, 1) deadline=0.2s: {reason}"
    )


@pytest.mark.parametrize("api", ["chat_completions", "openai_responses"])
async def test_an_http_500_that_names_no_role_carries_no_roles_hint(
    autojump_clock: trio.testing.MockClock, api: str
) -> None:
    """An outage's 500 is not a chat template refusing the roles (#38)."""
    r = rig(api, http(500, b"Internal Server Error"), retries=0)
    with trio.fail_after(BOUND):
        error = await r.fail()
    assert error.message.endswith("JudgeHTTPError: HTTP 500; response=Internal Server Error")


async def test_a_reply_that_is_not_json_names_its_content_type_and_first_bytes(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """What a server that streams unless told `"stream": false` answers."""
    stream = b'data: {"type": "response.created"}\n\n' * 4
    r = rig("openai_responses", Reply(200, stream, ("content-type: text/event-stream",)))
    with trio.fail_after(BOUND):
        error = await r.fail()
    assert error.message == (
        "GenRM judge judge.test:8000 /v1/responses pair=(0, 1) deadline=0.2s: JSONDecodeError: "
        "Expecting value: line 1 column 1 (char 0) (the reply is not JSON: content-type "
        'text/event-stream, 144 bytes, first \'data: {"type": "response.created"}\\n\\ndata: '
        '{"type": "response.created"}\\n\\ndata: {"\'…)'
    )
    assert r.script.calls == 1  # not retried (D14)
