"""A judge's rate limits (docs/configuration.md, "A judge with rate limits"), in virtual time with
exact times and exact judge-call counts: a 429 holds its replica (each header form, and a bare
storm's back-off), costs no attempt and no failure; configured requests and tokens per minute
pace the calls; without configuration the replies' `x-ratelimit-*` headers do; a hold that cannot
fit the deadline fails the comparison at once; prices give a cost. The pure parsing and the
bucket are tested on their own, and the simulated judge's limits as a hosted API enforces them.
"""

from __future__ import annotations

import email.utils
import logging
import time
from types import SimpleNamespace
from typing import Any

import pytest
import trio
import trio.testing
from comparator_rig import CALL, PAIR, Rig, reply, valid
from scripted import Reply, Script

from genrm_trio.config import settings_from_mapping
from genrm_trio.domain.ratelimit import (
    CallBuckets,
    RateLimitHeaders,
    TokenBucket,
    format_duration,
    parse_duration,
    parse_rate_limit_headers,
)
from genrm_trio.domain.verdict import Verdict
from genrm_trio.judge import client as client_module
from genrm_trio.judge.attempts import Comparator
from genrm_trio.judge.factory import make_judge
from genrm_trio.judge.limits import HOLD_FIRST_S, HOLD_MAX_S
from genrm_trio.metrics import Metrics
from genrm_trio.testing import sim_asgi_app
from genrm_trio.testing.core import SimConfig
from genrm_trio.testing.network import MemoryNetwork, serve_asgi
from genrm_trio.testing.ratelimit import SimLimiter, SimRateLimits

BOUND = 1000


def too_many(*headers: str) -> Reply:
    return Reply(429, b'{"error": "rate limited"}', headers)


# --- the pure parts ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("1s", 1.0),
        ("6m0s", 360.0),
        ("20ms", 0.02),
        ("1h2m3.5s", 3723.5),
        ("0.5", 0.5),
        ("17", 17.0),
        ("250us", 0.00025),
        ("", None),
        (None, None),
        ("soon", None),
        ("5x", None),
        ("1s2", None),
        ("-1", None),
    ],
)
def test_reset_durations_in_openais_forms(text: str | None, seconds: float | None) -> None:
    assert parse_duration(text) == (pytest.approx(seconds) if seconds is not None else None)


@pytest.mark.parametrize("seconds", [0.02, 0.5, 1.0, 1.5, 59.0, 60.0, 360.0, 3723.25])
def test_reset_durations_written_as_openai_writes_them_read_back(seconds: float) -> None:
    assert parse_duration(format_duration(seconds)) == pytest.approx(seconds)
    assert (format_duration(0.02), format_duration(360.0), format_duration(1.5)) == (
        "20ms",
        "6m0s",
        "1.5s",
    )


def test_rate_limit_headers_are_read_in_any_case_and_retry_after_ms_comes_first() -> None:
    now = 1_700_000_000.0
    headers = [
        (b"X-RateLimit-Limit-Requests", b"60"),
        (b"x-ratelimit-remaining-requests", b"0"),
        (b"x-ratelimit-reset-requests", b"1s"),
        (b"x-ratelimit-limit-tokens", b"1000"),
        (b"x-ratelimit-remaining-tokens", b"400"),
        (b"x-ratelimit-reset-tokens", b"36s"),
        (b"Retry-After", b"9"),
        (b"retry-after-ms", b"1500"),
        (b"content-type", b"application/json"),
    ]
    said = parse_rate_limit_headers(headers, now=now)
    assert said == RateLimitHeaders(60, 1000, 0, 400, 1.0, 36.0, 1.5)
    assert said.exhausted_for() == 1.0  # the requests are spent; the tokens are not
    date = email.utils.formatdate(now + 5, usegmt=True).encode()
    assert parse_rate_limit_headers([(b"retry-after", date)], now=now) == RateLimitHeaders(
        retry_after_s=5.0
    )
    assert parse_rate_limit_headers([(b"content-type", b"text/plain")], now=now) is None


def test_a_token_bucket_refills_over_a_minute_and_grants_an_oversized_cost_when_full() -> None:
    bucket = TokenBucket.per_minute(60, now=0.0)
    assert bucket.wait(60, 0.0) == 0.0
    bucket.take(60, 0.0)
    assert bucket.wait(1, 0.0) == 1.0
    assert bucket.wait(1, 0.5) == 0.5
    assert bucket.wait(30, 10.0) == 20.0
    assert bucket.wait(600, 60.0) == 0.0  # larger than the bucket: granted once it is full
    bucket.take(600, 60.0)
    assert bucket.level == -540.0


def test_a_call_is_charged_one_request_and_its_tokens_and_waits_for_the_emptier_bucket() -> None:
    buckets = CallBuckets(TokenBucket.per_minute(60, 0.0), TokenBucket.per_minute(600, 0.0))
    assert buckets.wait(600, 0.0) == 0.0
    buckets.take(600, 0.0)
    assert buckets.requests is not None and buckets.requests.level == 59.0
    assert buckets.tokens is not None and buckets.tokens.level == 0.0
    assert buckets.wait(30, 0.0) == 3.0  # the tokens' wait, longer than the request's (0)
    assert buckets.wait(None, 0.0) == 0.0  # tokens not counted: the request alone
    buckets.take(600, 1.0)  # oversized: the token bucket goes below empty
    assert buckets.wait(0, 1.0) == 59.0  # a call of 0 tokens still waits for the deficit
    assert buckets.wait(None, 1.0) == 0.0
    assert CallBuckets().wait(10**9, 0.0) == 0.0  # no limit of either kind


# --- a 429 holds its replica: no attempt, exact holds ---------------------------------------


@pytest.mark.parametrize(
    ("headers", "hold"),
    [
        (("retry-after: 7",), 7.0),
        (("retry-after-ms: 1500", "retry-after: 2"), 1.5),
        (("retry-after: DATE",), 5.0),
        (("x-ratelimit-remaining-requests: 0", "x-ratelimit-reset-requests: 6m0s"), 360.0),
        (("x-ratelimit-remaining-tokens: 0", "x-ratelimit-reset-tokens: 20ms"), 0.02),
        ((), HOLD_FIRST_S),
    ],
    ids=[
        "retry-after",
        "retry-after-ms",
        "retry-after-date",
        "reset-requests",
        "reset-tokens",
        "bare",
    ],
)
async def test_a_429_holds_the_call_as_its_headers_say_and_costs_no_attempt(
    autojump_clock: trio.testing.MockClock,
    monkeypatch: pytest.MonkeyPatch,
    headers: tuple[str, ...],
    hold: float,
) -> None:
    wall = 1_700_000_000.0
    monkeypatch.setattr(client_module, "time", SimpleNamespace(time=lambda: wall))
    date = email.utils.formatdate(wall + 5, usegmt=True)
    headers = tuple(header.replace("DATE", date) for header in headers)
    rig = Rig(Script(too_many(*headers), valid()))
    start = trio.current_time()
    with trio.fail_after(BOUND):
        result = await rig.compare()
    assert result.selected == Verdict(4, 2, 1)
    assert result.attempts == 1
    assert rig.script.times == [start, start + hold]
    assert rig.metric("genrm_trio_judge_rate_limited_total") == 1
    assert rig.metric("genrm_trio_judge_retries_total", cause="http") == 0
    assert rig.metric("genrm_trio_judge_throttled_seconds_total") == pytest.approx(hold)
    assert rig.metric("genrm_trio_judge_throttled") == 0
    rig.assert_idle()


async def test_a_bare_429_storm_backs_off_exponentially_one_call_at_a_time_and_masks_nothing(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # four comparisons at once: the first wave is four 429s (one hold of 1 s, not four); then
    # one call tries each time a hold ends, 1, 2, 4, 8 s apart; its answer lets the rest go
    rig = Rig(Script(*[too_many()] * 7, *[valid()] * 4))
    start = trio.current_time()
    results = []

    async def one() -> None:
        results.append(await rig.compare())

    with trio.fail_after(BOUND):
        async with trio.open_nursery() as nursery:
            for _ in range(4):
                nursery.start_soon(one)
    times = [t - start for t in rig.script.times]
    assert times == [0.0] * 4 + [1.0, 3.0, 7.0, 15.0, 15.0, 15.0, 15.0]
    assert [r.attempts for r in results] == [1, 1, 1, 1]
    assert rig.metric("genrm_trio_judge_rate_limited_total") == 7
    assert rig.metric("genrm_trio_judge_retries_total", cause="http") == 0
    stats = rig.comparator.statistics()
    assert (stats.rate_limited, stats.throttled, stats.calls, stats.retries) == (7, 0, 11, 0)
    # waits: the first call's 15 s and three waits of 15 s
    assert rig.metric("genrm_trio_judge_throttled_seconds_total") == 4 * 15.0
    rig.assert_idle()


async def test_the_bare_429_back_off_is_capped(autojump_clock: trio.testing.MockClock) -> None:
    rig = Rig(Script(*[too_many()] * 9, valid()))
    start = trio.current_time()
    with trio.fail_after(BOUND):
        assert (await rig.compare()).attempts == 1
    gaps = [b - a for a, b in zip(rig.script.times, rig.script.times[1:], strict=False)]
    assert gaps == [1.0, 2.0, 4.0, 8.0, 16.0, HOLD_MAX_S, HOLD_MAX_S, HOLD_MAX_S, HOLD_MAX_S]
    assert rig.script.times[0] == start


async def test_a_hold_past_the_deadline_fails_the_comparison_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    rig = Rig(Script(too_many("retry-after: 100"), valid()))
    start = trio.current_time()
    with trio.fail_after(30.0):  # the group's deadline
        error = await rig.fail()
    assert trio.current_time() == start
    assert rig.script.calls == 1
    assert error.attempts == 0
    assert error.message == (
        "GenRM judge judge.test:8000 /v1/responses pair=(0, 1): the judge's rate limit holds "
        "its calls for 100s (after a 429), past the deadline in 30s"
    )
    rig.assert_idle()


async def test_a_hold_leaves_room_for_the_replicas_round_trip(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # every call is answered 1 s after it is sent, with a 429 holding 2 s. The group's deadline
    # is at 10. Calls go at 0, 3 and 6; at 7 the hold ends at 9, and the call sent then would
    # be answered at 10, the deadline, which would end the group rather than the pair: the
    # comparison fails at 7. (Before, that call went at 9 and the deadline came first.)
    async def slow_429(request: object) -> Reply:
        await trio.sleep(1.0)
        return too_many("retry-after: 2")

    rig = Rig(Script(slow_429), judge_request_timeout_s=30.0)
    start = trio.current_time()
    with trio.fail_after(10.0):  # the group's deadline
        error = await rig.fail()
    assert trio.current_time() - start == 7.0
    assert [t - start for t in rig.script.times] == [0.0, 3.0, 6.0]
    assert error.message == (
        "GenRM judge judge.test:8000 /v1/responses pair=(0, 1): the judge's rate limit holds "
        "its calls for 2s (after a 429) and an answer takes 1s, past the deadline in 3s"
    )
    rig.assert_idle()


async def test_a_waiting_comparison_whose_deadline_a_new_hold_outlasts_fails_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # first: a 429 holding the judge for 5 s; second arrives at 1 with a 20 s deadline and
    # waits; at 5 the first's call gets a 429 holding 50 s: the second fails then, not at 21
    rig = Rig(Script(too_many("retry-after: 5"), too_many("retry-after: 50"), valid()))
    start = trio.current_time()
    ended: dict[str, float] = {}

    async def first() -> None:
        await rig.compare()
        ended["first"] = trio.current_time() - start

    async def second() -> None:
        await trio.sleep(1.0)
        with trio.fail_after(20.0):
            error = await rig.fail()
        ended["second"] = trio.current_time() - start
        assert "holds its calls for 50s (after a 429), past the deadline in 16s" in error.message

    with trio.fail_after(BOUND):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(first)
            nursery.start_soon(second)
    assert ended == {"second": 5.0, "first": 55.0}
    assert [t - start for t in rig.script.times] == [0.0, 5.0, 55.0]


# --- configured limits pace the calls exactly ----------------------------------------------


async def _concurrently(rig: Rig, n: int) -> list[int]:
    attempts: list[int] = []

    async def one() -> None:
        attempts.append((await rig.compare()).attempts)

    async with trio.open_nursery() as nursery:
        for _ in range(n):
            nursery.start_soon(one)
    return attempts


async def test_configured_requests_per_minute_pace_the_calls_exactly(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # 2 a minute: a bucket of 2, one more each 30 s
    rig = Rig(Script(*[valid()] * 5), judge={"requests_per_minute": 2})
    start = trio.current_time()
    with trio.fail_after(BOUND):
        assert await _concurrently(rig, 5) == [1] * 5
    assert [t - start for t in rig.script.times] == [0.0, 0.0, 30.0, 60.0, 90.0]
    assert rig.metric("genrm_trio_judge_throttled_seconds_total") == 30.0 + 60.0 + 90.0
    assert rig.metric("genrm_trio_judge_rate_limited_total") == 0
    rig.assert_idle()


async def test_configured_tokens_per_minute_charge_the_prompt_estimate_and_the_budget(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # CALL's prompt is 17 characters: 5 tokens at 4 a token, plus a budget of 55: 60 a call;
    # 120 a minute: two at once, then one each 30 s
    rig = Rig(
        Script(*[valid()] * 4),
        judge={"tokens_per_minute": 120},
        genrm_responses_create_params={"input": [], "max_output_tokens": 55},
    )
    assert rig.comparator.limits.estimate(CALL) == 60
    start = trio.current_time()
    with trio.fail_after(BOUND):
        assert await _concurrently(rig, 4) == [1] * 4
    assert [t - start for t in rig.script.times] == [0.0, 0.0, 30.0, 60.0]


async def test_the_prompt_estimate_is_corrected_from_the_replies_usage(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # the judge says the 17-character prompt took 17 tokens: the ratio moves a fifth of the way
    # from 0.25 to 1.0 (0.4): 7 tokens, plus the budget
    usage = {"input_tokens": 17, "output_tokens": 5}
    rig = Rig(
        Script(reply(usage=usage)),
        judge={"tokens_per_minute": 1000},
        genrm_responses_create_params={"input": [], "max_output_tokens": 55},
    )
    with trio.fail_after(BOUND):
        await rig.compare()
    assert rig.comparator.limits.estimate(CALL) == 7 + 55
    assert rig.comparator.limits.statistics().tokens_per_char == pytest.approx(0.4)


async def test_prices_give_the_cost_of_the_reported_usage(
    autojump_clock: trio.testing.MockClock,
) -> None:
    usage = {"input_tokens": 1000, "output_tokens": 500}
    rig = Rig(
        Script(reply(usage=usage), reply(usage=usage)),
        judge={"price_per_million_input_tokens": 2.0, "price_per_million_output_tokens": 8.0},
    )
    with trio.fail_after(BOUND):
        await rig.compare()
        await rig.compare()
    # 2 x (1000 x 2 + 500 x 8) / 1e6
    assert rig.metric("genrm_trio_judge_cost_total") == pytest.approx(0.012)
    assert rig.comparator.limits.statistics().cost == pytest.approx(0.012)


# --- without configuration: the replies' headers pace the calls ---------------------------------


def _sim_comparator(limits: SimRateLimits, **judge: Any) -> tuple[Comparator, Metrics, Any]:
    app = sim_asgi_app(SimConfig(rate_limits=limits))
    config = settings_from_mapping(
        {
            "judge": {"base_url": "http://judge.test:8000/v1", "api": "genrm_model", **judge},
            "judge_request_timeout_s": 5.0,
            "genrm_parse_retries": 1,
        }
    )
    fleet = make_judge(config, backend=MemoryNetwork(serve_asgi(app)))
    metrics = Metrics()
    return Comparator(fleet, config, metrics), metrics, app


async def test_unconfigured_the_x_ratelimit_headers_pace_the_calls_without_a_429(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # a hosted judge of 6 requests a minute (a bucket of 6, one more each 10 s): the first reply
    # says 5 are left and the budget is full again in 10 s; the next five go at once, then one
    # each 10 s, and the judge never answers 429
    comparator, metrics, app = _sim_comparator(SimRateLimits(requests_per_minute=6))
    start = trio.current_time()
    with trio.fail_after(BOUND):
        await comparator.compare(CALL, pair=PAIR, judge_pass=0)
        async with trio.open_nursery() as nursery:
            for _ in range(11):
                nursery.start_soon(partial_compare, comparator)
    starts = [call.started_at - start for call in app.sim.calls]
    assert starts == [0.0] * 6 + [10.0, 20.0, 30.0, 40.0, 50.0, 60.0]
    assert app.sim.statistics().rate_limited == 0
    assert metrics.registry.get_sample_value("genrm_trio_judge_rate_limited_total") == 0


async def partial_compare(comparator: Comparator) -> None:
    result = await comparator.compare(CALL, pair=PAIR, judge_pass=0)
    assert result.attempts == 1


async def test_throttled_is_serving_a_bare_429_storm_never_ejects_nor_says_unreachable(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    # 1 request a minute, bare 429s (no headers, no Retry-After), under a watched fleet
    comparator, metrics, app = _sim_comparator(
        SimRateLimits(requests_per_minute=1, headers=False, retry_after="none"),
        eject_after_failures=1,
        probe=False,  # the answer probe would spend the minute's one call
    )
    fleet: Any = comparator._fleet
    with caplog.at_level(logging.DEBUG, "genrm_trio"), trio.fail_after(BOUND):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(fleet.keep_watch)
            await trio.testing.wait_all_tasks_blocked()
            async with trio.open_nursery() as comparisons:
                for _ in range(3):
                    comparisons.start_soon(partial_compare, comparator)
                await trio.sleep(0.5)
                assert metrics.registry.get_sample_value("genrm_trio_judge_throttled") == 2
                assert comparator.statistics().throttled == 2
            assert fleet.unreachable_for() is None
            nursery.cancel_scope.cancel()
    (stats,) = fleet.replica_stats()
    assert (stats.ejections, stats.failures, stats.ejected) == (0, 0, False)
    limited = app.sim.statistics().rate_limited
    assert limited == metrics.registry.get_sample_value("genrm_trio_judge_rate_limited_total")
    assert stats.calls == 3 + limited
    assert not [r for r in caplog.records if "unreachable" in r.getMessage()]


# --- the simulated hosted judge ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("form", "said"),
    [
        ("seconds", [(b"retry-after", b"30")]),
        ("ms", [(b"retry-after-ms", b"30000")]),
        ("reset", []),
        ("none", []),
    ],
)
async def test_the_sim_judge_enforces_its_limits_as_a_hosted_api_does(
    autojump_clock: trio.testing.MockClock, form: Any, said: list[tuple[bytes, bytes]]
) -> None:
    limiter = SimLimiter(
        SimRateLimits(requests_per_minute=2, tokens_per_minute=600, retry_after=form)
    )
    assert limiter.admit(100) == (
        True,
        [
            (b"x-ratelimit-limit-requests", b"2"),
            (b"x-ratelimit-remaining-requests", b"1"),
            (b"x-ratelimit-reset-requests", b"30s"),
            (b"x-ratelimit-limit-tokens", b"600"),
            (b"x-ratelimit-remaining-tokens", b"500"),
            (b"x-ratelimit-reset-tokens", b"10s"),
        ],
    )
    assert limiter.admit(100)[0] is True
    served, headers = limiter.admit(100)
    assert served is False
    assert headers[1] == (b"x-ratelimit-remaining-requests", b"0")
    assert headers[2] == (b"x-ratelimit-reset-requests", b"1m0s")
    assert headers[6:] == said
    assert (limiter.admitted, limiter.refused) == (2, 1)
    await trio.sleep(30.0)
    assert limiter.admit(100)[0] is True


async def test_the_sim_judges_http_date_retry_after(autojump_clock: trio.testing.MockClock) -> None:
    limiter = SimLimiter(SimRateLimits(requests_per_minute=1, retry_after="date"))
    limiter.admit(1)
    served, headers = limiter.admit(1)
    assert served is False
    name, value = headers[-1]
    assert name == b"retry-after"
    when = email.utils.parsedate_to_datetime(value.decode()).timestamp()
    assert 59.0 <= when - time.time() <= 61.0
    with pytest.raises(ValueError, match="retry_after must be one of"):
        SimRateLimits(retry_after="later")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="requests_per_minute must be an integer >= 1"):
        SimRateLimits(requests_per_minute=0)
