"""One comparison's shared retry budget (docs/configuration.md, "Verdicts and retries"; D13–D15,
D32) through a real HttpJudge, its pool and connections over scripted bytes (tests/scripted.py,
an in-memory network), in virtual time: exact judge-call counts, exact messages and log lines,
exact pacing, the concurrency slot and clean cancellation."""

from __future__ import annotations

import logging
import random
import socket

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
    settings,
    valid,
)
from scripted import BROKEN_WRITE, REFUSED, Answer, Fixed, Hangup, Reply, Reset, Script

from genrm_trio.domain.verdict import Verdict
from genrm_trio.judge.attempts import MAX_BACKOFF_S, RETRY_AFTER_JITTER, Comparator
from genrm_trio.judge.base import ComparisonResult, JudgeError, Usage
from genrm_trio.judge.client import make_http_judge
from genrm_trio.judge.fleet import as_fleet
from genrm_trio.judge.queue import judge_queue
from genrm_trio.metrics import Metrics

PREFIX = "GenRM judge judge.test:8000 /v1/responses pair=(0, 1) deadline=0.2s: "
DEFAULTS = Verdict(3.0, 3.0, 3.5)
BOUND = 1000  # every test body runs under trio.fail_after(BOUND) on the (virtual) trio clock

NULL_TEXT = reply(None)
INCOMPLETE = reply(None, status="incomplete", incomplete_details={"reason": "max_output_tokens"})


def sleeper(seconds: float, then: Reply | None = None) -> Answer:
    async def answer(request: object) -> Fixed:
        await trio.sleep(seconds)
        return then if then is not None else valid()

    return answer


# --- retry budget and parsing ---------------------------------------------------------------


async def test_parse_retry_then_valid(autojump_clock: trio.testing.MockClock) -> None:
    rig = Rig(Script(MALFORMED, valid(4, 2, 1)), genrm_parse_retries=1)
    with trio.fail_after(BOUND):
        result = await rig.compare()
    assert result.selected == result.overall == Verdict(4, 2, 1)
    assert (result.overall_parse_failed, result.rubric_parse_failed) == (False, False)
    assert (result.attempts, rig.script.calls) == (2, 2)


async def test_parse_failures_fall_back_to_defaults(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    rig = Rig(Script(MALFORMED), genrm_parse_retries=1)
    with caplog.at_level(logging.WARNING, "genrm_trio.judge"), trio.fail_after(BOUND):
        result = await rig.compare((2, 5))
    assert result.selected == result.overall == DEFAULTS
    assert (result.overall_parse_failed, result.rubric_parse_failed) == (True, False)
    assert (result.attempts, rig.script.calls) == (2, 2)
    assert [r.getMessage() for r in caplog.records] == [
        "GenRM overall parse failed for pair (2, 5) after 2 attempts; using defaults"
    ]
    assert caplog.records[0].levelno == logging.WARNING
    assert rig.comparator.statistics().fallbacks == 1


@pytest.mark.parametrize("unusable", [EMPTY, INCOMPLETE], ids=["empty", "incomplete"])
@pytest.mark.parametrize("recovers", [True, False])
async def test_empty_or_incomplete_uses_configured_retries(
    autojump_clock: trio.testing.MockClock, unusable: Reply, recovers: bool
) -> None:
    rig = Rig(Script(unusable, valid(5, 1, 6) if recovers else unusable), genrm_parse_retries=1)
    with trio.fail_after(BOUND):
        if recovers:
            assert (await rig.compare()).selected == Verdict(5, 1, 6)
        else:
            error = await rig.fail()
            assert error.message.startswith("Judge returned no completed answer after 2 attempts")
            assert error.attempts == 2
    assert rig.script.calls == 2


async def test_null_status_accepts_parseable_answer(
    autojump_clock: trio.testing.MockClock,
) -> None:
    rig = Rig(Script(reply('{"score_1": 2, "score_2": 5, "ranking": 6}', status=None)))
    with trio.fail_after(BOUND):
        assert (await rig.compare()).selected == Verdict(2, 5, 6)
    assert rig.script.calls == 1


@pytest.mark.parametrize("order", [(MALFORMED, EMPTY), (EMPTY, MALFORMED)], ids=["me", "em"])
async def test_fallback_does_not_depend_on_retry_order(
    autojump_clock: trio.testing.MockClock, order: tuple[Reply, Reply]
) -> None:
    rig = Rig(Script(*order), genrm_parse_retries=1)
    with trio.fail_after(BOUND):
        result = await rig.compare()
    assert result.selected == result.overall == DEFAULTS
    assert result.overall_parse_failed
    assert rig.script.calls == 2


async def test_null_text_is_retried_as_unusable(autojump_clock: trio.testing.MockClock) -> None:
    rig = Rig(Script(NULL_TEXT), genrm_parse_retries=1)
    with trio.fail_after(BOUND):
        error = await rig.fail()
    assert error.message == "Judge returned no completed answer after 2 attempts"
    assert rig.script.calls == 2


# A 429 is no attempt: it holds its replica (tests/test_rate_limits.py).
@pytest.mark.parametrize("status", [408, 500, 503, 599])
async def test_transient_http_error_costs_one_extra_call(
    autojump_clock: trio.testing.MockClock, status: int
) -> None:
    rig = Rig(Script(http(status), valid()))
    with trio.fail_after(BOUND):
        assert (await rig.compare()).selected == Verdict(4, 2, 1)
    assert rig.script.calls == 2
    assert rig.metric("genrm_trio_judge_retries_total", cause="http") == 1


@pytest.mark.parametrize(
    ("error", "text"),
    [
        (
            Hangup(b'HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n{"st'),
            "RemoteProtocolError: peer closed connection without sending complete message body: "
            "received 4 bytes, expected 100",
        ),
        (
            Reset(b"HTTP/1.1 200 OK\r\n"),
            "ReadError: socket connection broken: [Errno 104] Connection reset by peer",
        ),
        (
            REFUSED,
            "ConnectError: [Errno 111] Error connecting to ('judge.test', 8000): "
            "Connection refused",
        ),
        (
            BROKEN_WRITE,
            "WriteError: socket connection broken: [Errno 104] Connection reset by peer",
        ),
    ],
    ids=["RemoteProtocolError", "ReadError", "ConnectError", "WriteError"],
)
@pytest.mark.parametrize("recovers", [True, False])
async def test_transport_errors_share_the_budget(
    autojump_clock: trio.testing.MockClock, error: Answer, text: str, recovers: bool
) -> None:
    answers: list[Answer] = [error, error, valid()] if recovers else [error]
    rig = Rig(Script(*answers))
    with trio.fail_after(BOUND):
        if recovers:
            assert (await rig.compare()).attempts == 3
            assert rig.script.calls == 3
        else:
            failure = await rig.fail()
            assert failure.message == f"{PREFIX}{text}"
            assert rig.script.calls == 4
            assert failure.attempts == 4
            assert failure.usage is None


@pytest.mark.parametrize("status", [400, 401, 403, 404, 408, 500, 503])
async def test_http_budget_exhaustion_never_defaults(
    autojump_clock: trio.testing.MockClock, status: int
) -> None:
    rig = Rig(Script(http(status)), genrm_parse_retries=2)
    with trio.fail_after(BOUND):
        error = await rig.fail()
    retryable = status in (408, 429) or status >= 500
    assert rig.script.calls == (3 if retryable else 1)
    assert error.message == f"{PREFIX}JudgeHTTPError: HTTP {status}; response=judge offline"
    assert rig.metric("genrm_trio_judge_calls_total", outcome="http_error") == rig.script.calls


async def test_parse_and_http_failures_share_one_budget(
    autojump_clock: trio.testing.MockClock,
) -> None:
    rig = Rig(Script(MALFORMED, http(503)), genrm_parse_retries=1)
    with trio.fail_after(BOUND):
        error = await rig.fail()
    assert error.message == f"{PREFIX}JudgeHTTPError: HTTP 503; response=judge offline"
    assert rig.script.calls == 2


async def test_permanently_empty_judge_makes_exactly_16_calls_for_4_comparisons(
    autojump_clock: trio.testing.MockClock,
) -> None:
    rig = Rig(Script(EMPTY))  # default budget: 3 retries = 4 attempts
    errors: list[str] = []

    async def one(pair: tuple[int, int]) -> None:
        errors.append((await rig.fail(pair)).message)

    with trio.fail_after(BOUND):
        async with trio.open_nursery() as nursery:
            for pair in [(0, 1), (1, 2), (2, 3), (3, 0)]:
                nursery.start_soon(one, pair)
    assert rig.script.calls == 16
    assert errors == ["Judge returned no completed answer after 4 attempts"] * 4
    assert rig.comparator.statistics().failures == 4


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e309"])
@pytest.mark.parametrize("recovers", [True, False])
async def test_nonfinite_verdicts_use_parse_retries(
    autojump_clock: trio.testing.MockClock, literal: str, recovers: bool
) -> None:
    bad = reply(f'{{"score_1": {literal}, "score_2": 2, "ranking": 2}}')
    rig = Rig(Script(bad, valid()) if recovers else Script(bad))
    with trio.fail_after(BOUND):
        result = await rig.compare()
    if recovers:
        assert (result.selected, rig.script.calls) == (Verdict(4, 2, 1), 2)
    else:
        assert (result.selected, result.overall_parse_failed, rig.script.calls) == (
            DEFAULTS,
            True,
            4,
        )


async def test_out_of_range_verdict_is_a_parse_failure_unless_validation_is_off(
    autojump_clock: trio.testing.MockClock,
) -> None:
    wild = reply('{"score_1": 9, "score_2": 2, "ranking": -4}')
    strict, lax = Rig(Script(wild)), Rig(Script(wild), validate_verdict_range=False)
    with trio.fail_after(BOUND):
        assert (await strict.compare()).selected == DEFAULTS
        assert (await lax.compare()).selected == Verdict(9, 2, -4)
    assert (strict.script.calls, lax.script.calls) == (4, 1)


async def test_request_carries_answers_in_metadata_only(
    autojump_clock: trio.testing.MockClock,
) -> None:
    rig = Rig(Script(valid()))
    with trio.fail_after(BOUND):
        await rig.compare()
    body = rig.script.bodies[0]
    assert body["input"] == [{"role": "user", "content": "What is 2+2?", "type": "message"}]
    assert body["metadata"] == {"response_1": "four", "response_2": "4"}


# --- judge failures are failures, never defaults --------------------------------------------


@pytest.mark.parametrize(("status", "calls"), [(401, 1), (500, 4)])
async def test_http_failure_message_and_call_counts(
    autojump_clock: trio.testing.MockClock, status: int, calls: int
) -> None:
    rig = Rig(Script(http(status, b"judge offline")))
    with trio.fail_after(BOUND):
        error = await rig.fail()
    assert rig.script.calls == calls
    assert error.message == f"{PREFIX}JudgeHTTPError: HTTP {status}; response=judge offline"
    assert error.attempts == calls


async def test_http_failure_then_recovery(autojump_clock: trio.testing.MockClock) -> None:
    rig = Rig(Script(http(500), valid()))
    with trio.fail_after(BOUND):
        assert (await rig.compare()).attempts == 2


async def test_timeout_is_a_failure_at_the_deadline(
    autojump_clock: trio.testing.MockClock,
) -> None:
    rig = Rig(Script(sleeper(10), valid()))
    start = trio.current_time()
    with trio.fail_after(BOUND):
        error = await rig.fail()
    assert trio.current_time() - start == 0.2
    assert error.message == f"{PREFIX}TimeoutError: judge attempt exceeded 0.2s"
    assert "deadline=0.2s" in error.message
    assert rig.script.calls == 1  # the per-attempt deadline is not retried (D14)
    assert rig.metric("genrm_trio_judge_calls_total", outcome="timeout") == 1
    rig.assert_idle()


async def test_timeout_after_malformed_answer_is_still_a_failure(
    autojump_clock: trio.testing.MockClock,
) -> None:
    rig = Rig(Script(MALFORMED, sleeper(10)))
    with trio.fail_after(BOUND):
        error = await rig.fail()
    assert error.message.endswith("TimeoutError: judge attempt exceeded 0.2s")
    assert rig.script.calls == 2


async def test_bad_json_is_a_failure_at_once(autojump_clock: trio.testing.MockClock) -> None:
    rig = Rig(Script(Reply(200, b"<html>bad gateway</html>")))
    with trio.fail_after(BOUND):
        error = await rig.fail()
    assert error.message.startswith(f"{PREFIX}JSONDecodeError: Expecting value")
    assert rig.script.calls == 1


@pytest.mark.parametrize(
    "unusable",
    [
        raw(None),
        raw({}),
        raw([]),
        reply(status="incomplete", incomplete_details={"reason": "content_filter"}),
        reply(status="failed"),
        reply(status="cancelled"),
        reply(""),
    ],
    ids=["null", "{}", "[]", "incomplete", "failed", "cancelled", "blank"],
)
async def test_unsuccessful_http_200_is_a_failure(
    autojump_clock: trio.testing.MockClock, unusable: Reply
) -> None:
    rig = Rig(Script(unusable))
    with trio.fail_after(BOUND):
        error = await rig.fail()
    assert error.message == "Judge returned no completed answer after 4 attempts"
    assert rig.script.calls == 4
    assert rig.metric("genrm_trio_judge_calls_total", outcome="unusable") == 4


async def test_closed_port_fails_after_a_attempts_with_connect_error() -> None:
    """Real I/O, so the real clock: a refused connection is one attempt (D15), fast."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # free again once closed: nothing listens there
    config = settings(
        judge={"base_url": f"http://127.0.0.1:{port}/v1"},
        genrm_parse_retry_sleep_s=0.01,
        judge_request_timeout_s=5.0,
    )
    judge = make_http_judge(config)
    comparator = Comparator(judge, config, Metrics())
    start = trio.current_time()
    with trio.fail_after(5), pytest.raises(JudgeError) as info:
        await comparator.compare(CALL, pair=(0, 1), judge_pass=0)
    assert trio.current_time() - start < 2
    assert info.value.message.startswith(
        f"GenRM judge 127.0.0.1:{port} /v1/responses pair=(0, 1) deadline=5.0s: ConnectError: "
    )
    assert info.value.attempts == 4
    assert comparator.statistics().calls == 4
    assert judge.open_connections == 0
    await judge.aclose()


# --- output budget, usage ------------------------------------------------------------------


async def test_budget_exhaustion_suffix_and_warning_lines(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    rig = Rig(Script(INCOMPLETE, EMPTY, INCOMPLETE, NULL_TEXT))
    with caplog.at_level(logging.WARNING, "genrm_trio.judge"), trio.fail_after(BOUND):
        error = await rig.fail((3, 7))
    assert error.message == (
        "Judge returned no completed answer after 4 attempts (2 of them exhausted "
        "max_output_tokens=16384 without emitting a verdict; raise the budget or constrain the "
        "judge's reasoning)"
    )
    assert [r.getMessage() for r in caplog.records] == [
        f"GenRM output budget exhausted for pair (3, 7) (attempt {n}/4, max_output_tokens=16384): "
        "response is incomplete (reason=max_output_tokens) and contains no verdict"
        for n in (1, 3)
    ]
    assert all(r.levelno == logging.WARNING for r in caplog.records)
    assert rig.metric("genrm_trio_judge_calls_total", outcome="budget_exhausted") == 2
    assert rig.metric("genrm_trio_judge_retries_total", cause="budget") == 2
    assert rig.metric("genrm_trio_judge_retries_total", cause="unusable") == 1


async def test_budget_exhaustion_then_malformed_falls_back(
    autojump_clock: trio.testing.MockClock,
) -> None:
    usage = {"input_tokens": 10, "output_tokens": 16384}
    incomplete = reply(
        None, status="incomplete", incomplete_details={"reason": "max_output_tokens"}, usage=usage
    )
    rig = Rig(Script(incomplete, MALFORMED), genrm_parse_retries=1)
    with trio.fail_after(BOUND):
        result = await rig.compare()
    assert result.selected == DEFAULTS
    assert result.usage == Usage(10, 16384, budget_hit=True)


async def test_budget_suffix_names_configured_budget_and_chat_length(
    autojump_clock: trio.testing.MockClock,
) -> None:
    length = Reply.json(
        {
            "choices": [{"message": {"content": "thinking..."}, "finish_reason": "length"}],
            "usage": {"prompt_tokens": 7, "completion_tokens": 512},
        },
    )
    rig = Rig(
        Script(length),
        judge={"api": "chat_completions"},
        genrm_parse_retries=1,
        genrm_responses_create_params={"input": [], "max_output_tokens": 512},
    )
    with trio.fail_after(BOUND):
        error = await rig.fail()
    assert error.message == (
        "Judge returned no completed answer after 2 attempts (2 of them exhausted "
        "max_output_tokens=512 without emitting a verdict; raise the budget or constrain the "
        "judge's reasoning)"
    )
    assert error.usage == Usage(14, 1024, budget_hit=True)  # D32: failed comparisons keep usage
    assert rig.script.bodies[0]["max_tokens"] == 512


async def test_usage_sums_over_attempts_with_json_bodies(
    autojump_clock: trio.testing.MockClock,
) -> None:
    rig = Rig(
        Script(
            reply(None, usage={"input_tokens": 10, "output_tokens": 1}),  # unusable, counted
            http(503),  # HTTP failure: contributes nothing
            reply("no verdict", usage={"prompt_tokens": 20, "completion_tokens": 2}),
            reply("nope", usage={"input_tokens": True, "output_tokens": 3}),  # bool: ignored
            valid(),
        ),
        genrm_parse_retries=4,
    )
    with trio.fail_after(BOUND):
        result = await rig.compare()
    assert result.usage == Usage(30, 3, budget_hit=False)
    assert result.attempts == 5


async def test_no_usage_is_none(autojump_clock: trio.testing.MockClock) -> None:
    rig = Rig(Script(valid()))
    with trio.fail_after(BOUND):
        assert (await rig.compare()).usage is None


async def test_failed_comparison_keeps_usage(autojump_clock: trio.testing.MockClock) -> None:
    rig = Rig(Script(reply("", usage={"input_tokens": 5, "output_tokens": 6}), http(400)))
    with trio.fail_after(BOUND):
        error = await rig.fail()
    assert error.usage == Usage(5, 6, budget_hit=False)
    assert error.attempts == 2


# --- rubric mode (docs/scoring.md, "Rubric mean (D11)") ------------------------------------

RUBRIC_NO_OVERALL = (
    '{"rubric_evaluations": ['
    '{"rubric_id": 1, "score_1": 5, "score_2": 1, "ranking": 1},'
    '{"rubric_id": 2, "score_1": 3, "score_2": 3, "ranking": 4}]}'
)


async def test_rubric_mean_selected_and_overall_kept(
    autojump_clock: trio.testing.MockClock,
) -> None:
    rig = Rig(Script(reply(RUBRIC)), score_source="rubric_mean")
    with trio.fail_after(BOUND):
        result = await rig.compare(expected_rubric_ids=[1, 2])
    assert result.selected == Verdict(4, 2, 2.5)
    assert result.overall == Verdict(4, 2, 2)
    assert (result.overall_parse_failed, result.rubric_parse_failed, result.attempts) == (
        False,
        False,
        1,
    )


async def test_rubric_overall_failure_does_not_retry(
    autojump_clock: trio.testing.MockClock,
) -> None:
    rig = Rig(Script(reply(RUBRIC_NO_OVERALL)), score_source="rubric_mean")
    with trio.fail_after(BOUND):
        result = await rig.compare(expected_rubric_ids=[1, 2])
    assert (result.selected, result.overall) == (Verdict(4, 2, 2.5), DEFAULTS)
    assert (result.overall_parse_failed, result.rubric_parse_failed) == (True, False)
    assert rig.script.calls == 1


async def test_rubric_failure_retries_then_falls_back(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    only_overall = reply('{"score_1": 5, "score_2": 1, "ranking": 1}')
    rig = Rig(Script(only_overall), score_source="rubric_mean", genrm_parse_retries=1)
    with caplog.at_level(logging.WARNING, "genrm_trio.judge"), trio.fail_after(BOUND):
        result = await rig.compare(expected_rubric_ids=[1, 2])
    assert result.selected == DEFAULTS
    assert result.overall == Verdict(5, 1, 1)  # the final attempt's overall verdict parsed
    assert (result.overall_parse_failed, result.rubric_parse_failed) == (False, True)
    assert rig.script.calls == 2
    assert [r.getMessage() for r in caplog.records] == [
        "GenRM rubric_mean parse failed for pair (0, 1) after 2 attempts; using defaults"
    ]


async def test_rubric_unusable_final_attempt_sets_both_flags(
    autojump_clock: trio.testing.MockClock,
) -> None:
    rig = Rig(Script(MALFORMED, EMPTY), score_source="rubric_mean", genrm_parse_retries=1)
    with trio.fail_after(BOUND):
        result = await rig.compare(expected_rubric_ids=[1])
    assert (result.selected, result.overall) == (DEFAULTS, DEFAULTS)
    assert (result.overall_parse_failed, result.rubric_parse_failed) == (True, True)


async def test_rubric_wrong_ids_retry_then_recover(
    autojump_clock: trio.testing.MockClock,
) -> None:
    rig = Rig(Script(reply(RUBRIC), reply(RUBRIC)), score_source="rubric_mean")
    with trio.fail_after(BOUND):
        result = await rig.compare(expected_rubric_ids=[1, 2, 3])
    assert result.rubric_parse_failed
    assert rig.script.calls == 4


async def test_rubric_mode_requires_ids() -> None:
    rig = Rig(Script(valid()), score_source="rubric_mean")
    with trio.fail_after(5), pytest.raises(ValueError, match="requires expected_rubric_ids"):
        await rig.compare()
    assert rig.script.calls == 0


# --- pacing (D13) ---------------------------------------------------------------------------


async def test_constant_pacing_exact_times(autojump_clock: trio.testing.MockClock) -> None:
    rig = Rig(Script(EMPTY))
    start = trio.current_time()
    with trio.fail_after(BOUND):
        await rig.fail()
    expected = [start]
    for _ in range(3):
        expected.append(expected[-1] + 0.2)
    assert rig.script.times == expected


async def test_zero_sleep_retries_at_once(autojump_clock: trio.testing.MockClock) -> None:
    rig = Rig(Script(EMPTY), genrm_parse_retry_sleep_s=0)
    start = trio.current_time()
    with trio.fail_after(BOUND):
        await rig.fail()
    assert rig.script.times == [start] * 4


async def test_retry_after_is_honoured_exactly(autojump_clock: trio.testing.MockClock) -> None:
    # Honoured, and stretched by up to RETRY_AFTER_JITTER of itself (D44), never shortened.
    rig = Rig(
        Script(http(503, retry_after="7"), http(503, retry_after="0"), valid()),
        rng=random.Random(7),
    )
    start = trio.current_time()
    with trio.fail_after(BOUND):
        result = await rig.compare()
    assert result.attempts == 3
    first = 7.0 * (1 + random.Random(7).uniform(0.0, RETRY_AFTER_JITTER))
    assert 7.0 < first <= 7.0 * (1 + RETRY_AFTER_JITTER)
    assert rig.script.times == [start, start + first, start + first]


async def test_a_retry_after_slept_while_collecting_keeps_its_time_when_the_deadline_fits(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A Retry-After slept while its group collects, whose group then completes with a deadline
    the sleep still fits: the sleep ends when it was chosen to (its jitter kept); only a
    deadline it no longer fits sizes it again (tests/test_engine_eager.py)."""
    rig = Rig(Script(http(503, retry_after="7"), valid()), rng=random.Random(7))
    queue = rig.queue
    group = queue.group(complete=False)
    start = trio.current_time()

    async def complete(scope: trio.CancelScope) -> None:
        await trio.sleep(1.0)
        scope.deadline = start + 30.0  # the group's deadline, set as its last member arrives
        group.mark_complete()

    with trio.fail_after(BOUND), trio.CancelScope() as scope:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(complete, scope)
            result = await rig.comparator.compare(
                CALL, pair=PAIR, judge_pass=0, ticket=queue.ticket(group)
            )
    assert result.attempts == 2
    first = 7.0 * (1 + random.Random(7).uniform(0.0, RETRY_AFTER_JITTER))
    assert rig.script.times == [start, start + first]


async def test_retry_after_that_does_not_fit_the_deadline_is_ignored(
    autojump_clock: trio.testing.MockClock,
) -> None:
    rig = Rig(Script(http(503, retry_after="60"), valid()))
    start = trio.current_time()
    with trio.fail_after(30):  # the enclosing (group) deadline
        assert (await rig.compare()).attempts == 2
    assert rig.script.times == [start, start + 0.2]  # normal pacing instead


async def test_retry_after_fitting_the_deadline_is_honoured(
    autojump_clock: trio.testing.MockClock,
) -> None:
    rig = Rig(Script(http(503, retry_after="20"), valid()), rng=random.Random(3))
    start = trio.current_time()
    with trio.fail_after(30):
        assert (await rig.compare()).attempts == 2
    assert rig.script.times == [start, start + 20.0 * (1 + random.Random(3).uniform(0, 0.1))]


async def test_retry_after_whose_jitter_does_not_fit_is_honoured_unstretched(
    autojump_clock: trio.testing.MockClock,
) -> None:
    rig = Rig(Script(http(503, retry_after="20"), valid()), rng=random.Random(3))
    start = trio.current_time()
    with trio.fail_after(20.1):  # 20 s fits; 20 s and its jitter (here 0.48 s) do not
        assert (await rig.compare()).attempts == 2
    assert rig.script.times == [start, start + 20.0]


@pytest.mark.parametrize(("base", "retries"), [(1.0, 6), (10.0, 5), (0.2, 3)])
async def test_exponential_pacing_is_full_jitter_capped(
    autojump_clock: trio.testing.MockClock, base: float, retries: int
) -> None:
    rig = Rig(
        Script(EMPTY),
        rng=random.Random(1234),
        retry_backoff="exponential",
        genrm_parse_retry_sleep_s=base,
        genrm_parse_retries=retries,
    )
    start = trio.current_time()
    with trio.fail_after(BOUND):
        await rig.fail()
    twin = random.Random(1234)
    expected = [start]
    for n in range(1, retries + 1):
        bound = min(MAX_BACKOFF_S, base * 2 ** (n - 1))
        pause = twin.uniform(0.0, bound)
        assert 0 <= pause <= bound
        expected.append(expected[-1] + pause)
    assert rig.script.times == expected
    assert rig.script.calls == retries + 1


async def test_sleep_ends_at_the_enclosing_deadline(
    autojump_clock: trio.testing.MockClock,
) -> None:
    rig = Rig(Script(EMPTY), genrm_parse_retry_sleep_s=100)
    start = trio.current_time()
    with trio.fail_after(BOUND), trio.move_on_after(5) as scope:
        await rig.compare()
    assert scope.cancelled_caught
    assert trio.current_time() - start == 5
    assert rig.script.calls == 1
    rig.assert_idle()


# --- the concurrency slot (judge.max_concurrency, D13) --------------------------------------


async def test_limiter_holds_calls_to_its_cap_and_queue_wait_is_not_an_attempt(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # Each call takes 1 s; the per-attempt deadline is 1.5 s, so counting the queue wait against
    # it would time out the later comparisons.
    rig = Rig(Script(sleeper(1.0)), judge={"max_concurrency": 2}, judge_request_timeout_s=1.5)
    results: list[ComparisonResult] = []
    start = trio.current_time()

    async def one(i: int) -> None:
        results.append(await rig.compare((i, i + 1)))

    with trio.fail_after(BOUND):
        async with trio.open_nursery() as nursery:
            for i in range(5):
                nursery.start_soon(one, i)
            await trio.testing.wait_all_tasks_blocked()
            stats = rig.comparator.statistics()
            assert (stats.in_flight, stats.queued, stats.comparisons_active) == (2, 3, 5)
            assert rig.metric("genrm_trio_judge_queued") == 3
            assert rig.metric("genrm_trio_judge_inflight") == 2
    assert trio.current_time() - start == 3.0  # ceil(5 / 2) rounds of 1 s
    assert rig.script.max_active == 2
    assert rig.script.calls == 5
    assert [r.attempts for r in results] == [1] * 5
    # a comparison without a ticket is a complete group of its own (as `/compare`'s are)
    wait = {"priority": "complete"}
    assert rig.metric("genrm_trio_judge_queue_wait_seconds_count", **wait) == 5
    assert rig.metric("genrm_trio_judge_queue_wait_seconds_sum", **wait) == 0 + 0 + 1 + 1 + 2
    assert rig.metric("genrm_trio_judge_queue_wait_seconds_count", priority="collecting") == 0
    rig.assert_idle()
    assert rig.comparator.statistics().comparisons == 5


async def test_slot_is_released_before_the_retry_sleep(
    autojump_clock: trio.testing.MockClock,
) -> None:
    rig = Rig(
        Script(http(503), sleeper(1.0)),
        judge={"max_concurrency": 1},
        genrm_parse_retry_sleep_s=10,
        judge_request_timeout_s=5,
    )
    start = trio.current_time()
    with trio.fail_after(BOUND):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(rig.compare)
            await trio.sleep(1)  # the comparison is sleeping before its retry
            assert rig.queue.statistics().in_use == 0
            assert rig.comparator.statistics().in_flight == 0
    assert rig.script.times == [start, start + 10]


# --- cancellation leaves nothing behind -----------------------------------------------------


async def test_cancel_mid_attempt_leaves_nothing(autojump_clock: trio.testing.MockClock) -> None:
    rig = Rig(Script(sleeper(100)), judge={"max_concurrency": 1}, judge_request_timeout_s=500)
    with trio.fail_after(BOUND):
        async with trio.open_nursery() as nursery:
            for _ in range(3):  # one in flight, two queued
                nursery.start_soon(rig.compare)
            await trio.sleep(1)
            stats = rig.comparator.statistics()
            assert (stats.in_flight, stats.queued) == (1, 2)
            nursery.cancel_scope.cancel()
    rig.assert_idle()
    await trio.testing.wait_all_tasks_blocked()  # the judge's side saw the connection close
    assert rig.script.active == 0
    assert rig.comparator.statistics().calls == 1
    # the comparator works normally afterwards
    rig.script.answers = [valid()]
    with trio.fail_after(BOUND):
        assert (await rig.compare()).attempts == 1


async def test_cancel_mid_attempt_over_a_real_socket_closes_the_connection() -> None:
    """Real I/O, real clock: the judge accepts and never answers; the caller gives up."""
    got_request = trio.Event()
    closed = trio.Event()

    async def handler(stream: trio.SocketStream) -> None:
        data = b""
        while b"\r\n\r\n" not in data:
            data += await stream.receive_some()
        got_request.set()
        while await stream.receive_some():
            pass
        closed.set()

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(trio.serve_tcp, handler, 0)
        port = listeners[0].socket.getsockname()[1]
        config = settings(
            judge={"base_url": f"http://127.0.0.1:{port}/v1"}, judge_request_timeout_s=30
        )
        judge = make_http_judge(config)
        fleet = as_fleet(judge)
        queue = judge_queue(fleet, config, Metrics())
        comparator = Comparator(fleet, config, Metrics(), queue=queue)
        with trio.fail_after(5):
            async with trio.open_nursery() as calls:
                calls.start_soon(lambda: comparator.compare(CALL, pair=PAIR, judge_pass=0))
                await got_request.wait()
                assert judge.open_connections == 1
                calls.cancel_scope.cancel()
            await closed.wait()
        assert (judge.open_connections, judge.in_flight) == (0, 0)
        assert queue.statistics().in_use == 0
        assert comparator.statistics().in_flight == 0
        await judge.aclose()
        nursery.cancel_scope.cancel()


# --- metrics and statistics -----------------------------------------------------------------


async def test_metrics_per_attempt(autojump_clock: trio.testing.MockClock) -> None:
    rig = Rig(
        Script(http(500), REFUSED, EMPTY, MALFORMED, valid()),
        genrm_parse_retries=4,
    )
    with trio.fail_after(BOUND):
        await rig.compare()
    calls = {
        outcome: rig.metric("genrm_trio_judge_calls_total", outcome=outcome)
        for outcome in ("http_error", "transport_error", "unusable", "completed")
    }
    assert calls == {"http_error": 1, "transport_error": 1, "unusable": 1, "completed": 2}
    retries = {
        cause: rig.metric("genrm_trio_judge_retries_total", cause=cause)
        for cause in ("http", "transport", "unusable", "parse")
    }
    assert retries == {"http": 1, "transport": 1, "unusable": 1, "parse": 1}
    assert rig.metric("genrm_trio_judge_attempt_seconds_count") == 5
    stats = rig.comparator.statistics()
    assert (stats.calls, stats.retries, stats.comparisons, stats.max_concurrency) == (5, 4, 1, 256)
