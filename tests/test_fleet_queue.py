"""The judge queue and a fleet with `judge.max_concurrency_per_replica` together, in virtual time.

The queue's slots are `min(max_concurrency, cap x replicas)`. While a replica is ejected, the
replicas in service take only `cap x` the rest: the queue then hands out only that many slots, so
that the calls it cannot place wait in the queue (by priority, before their attempt deadline
starts) and never inside the fleet (in no order, holding a slot, with the deadline running and,
once sent, charged to the replica they finally reached)."""

from __future__ import annotations

import pytest
import trio
import trio.lowlevel
import trio.testing
from fake_replicas import NamedReplica, fleet_entries
from judges import default_verdict, verdict_text

from genrm_trio.config import Settings
from genrm_trio.judge.attempts import Comparator
from genrm_trio.judge.base import (
    JudgeCall,
    JudgeReply,
    JudgeTransportError,
    ReplyStatus,
)
from genrm_trio.judge.fleet import JudgeFleet
from genrm_trio.judge.queue import QueueGroup, judge_queue
from genrm_trio.metrics import Metrics

CALL = JudgeCall([{"role": "user", "content": "q"}], "a1", "a2", None)


class Replica(NamedReplica):
    """A fake replica: answers after `latency`, or refuses at once when `refuses`."""

    def __init__(self, name: str, latency: float = 1.0, *, refuses: bool = False) -> None:
        self.name = name
        self.latency = latency
        self.refuses = refuses
        self.starts: list[float] = []

    async def attempt(self, call: JudgeCall) -> JudgeReply:
        self.starts.append(trio.current_time())
        await trio.lowlevel.checkpoint()
        if self.refuses:
            raise JudgeTransportError("ConnectError", "[Errno 111] Connection refused")
        await trio.sleep(self.latency)
        text = verdict_text(*default_verdict(call.response_1, call.response_2))
        return JudgeReply(ReplyStatus.COMPLETED, text, 100, 10)


def settings(*, cap: int, replicas: int, timeout_s: float) -> Settings:
    return Settings.model_validate(
        {
            "judge_request_timeout_s": timeout_s,
            "genrm_parse_retries": 3,
            "genrm_parse_retry_sleep_s": 0.1,
            "judge": {
                "base_url": [f"http://r{i}:8000/v1" for i in range(replicas)],
                "max_concurrency_per_replica": cap,
            },
        }
    )


def calls(metrics: Metrics, outcome: str) -> float:
    value = metrics.registry.get_sample_value("genrm_trio_judge_calls_total", {"outcome": outcome})
    return 0.0 if value is None else value


async def test_calls_an_ejected_replica_cannot_take_wait_in_the_queue_by_priority(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Two replicas, one call each at most: 2 slots. `a` refuses and is ejected (for 100 s), so
    only `b`'s one call can run. Two comparisons of a collecting group start at 0, then one of a
    complete group: `b` serves the first collecting one (0-1), then the complete one (1-2), then
    the second collecting one (2-3), each in one attempt within its 1.5 s deadline; `b` is never
    charged a timeout."""
    dead, healthy = Replica("a", refuses=True), Replica("b", latency=1.0)
    judge = JudgeFleet(
        fleet_entries(dead, healthy),
        max_in_flight_per_replica=1,
        eject_after_failures=1,
        eject_backoff_s=100.0,
    )
    metrics = Metrics()
    config = settings(cap=1, replicas=2, timeout_s=1.5)
    queue = judge_queue(judge, config, metrics)
    comparator = Comparator(judge, config, metrics, queue=queue)
    with pytest.raises(JudgeTransportError):
        await judge.attempt(CALL)  # round robin: a first; it refuses and is out
    assert [s.ejected for s in judge.replica_stats()] == [True, False]

    collecting, complete = queue.group(complete=False), queue.group(complete=True)
    done: dict[str, tuple[int, float]] = {}

    async def comparison(name: str, group: QueueGroup) -> None:
        ticket = queue.ticket(group)
        result = await comparator.compare(CALL, pair=(0, 1), judge_pass=0, ticket=ticket)
        done[name] = (result.attempts, trio.current_time())

    async with trio.open_nursery() as nursery:
        for name, group in (("x1", collecting), ("x2", collecting), ("c1", complete)):
            nursery.start_soon(comparison, name, group)
            await trio.testing.wait_all_tasks_blocked()
        stats = queue.statistics()
        assert (stats.in_use, stats.waiting_collecting, stats.waiting_complete) == (1, 1, 1)
    assert done == {"x1": (1, 1.0), "c1": (1, 2.0), "x2": (1, 3.0)}
    assert healthy.starts == [0.0, 1.0, 2.0]
    assert dead.starts == [0.0]
    _, b = judge.replica_stats()
    assert (b.calls, b.failures, b.last_error) == (3, 0, None)
    assert calls(metrics, "timeout") == 0
    assert calls(metrics, "completed") == 3


async def test_a_replica_back_in_service_gives_its_slots_back(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """`a` is ejected for 5 s: seven comparisons at 0 run one at a time on `b` until then. At 5
    `a`'s back-off is over: its trial is a slot of its own, so `a` (the trial) and `b` both get a
    call at 5; `a` answers and is back in service."""
    flaky, healthy = Replica("a", refuses=True), Replica("b", latency=1.0)
    judge = JudgeFleet(
        fleet_entries(flaky, healthy),
        max_in_flight_per_replica=1,
        eject_after_failures=1,
        eject_backoff_s=5.0,
    )
    config = settings(cap=1, replicas=2, timeout_s=10.0)
    queue = judge_queue(judge, config, Metrics())
    comparator = Comparator(judge, config, Metrics(), queue=queue)
    with pytest.raises(JudgeTransportError):
        await judge.attempt(CALL)
    flaky.refuses = False  # healed, but out until 5.0
    ends: list[float] = []

    async def comparison() -> None:
        await comparator.compare(CALL, pair=(0, 1), judge_pass=0)
        ends.append(trio.current_time())

    async with trio.open_nursery() as nursery:
        for _ in range(7):
            nursery.start_soon(comparison)
    # b alone until 5 (five calls: 0-1, ..., 4-5); at 5 a's trial and b side by side.
    assert healthy.starts == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    assert flaky.starts == [0.0, 5.0]
    assert sorted(ends) == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 6.0]
    assert [s.ejected for s in judge.replica_stats()] == [False, False]
    assert queue.statistics().in_use == 0


class Restarting(Replica):
    """A replica whose refusals never reach it (its port is closed), with a probe."""

    async def attempt(self, call: JudgeCall) -> JudgeReply:
        if self.refuses:
            self.starts.append(trio.current_time())
            await trio.lowlevel.checkpoint()
            raise JudgeTransportError("ConnectError", "Connection refused", reached=False)
        return await super().attempt(call)

    async def probe(self) -> str | None:
        await trio.lowlevel.checkpoint()
        return "ConnectError: Connection refused" if self.refuses else None


async def test_a_replica_back_from_its_probe_gets_a_waiting_call_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """One call at most per replica. `a` is down: the first comparison's call is refused (no
    attempt) and goes to `b` (0-10); the second waits in the queue, as `b` is full. `a` is
    restarted at 1 and its probe at 1.5 finds it: the fleet tells the queue, which hands the
    waiting call its slot at 1.5, not when `b` releases its own at 10."""
    down, busy = Restarting("a", latency=1.0, refuses=True), Replica("b", latency=10.0)
    judge = JudgeFleet(
        fleet_entries(down, busy),
        max_in_flight_per_replica=1,
        eject_backoff_s=100.0,
        outage_probe_s=5.0,
    )
    config = settings(cap=1, replicas=2, timeout_s=30.0)
    queue = judge_queue(judge, config, Metrics())
    comparator = Comparator(judge, config, Metrics(), queue=queue)
    ends: dict[str, float] = {}

    async def comparison(name: str, at: float) -> None:
        await trio.sleep_until(at)
        result = await comparator.compare(CALL, pair=(0, 1), judge_pass=0)
        assert result.attempts == 1
        ends[name] = trio.current_time()

    async def restart() -> None:
        await trio.sleep_until(1.0)
        down.refuses = False

    async with trio.open_nursery() as watch:
        watch.start_soon(judge.keep_watch)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(comparison, "first", 0.0)
            nursery.start_soon(comparison, "second", 0.1)
            nursery.start_soon(restart)
        watch.cancel_scope.cancel()
    assert down.starts == [0.0, 1.5]
    assert busy.starts == [0.0]
    assert ends == {"first": 10.0, "second": 2.5}
    assert queue.statistics().in_use == 0


def test_a_release_without_a_slot_held_raises() -> None:
    from genrm_trio.judge.queue import JudgeQueue

    queue = JudgeQueue(2, Metrics())
    with pytest.raises(RuntimeError, match=r"release\(\) without a slot held"):
        queue.release()
    assert queue.statistics().in_use == 0


async def test_the_queue_is_the_one_count_of_attempts_in_flight_and_queued(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """open_engine's queue, handed to the comparator: its statistics, the comparator's and the
    two gauges read the same counts."""
    slow = Replica("a", latency=5.0)
    judge = JudgeFleet(fleet_entries(slow), max_in_flight_per_replica=1)
    metrics = Metrics()
    config = settings(cap=1, replicas=1, timeout_s=30.0)
    queue = judge_queue(judge, config, metrics)
    comparator = Comparator(judge, config, metrics, queue=queue)
    assert comparator.statistics().max_concurrency == queue.statistics().total == 1
    async with trio.open_nursery() as nursery:
        for _ in range(3):
            nursery.start_soon(lambda: comparator.compare(CALL, pair=(0, 1), judge_pass=0))
        await trio.sleep(1.0)
        gauges = [
            metrics.registry.get_sample_value(name)
            for name in ("genrm_trio_judge_inflight", "genrm_trio_judge_queued")
        ]
        stats = comparator.statistics()
        assert (queue.statistics().in_use, queue.statistics().waiting) == (1, 2)
        assert (stats.in_flight, stats.queued) == (1, 2)
        assert gauges == [1.0, 2.0]
    assert trio.current_time() == 15.0
    assert metrics.registry.get_sample_value("genrm_trio_judge_inflight") == 0.0
