"""Output-budget escalation (`judge.budget_escalation`, docs/scoring.md "Output-budget
escalation"): the comparator's budgets per attempt through a real HttpJudge over
httpx.MockTransport, for both judge APIs, in virtual time — exact attempt counts, the exact
budget every request carried, log lines, counters; and "off" is today's request, byte for byte."""

from __future__ import annotations

import json
import logging
from typing import Any

import httpx
import pytest
import trio
import trio.testing
from test_attempts import CALL, EMPTY, MALFORMED, PAIR, Rig, Script, http, raw, valid

from genrm_trio.judge.base import JudgeCall, Usage
from genrm_trio.judge.http import chat_body, chat_params, responses_body
from genrm_trio.verdict import Verdict

BOUND = 1000
APIS = ["responses", "chat_completions"]
BUDGET_KEY = {"responses": "max_output_tokens", "chat_completions": "max_tokens"}


def exhausted(api: str, tokens: int | None = None) -> httpx.Response:
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


def answered(api: str, tokens: int | None = None) -> httpx.Response:
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


def malformed(api: str) -> httpx.Response:
    """A completed reply without a verdict (a parse failure)."""
    if api == "responses":
        return MALFORMED
    return raw({"choices": [{"message": {"content": "Both are fine."}, "finish_reason": "stop"}]})


def rig(
    api: str,
    *answers: httpx.Response,
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
        "response is incomplete (reason=max_output_tokens) and contains no verdict"
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
