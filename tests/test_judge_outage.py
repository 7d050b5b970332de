"""A judge restart costs nothing (docs/reliability.md, "A judge restart"), in virtual time: while
no judge replica can be reached, comparisons wait for one probe loop per replica to find it back
instead of spending attempts; calls that reach no server are no attempts; the wait is bounded by
the group deadline, past which the failure says how long the judge was unreachable; `/readyz`,
the log lines and the metrics say so while it lasts. A single judge is a fleet of one replica."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field

import pytest
import trio
import trio.lowlevel
import trio.testing
from fake_replicas import NamedReplica, fleet_entries
from judges import default_verdict, member, verdict_text, verify
from settings_keys import accepted_values

from genrm_trio.config import Settings
from genrm_trio.domain.model import GroupFailed, Scored
from genrm_trio.engine.engine import Engine, open_engine
from genrm_trio.judge.base import (
    JudgeCall,
    JudgeHTTPError,
    JudgeReply,
    JudgeTransportError,
    ReplyStatus,
)
from genrm_trio.judge.fleet import JudgeFleet

N = 4


@dataclass
class Server(NamedReplica):
    """A fake judge server: `up` answers after `latency`, but 500 at once to a request whose
    first answer is "poison" (a failure the request causes on every replica); `down` refuses
    connections (the call never reaches it) and fails its probes. Records every call and
    probe."""

    name: str
    latency: float = 1.0
    up: bool = True
    failing: int | None = None  # answer every call at once with this HTTP status (probes: 200)
    calls: list[tuple[float, str]] = field(default_factory=list)  # (start, "ok" | "refused")
    probes: list[tuple[float, bool]] = field(default_factory=list)  # (when, answered)

    async def attempt(self, call: JudgeCall) -> JudgeReply:
        started = trio.current_time()
        await trio.lowlevel.checkpoint()
        if not self.up:
            self.calls.append((started, "refused"))
            raise JudgeTransportError(
                "ConnectError", "[Errno 111] Connection refused", reached=False
            )
        if call.response_1 == "poison":
            self.calls.append((started, "500"))
            raise JudgeHTTPError(500, b"template error")
        if self.failing is not None:
            self.calls.append((started, str(self.failing)))
            raise JudgeHTTPError(self.failing, b"failing")
        await trio.sleep(self.latency)
        self.calls.append((started, "ok"))
        return JudgeReply(
            ReplyStatus.COMPLETED,
            verdict_text(*default_verdict(call.response_1, call.response_2)),
            100,
            10,
        )

    async def probe(self) -> str | None:
        await trio.lowlevel.checkpoint()
        self.probes.append((trio.current_time(), self.up))
        return None if self.up else "ConnectError: [Errno 111] Connection refused"

    def outcomes(self) -> list[str]:
        return [outcome for _, outcome in self.calls]


def fleet(*servers: Server) -> JudgeFleet:
    return JudgeFleet(
        fleet_entries(*servers),
        eject_after_failures=3,
        eject_backoff_s=5.0,
        outage_probe_s=5.0,
    )


def config(**overrides: object) -> Settings:
    return Settings.model_validate(
        {
            "num_rollouts_per_prompt": N,
            "cohort_collection_timeout_s": 600.0,
            "cohort_evaluation_timeout_s": 300.0,
            "judge_request_timeout_s": 10.0,
            "genrm_parse_retries": 3,
            "genrm_parse_retry_sleep_s": 0.1,
            "eager_comparisons": False,  # every comparison starts at its group's last member
            **overrides,
        }
    )


async def group(engine: Engine, name: str, at: float, replies: dict[str, list[object]]) -> None:
    await trio.sleep_until(at)
    async with trio.open_nursery() as nursery:
        out: list[object] = [None] * N

        async def one(i: int) -> None:
            out[i] = await verify(engine, member(i, group=name))

        for i in range(N):
            nursery.start_soon(one, i)
    replies[name] = out


async def four_groups_never_unreachable(
    judge: JudgeFleet,
) -> tuple[Engine, dict[str, list[object]]]:
    """Groups g0 to g3 at 0, 5, 10 and 15 s under a watched engine, `/readyz`'s reason and the
    unreachable gauge sampled each second from 0 to 20: the judge is never unreachable (no
    reason, a gauge of 0, every second); the closed engine and the replies by group."""
    replies: dict[str, list[object]] = {}
    readiness: list[tuple[str | None, float | None]] = []

    async def watch(engine: Engine) -> None:
        for t in range(21):
            await trio.sleep_until(float(t))
            readiness.append((engine.judge_unreachable(), sample(engine, GAUGE)))

    async with open_engine(config(), judge) as engine, trio.open_nursery() as nursery:
        nursery.start_soon(watch, engine)
        for g, at in enumerate((0.0, 5.0, 10.0, 15.0)):
            nursery.start_soon(group, engine, f"g{g}", at, replies)
    assert readiness == [(None, 0.0)] * 21
    return engine, replies


def sample(engine: Engine, name: str) -> float | None:
    return engine.metrics.registry.get_sample_value(name)


def sample_labelled(engine: Engine, name: str, **labels: str) -> float | None:
    return engine.metrics.registry.get_sample_value(name, labels)


def masked(engine: Engine) -> float:
    """Every masked rollout, whatever its cause."""
    registry = engine.metrics.registry
    return sum(
        registry.get_sample_value("genrm_trio_masked_rollouts_total", {"cause": cause}) or 0.0
        for cause in ("alone", "whole_group")
    )


# Probes of a replica that cannot be reached: 0.5 s after it went, then 1, 2, 4, 5, 5, ... apart.
PROBES_FROM_3 = [3.5, 4.5, 6.5, 10.5, 15.5, 20.5, 25.5, 30.5, 35.5]


async def test_a_single_judge_down_for_30s_masks_nothing_and_costs_no_attempt(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="genrm_trio.judge")
    server = Server("a", latency=1.0)
    judge = fleet(server)  # one URL: a fleet of one replica
    replies: dict[str, list[object]] = {}
    seen: dict[str, object] = {}

    async def outage(engine: Engine) -> None:
        await trio.sleep_until(2.0)
        server.up = False  # killed: connections refused
        await trio.sleep_until(20.0)
        seen["readyz"] = engine.judge_unreachable()
        seen["gauge"] = sample(engine, "genrm_trio_judge_unreachable")
        seen["seconds"] = sample(engine, "genrm_trio_judge_unreachable_seconds_total")
        seen["retries"] = sum(
            engine.metrics.registry.get_sample_value("genrm_trio_judge_retries_total", {"cause": c})
            or 0.0
            for c in ("transport", "http", "timeout")
        )
        await trio.sleep_until(33.0)
        server.up = True  # restarted, 31 s later

    with trio.fail_after(3600):
        async with open_engine(config(), judge) as engine, trio.open_nursery() as nursery:
            nursery.start_soon(outage, engine)
            nursery.start_soon(group, engine, "g0", 0.0, replies)  # before the kill
            nursery.start_soon(group, engine, "g1", 3.0, replies)  # during it
            nursery.start_soon(group, engine, "g2", 20.0, replies)  # during it
        finished = trio.current_time()
        metrics = {
            name: sample(engine, name)
            for name in (
                "genrm_trio_judge_unreachable",
                "genrm_trio_judge_unreachable_seconds_total",
            )
        }
        metrics["masked"] = masked(engine)
        unreached = engine.statistics().judge.unreached
        calls = engine.statistics().judge.calls
        outcomes = {
            outcome: sample_labelled(engine, "genrm_trio_judge_calls_total", outcome=outcome)
            for outcome in ("completed", "transport_error")
        }
    assert all(isinstance(r, Scored) for rows in replies.values() for r in rows), replies
    # g0: 4 answers; g1: 4 calls refused at t = 3 (not attempts), then, like g2's 4, sent when
    # the probe at 35.5 finds the judge back; all answered at 36.5.
    assert server.calls == ([(0.0, "ok")] * 4 + [(3.0, "refused")] * 4 + [(35.5, "ok")] * 8), (
        server.calls
    )
    assert server.probes == [(t, t > 33.0) for t in PROBES_FROM_3]
    assert finished == 36.5
    assert seen == {
        "readyz": "judge unreachable for 17s: no judge replica can be reached",
        "gauge": 1.0,
        "seconds": 17.0,
        "retries": 0.0,  # no attempt was spent on the outage
    }
    assert metrics == {
        "genrm_trio_judge_unreachable": 0.0,
        "genrm_trio_judge_unreachable_seconds_total": 32.5,
        "masked": 0.0,
    }
    # A refused call is no attempt (issue 36 item 9): /judge/replicas counts the 12 attempts
    # (one per comparison) and no failure; it counted 16 calls and 4 failures before.
    stats = judge.replica_stats()[0]
    assert (stats.ejected, stats.calls, stats.failures) == (False, 12, 0)
    assert unreached == 4  # g1's refused calls, none of them an attempt
    # and neither the comparator's calls nor judge_calls_total count them (they counted 16 calls
    # and 4 transport errors before)
    assert calls == 12
    assert outcomes == {"completed": 12.0, "transport_error": 0.0}
    lines = [(r.levelname, r.getMessage()) for r in caplog.records if "judge" in r.getMessage()]
    outage_lines = [line for line in lines if "unreachable" in line[1]]
    assert outage_lines == [
        (
            "WARNING",
            "judge unreachable: no replica can be reached (a:8000: ConnectError: [Errno 111] "
            "Connection refused); comparisons wait for it within their deadlines; probing GET "
            "/models",
        ),
        ("INFO", "judge is back after 32.5s unreachable (replica a:8000 answered a probe)"),
    ]


async def test_every_replica_of_a_fleet_down_then_one_back_first(
    autojump_clock: trio.testing.MockClock,
) -> None:
    a, b = Server("a", latency=1.0), Server("b", latency=1.0)
    judge = fleet(a, b)
    replies: dict[str, list[object]] = {}

    async def outage() -> None:
        await trio.sleep_until(2.0)
        a.up = b.up = False
        await trio.sleep_until(12.0)
        b.up = True  # b restarts first; a only at 40

        await trio.sleep_until(40.0)
        a.up = True

    with trio.fail_after(3600):
        async with open_engine(config(), judge) as engine, trio.open_nursery() as nursery:
            nursery.start_soon(outage)
            nursery.start_soon(group, engine, "g0", 0.0, replies)
            nursery.start_soon(group, engine, "g1", 3.0, replies)
            nursery.start_soon(group, engine, "g2", 41.0, replies)
        seconds = sample(engine, "genrm_trio_judge_unreachable_seconds_total")
    assert all(isinstance(r, Scored) for rows in replies.values() for r in rows), replies
    # At t = 3 g1's 4 calls go two to each replica and are refused (no attempts): each
    # replica is out at its first refusal, and with both out the fleet is down; a call that
    # then gets its slot is not sent. Both are probed at 3.5, 4.5, 6.5, 10.5, 15.5: b answers
    # at 15.5 and takes g1's 4 comparisons (one of them first tries a, due its trial since
    # 8.0: refused, free). a keeps its probe loop (it is out as unreachable) until it answers
    # at 40.5, and shares g2.
    assert (
        a.calls
        == [(0.0, "ok")] * 2 + [(3.0, "refused")] * 2 + [(15.5, "refused")] + [(41.0, "ok")] * 2
    )
    assert (
        b.calls
        == [(0.0, "ok")] * 2 + [(3.0, "refused")] * 2 + [(15.5, "ok")] * 4 + [(41.0, "ok")] * 2
    )
    assert [t for t, ok in b.probes] == [3.5, 4.5, 6.5, 10.5, 15.5]
    assert [t for t, ok in a.probes] == [3.5, 4.5, 6.5, 10.5, 15.5, 20.5, 25.5, 30.5, 35.5, 40.5]
    assert seconds == 12.5  # from 3.0 to 15.5; a alone out is no outage of the judge
    assert [s.ejected for s in judge.replica_stats()] == [False, False]


@pytest.mark.parametrize("policy", accepted_values("evaluation_deadline_policy"))
async def test_past_the_group_deadline_the_failure_says_how_long_the_judge_was_unreachable(
    autojump_clock: trio.testing.MockClock, policy: str
) -> None:
    server = Server("a", latency=1.0, up=False)
    judge = fleet(server)
    replies: dict[str, list[object]] = {}
    settings = config(cohort_evaluation_timeout_s=10.0, evaluation_deadline_policy=policy)
    with trio.fail_after(3600):
        async with open_engine(settings, judge) as engine:
            await group(engine, "g0", 0.0, replies)
            assert trio.current_time() == 10.0
    # each comparison's call refused at 0 (no attempt), then waited until the deadline
    assert server.outcomes() == ["refused"] * 4
    rows = replies["g0"]
    if policy == "fail_group":
        failure = GroupFailed(
            "judge",
            "GenRM cohort evaluation deadline exceeded after 10.0s (judge unreachable for 10s)",
        )
        assert rows == [failure] * N
    else:
        # every comparison cancelled, every member masked: the group fails with that reason
        failure = GroupFailed(
            "judge",
            "GenRM masked every rollout of the group after judge failures (4 of 4 comparisons "
            "failed): GenRM comparison (0, 1) (judge 0) was still running at the group deadline "
            "(10.0s) and was cancelled (judge unreachable for 10s)",
        )
        assert rows == [failure] * N


async def test_a_compare_call_past_its_deadline_says_the_judge_was_unreachable(
    autojump_clock: trio.testing.MockClock,
) -> None:
    from judges import compare_input

    from genrm_trio.domain.model import CompareFailed

    server = Server("a", up=False)
    with trio.fail_after(3600):
        async with open_engine(config(cohort_evaluation_timeout_s=10.0), fleet(server)) as engine:
            with pytest.raises(CompareFailed) as info:
                await engine.compare(compare_input(["one", "two", "three"]))
            assert trio.current_time() == 10.0
    assert (
        str(info.value) == "GenRM compare deadline exceeded after 10.0s (judge unreachable for 10s)"
    )
    assert server.outcomes() == ["refused"] * 3  # its 3 comparisons: one refused call each


async def test_an_unwatched_fleet_spends_attempts_as_before(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Without its probe loops (no engine runs `keep_watch`) a fleet makes nobody wait: the
    comparison spends its attempts on the refusals, 0.1 s apart."""
    from genrm_trio.judge.attempts import Comparator
    from genrm_trio.judge.base import JudgeError
    from genrm_trio.metrics import Metrics

    server = Server("a", up=False)
    judge = fleet(server)
    comparator = Comparator(judge, config(), Metrics())
    with pytest.raises(JudgeError) as info:
        await comparator.compare(
            JudgeCall([{"role": "user", "content": "q"}], "x", "y", None), pair=(0, 1), judge_pass=0
        )
    assert info.value.attempts == 4
    assert [t for t, _ in server.calls] == pytest.approx([0.0, 0.1, 0.2, 0.3])
    assert server.probes == []


async def test_a_500_after_a_call_sent_again_is_still_the_requests_fault(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A request that gets a 500 from every replica, while one replica is down: its retry,
    refused by the down one (never sent: no attempt), is sent again, and that resend still
    links to the attempt before it, so a 500 on two replicas in a row is the request's fault
    and counts against neither (docs/operations.md, "A fleet of judges")."""
    from genrm_trio.judge.attempts import Comparator
    from genrm_trio.judge.base import JudgeError
    from genrm_trio.metrics import Metrics

    a, b, c = Server("a"), Server("b", up=False), Server("c")
    judge = fleet(a, b, c)
    comparator = Comparator(judge, config(), Metrics())
    call = JudgeCall([{"role": "user", "content": "q"}], "poison", "y", None)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(judge.keep_watch)
        with pytest.raises(JudgeError) as info:
            await comparator.compare(call, pair=(0, 1), judge_pass=0)
        nursery.cancel_scope.cancel()
    assert info.value.attempts == 4
    # a, then b (refused: sent again at once, to c), then a and c, 0.1 s apart
    assert a.calls == [(0.0, "500"), (0.2, "500")]
    assert b.calls == [(0.1, "refused")]
    assert [t for t, _ in c.calls] == pytest.approx([0.1, 0.3])
    assert c.outcomes() == ["500", "500"]
    # c's first 500 follows a's, across the resend: a's is taken back and none counts
    stats = judge.replica_stats()
    assert [(s.failures, s.consecutive_failures, s.ejected) for s in stats] == [
        (2, 0, False),
        (0, 1, True),  # b: out until a probe reaches it; its refusal was no attempt
        (2, 0, False),
    ]


# --- failing is not unreachable; down is down from the start (issue 37 item 3) ------------------


@pytest.mark.parametrize("status", [500])
async def test_a_judge_that_fails_every_call_is_failing_not_unreachable(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture, status: int
) -> None:
    """Every call answered 500, `GET /models` 200, under a watched engine: the
    replica is ejected and keeps the trial back-off, but it can be reached, so there is no
    outage: no "unreachable" line, no probe, `/readyz` keeps its 200 and the gauge its 0, and
    comparisons spend their attempts 0.1 s apart (no wait for a probe). Before, each ejection
    started an outage (38 cycles in 20 s)."""
    caplog.set_level(logging.INFO, logger="genrm_trio.judge")
    server = Server("a", failing=status)
    judge = fleet(server)
    engine, replies = await four_groups_never_unreachable(judge)
    stats = engine.statistics().judge
    assert judge.unreachable_seconds() == 0.0
    assert server.probes == []
    assert not [r for r in caplog.records if "unreachable" in r.getMessage()]
    assert all(isinstance(r, GroupFailed) for rows in replies.values() for r in rows), replies
    # each comparison spent its 4 attempts, 0.1 s apart from its group's start
    assert stats.calls == 4 * stats.failures == len(server.calls)
    assert sorted({round(t % 5.0, 6) for t, _ in server.calls}) == [0.0, 0.1, 0.2, 0.3]
    [replica] = judge.replica_stats()
    assert replica.ejections >= 1 and replica.failures == len(server.calls)


async def test_a_bare_429_storm_is_throttled_serving_never_ejected_nor_unreachable(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    """Every call answered a bare 429 (no Retry-After, no x-ratelimit-* headers) under a watched
    engine: each holds the replica for a doubling back-off (judge/limits.py), one call tries
    when a hold ends, and a comparison whose next hold would end past its group's deadline fails
    then with that reason. Throttled is serving: the replica is never ejected and nothing counts
    as a failure, no "unreachable" line, no probe, `/readyz` keeps its 200 and the gauge its 0."""
    caplog.set_level(logging.INFO, logger="genrm_trio.judge")
    server = Server("a", failing=429)
    judge = fleet(server)
    engine, replies = await four_groups_never_unreachable(judge)
    limited = "genrm_trio_judge_rate_limited_total"
    assert judge.unreachable_seconds() == 0.0
    assert server.probes == []
    assert not [r for r in caplog.records if "unreachable" in r.getMessage()]
    for rows in replies.values():
        for row in rows:
            assert isinstance(row, GroupFailed), row
            assert "the judge's rate limit holds its calls for" in row.message, row
    [replica] = judge.replica_stats()
    assert (replica.ejections, replica.failures, replica.ejected) == (0, 0, False)
    assert sample(engine, limited) == len(server.calls) == engine.statistics().judge.calls
    # the first wave at 0 is one hold of 1 s; then one call at 1, 3, 7, 15: holds 1, 2, 4, 8, 16
    # g0's four comparisons at 0 are one hold of 1 s; then one call each time a hold ends, the
    # back-off doubling to its 32 s cap; at 287 the next hold (to 319) would end past every
    # group's deadline (300 to 315): all sixteen comparisons fail then, with the reason
    trials = [1.0, 3.0, 7.0, 15.0, 31.0, *(63.0 + 32.0 * k for k in range(8))]
    assert sorted(t for t, _ in server.calls) == [0.0] * 4 + trials
    assert trials[-1] == 287.0


GAUGE = "genrm_trio_judge_unreachable"


async def test_a_judge_down_at_start_is_an_outage_from_the_first_second(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    """The start-up probe could not connect (`down_from_start`, what `serve` calls with the
    probe's report): from t = 0 `/readyz` answers 503, the gauge is 1 and the probe loop runs;
    a group at t = 1 waits without a call until the probe at 7.5 finds the judge (up at 4)."""
    caplog.set_level(logging.INFO, logger="genrm_trio.judge")
    server = Server("a", up=False)
    judge = fleet(server)
    judge.down_from_start([server.url], "its start-up probe could not connect")
    replies: dict[str, list[object]] = {}
    seen: dict[str, object] = {}

    async def restart(engine: Engine) -> None:
        await trio.lowlevel.checkpoint()
        seen["readyz"] = engine.judge_unreachable()
        seen["gauge"] = sample(engine, GAUGE)
        await trio.sleep_until(4.0)
        server.up = True

    async with open_engine(config(), judge) as engine, trio.open_nursery() as nursery:
        nursery.start_soon(restart, engine)
        nursery.start_soon(group, engine, "g0", 1.0, replies)
    assert seen == {
        "readyz": "judge unreachable for 0s: no judge replica can be reached",
        "gauge": 1.0,
    }
    assert server.probes == [(0.5, False), (1.5, False), (3.5, False), (7.5, True)]
    assert {t for t, _ in server.calls} == {7.5} and set(server.outcomes()) == {"ok"}
    assert all(isinstance(r, Scored) for r in replies["g0"]), replies
    assert judge.unreachable_seconds() == 7.5
    lines = [r.getMessage() for r in caplog.records if "unreachable" in r.getMessage()]
    assert lines == [
        "judge unreachable: no replica can be reached (a:8000: its start-up probe could not "
        "connect); comparisons wait for it within their deadlines; probing GET /models",
        "judge is back after 7.5s unreachable (replica a:8000 answered a probe)",
    ]


# --- a fleet shared by two engines (issue 36 item 2) ---------------------------------------------


async def test_a_shared_fleet_stays_watched_when_the_engine_watching_it_closes(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Engines A (opened first: its nursery runs the probe loops) and B share a fleet; A closes
    at 1. The judge goes down at 2: B's group at 3 waits for the probe loops, now in B's
    nursery, which find the judge back (up at 6) at 6.5; nothing is spent. Before, A kept the
    watch and its end left the fleet unwatched: B's calls were spent as attempts."""
    server = Server("a")
    judge = fleet(server)
    replies: dict[str, list[object]] = {}

    async def engine_a(closed: trio.Event) -> None:
        async with open_engine(config(), judge):
            await trio.sleep_until(1.0)
        closed.set()

    async def outage() -> None:
        await trio.sleep_until(2.0)
        server.up = False
        await trio.sleep_until(6.0)
        server.up = True

    closed = trio.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(engine_a, closed)
        await trio.lowlevel.checkpoint()
        async with open_engine(config(), judge) as b:
            await closed.wait()
            assert judge.watched
            nursery.start_soon(outage)
            await group(b, "g", 3.0, replies)
    assert all(isinstance(r, Scored) for r in replies["g"]), replies
    assert [t for t, _ in server.probes] == [3.5, 4.5, 6.5]
    assert [t for t, outcome in server.calls if outcome == "refused"] == [3.0] * 4
    assert {t for t, outcome in server.calls if outcome == "ok"} == {6.5}
    assert not judge.watched


async def test_waiters_are_woken_when_the_last_watch_ends(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """While the judge is down a call waits in `wait_reachable`; when the last watcher ends (at
    5, the judge still down) the wait ends at once: unwatched, calls go out instead."""
    server = Server("a", up=False)
    judge = fleet(server)
    woken: list[float] = []

    async def waiter() -> None:
        await judge.wait_reachable()
        woken.append(trio.current_time())

    async with trio.open_nursery() as nursery:
        watch = trio.CancelScope()

        async def keep_watch() -> None:
            with watch:
                await judge.keep_watch()

        nursery.start_soon(keep_watch)
        await trio.lowlevel.checkpoint()
        with pytest.raises(JudgeTransportError):
            await judge.attempt(JudgeCall([], "x", "y", None))
        assert judge.unreachable_for() == 0.0
        nursery.start_soon(waiter)
        await trio.sleep_until(5.0)
        assert woken == []
        watch.cancel()
    assert woken == [5.0]
    assert judge.unreachable_for() == 5.0  # still down: the wait ended with the watch


async def test_an_engine_that_closes_stops_listening_to_the_fleets_capacity(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Each engine's judge queue listens to the fleet's capacity while the engine is open, and
    no longer after (so the fleet holds no closed queue, nor its metrics)."""
    judge = fleet(Server("a"))
    async with open_engine(config(), judge):
        async with open_engine(config(), judge):
            assert len(judge._capacity_watchers) == 2
        assert len(judge._capacity_watchers) == 1
    assert judge._capacity_watchers == []
    told: list[int] = []
    stop = judge.watch_capacity(lambda: told.append(1))
    stop()
    stop()  # idempotent
    assert judge._capacity_watchers == []


class SlowToClose(NamedReplica):
    def __init__(self, name: str, close_s: float) -> None:
        self.name = name
        self.close_s = close_s
        self.closing: list[float] = []

    async def attempt(self, call: JudgeCall) -> JudgeReply:
        raise AssertionError("not called")

    async def aclose(self) -> None:
        self.closing.append(trio.current_time())
        await trio.sleep(self.close_s)


@pytest.mark.parametrize(("close_s", "took"), [(0.6, 0.6), (math.inf, 1.0)])
async def test_aclose_closes_every_replica_at_once_within_one_second(
    autojump_clock: trio.testing.MockClock, close_s: float, took: float
) -> None:
    """Three replicas each taking `close_s` to close: all start at once and the fleet is closed
    after `close_s`, or after 1 s in all when they never finish (before: one shielded second
    each, one after another: 1.8 s or 3 s)."""
    replicas = [SlowToClose(name, close_s) for name in ("a", "b", "c")]
    judge = JudgeFleet(fleet_entries(*replicas))
    await judge.aclose()
    assert trio.current_time() == took
    assert [r.closing for r in replicas] == [[0.0]] * 3
    await judge.aclose()  # idempotent
    assert [r.closing for r in replicas] == [[0.0]] * 3
