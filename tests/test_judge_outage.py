"""A judge restart costs nothing (docs/reliability.md, "A judge restart"), in virtual time: while
no judge replica can be reached, comparisons wait for one probe loop per replica to find it back
instead of spending attempts; calls that reach no server are no attempts; the wait is bounded by
the group deadline, past which the failure says how long the judge was unreachable; `/readyz`,
the log lines and the metrics say so while it lasts. A single judge is a fleet of one replica."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import pytest
import trio
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


def sample(engine: Engine, name: str) -> float | None:
    return engine.metrics.registry.get_sample_value(name)


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
