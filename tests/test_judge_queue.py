"""The critical-path judge queue (genrm_trio/judge/queue.py) in virtual time: slots, the grant
order (complete groups first, oldest-complete first; then the oldest-ready collecting
comparison), promotion, retries keeping their place, cancellation, metrics and compaction."""

from __future__ import annotations

import typing

import trio
import trio.testing
from trio.testing import MockClock

from genrm_trio.config import settings_from_mapping
from genrm_trio.judge.attempts import Comparator
from genrm_trio.judge.fleet import JudgeFleet
from genrm_trio.judge.queue import JudgeQueue, Priority, QueueTicket, judge_queue
from genrm_trio.metrics import QUEUE_PRIORITY_LABELS, Metrics
from genrm_trio.testing import SimJudge


class Holder:
    """Tasks that take a slot with a ticket, record when they got it, and hold it until told."""

    def __init__(self, queue: JudgeQueue, nursery: trio.Nursery) -> None:
        self.queue = queue
        self.nursery = nursery
        self.order: list[str] = []
        self.got: dict[str, float] = {}
        self._done: dict[str, trio.Event] = {}
        self.scopes: dict[str, trio.CancelScope] = {}

    async def take(self, name: str, ticket: QueueTicket) -> None:
        """Start a holder and let it reach the queue (tasks started together run in any order)."""
        self._done[name] = trio.Event()
        scope = self.scopes[name] = trio.CancelScope()

        async def hold() -> None:
            with scope:
                await self.queue.acquire(ticket)
                self.order.append(name)
                self.got[name] = trio.current_time()
                try:
                    await self._done[name].wait()
                finally:
                    self.queue.release()

        self.nursery.start_soon(hold)
        await trio.testing.wait_all_tasks_blocked()

    def finish(self, name: str) -> None:
        self._done[name].set()


def metric(metrics: Metrics, name: str, **labels: str) -> float:
    value = metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


async def test_slots_are_granted_at_once_until_full(autojump_clock: MockClock) -> None:
    metrics = Metrics()
    queue = JudgeQueue(2, metrics)
    async with trio.open_nursery() as nursery:
        holder = Holder(queue, nursery)
        for name in ("a", "b", "c"):
            await holder.take(name, queue.ticket())
        await trio.testing.wait_all_tasks_blocked()
        assert holder.order == ["a", "b"]
        stats = queue.statistics()
        assert (stats.in_use, stats.waiting, stats.waiting_complete) == (2, 1, 1)
        assert (queue.statistics().in_use, queue.statistics().total) == (2, 2)
        await trio.sleep(3)
        holder.finish("a")
        await trio.testing.wait_all_tasks_blocked()
        assert holder.order == ["a", "b", "c"]
        assert holder.got["c"] == 3
        holder.finish("b")
        holder.finish("c")
    assert queue.statistics().in_use == 0
    wait = {"priority": "complete"}
    assert metric(metrics, "genrm_trio_judge_queue_wait_seconds_count", **wait) == 3
    assert metric(metrics, "genrm_trio_judge_queue_wait_seconds_sum", **wait) == 3.0


async def test_grant_order_complete_first_then_oldest_ready(autojump_clock: MockClock) -> None:
    """One slot, held; then waiters of two collecting groups and two complete groups arrive in
    a mixed order. Freed one at a time, the slot goes: complete groups by completion order (a
    group's comparisons in ready order), then collecting comparisons by ready order."""
    metrics = Metrics()
    queue = JudgeQueue(1, metrics)
    collecting_x = queue.group(complete=False)
    collecting_y = queue.group(complete=False)
    complete_p = queue.group(complete=True)  # completed first
    complete_q = queue.group(complete=True)
    async with trio.open_nursery() as nursery:
        holder = Holder(queue, nursery)
        await holder.take("busy", queue.ticket())
        await trio.testing.wait_all_tasks_blocked()
        # ready order: x1, q1, y1, p1, x2, q2, p2
        for name, group in [
            ("x1", collecting_x),
            ("q1", complete_q),
            ("y1", collecting_y),
            ("p1", complete_p),
            ("x2", collecting_x),
            ("q2", complete_q),
            ("p2", complete_p),
        ]:
            await holder.take(name, queue.ticket(group))
            await trio.testing.wait_all_tasks_blocked()
        stats = queue.statistics()
        assert (stats.waiting_complete, stats.waiting_collecting) == (4, 3)
        expected = ["busy", "p1", "p2", "q1", "q2", "x1", "y1", "x2"]
        for position, name in enumerate(expected):
            assert holder.order == expected[: position + 1]
            await trio.sleep(1)
            holder.finish(name)
            await trio.testing.wait_all_tasks_blocked()
    assert holder.order == expected
    assert [holder.got[name] for name in expected] == [0, 1, 2, 3, 4, 5, 6, 7]
    stats = queue.statistics()
    assert (stats.granted_complete, stats.granted_collecting) == (5, 3)


async def test_a_completing_group_is_promoted_behind_earlier_complete_groups(
    autojump_clock: MockClock,
) -> None:
    metrics = Metrics()
    queue = JudgeQueue(1, metrics)
    early = queue.group(complete=False)
    other = queue.group(complete=False)
    async with trio.open_nursery() as nursery:
        holder = Holder(queue, nursery)
        await holder.take("busy", queue.ticket())
        await holder.take("early1", queue.ticket(early))
        await holder.take("other1", queue.ticket(other))
        await holder.take("early2", queue.ticket(early))
        await trio.testing.wait_all_tasks_blocked()
        done = queue.group(complete=True)  # complete before `early` completes
        await holder.take("done1", queue.ticket(done))
        await trio.sleep(2)
        early.mark_complete()  # its two waiting attempts move to the complete class now
        early.mark_complete()  # idempotent
        assert early.complete and not other.complete
        stats = queue.statistics()
        assert (stats.waiting_complete, stats.waiting_collecting, stats.promotions) == (3, 1, 2)
        expected = ["busy", "done1", "early1", "early2", "other1"]
        for position, name in enumerate(expected):
            assert holder.order == expected[: position + 1]
            await trio.sleep(1)
            holder.finish(name)
            await trio.testing.wait_all_tasks_blocked()
    # queued at 0 and promoted at 2: the complete-class wait counts from the promotion
    assert holder.got == {"busy": 0, "done1": 3, "early1": 4, "early2": 5, "other1": 6}
    complete = metric(metrics, "genrm_trio_judge_queue_wait_seconds_sum", priority="complete")
    assert complete == 0 + 3 + (4 - 2) + (5 - 2)
    collecting = metric(metrics, "genrm_trio_judge_queue_wait_seconds_sum", priority="collecting")
    assert collecting == 6
    assert metric(metrics, "genrm_trio_judge_queue_wait_seconds_count", priority="collecting") == 1


async def test_a_retry_keeps_its_groups_place(autojump_clock: MockClock) -> None:
    """The same ticket re-queued (a retry after a failed attempt) goes before comparisons of
    groups completed after its own, although they have waited longer."""
    metrics = Metrics()
    queue = JudgeQueue(1, metrics)
    first = queue.group(complete=True)
    second = queue.group(complete=True)
    retried = queue.ticket(first)
    async with trio.open_nursery() as nursery:
        holder = Holder(queue, nursery)
        await holder.take("attempt1", retried)
        await holder.take("later1", queue.ticket(second))
        await holder.take("later2", queue.ticket(second))
        await trio.testing.wait_all_tasks_blocked()
        await trio.sleep(1)
        holder.finish("attempt1")  # the attempt fails and gives its slot back...
        await trio.testing.wait_all_tasks_blocked()
        await holder.take("attempt2", retried)  # ...then its retry waits with the same ticket
        await trio.testing.wait_all_tasks_blocked()
        assert holder.order == ["attempt1", "later1"]
        await trio.sleep(1)
        holder.finish("later1")
        await trio.testing.wait_all_tasks_blocked()
        assert holder.order == ["attempt1", "later1", "attempt2"]
        holder.finish("attempt2")
        await trio.testing.wait_all_tasks_blocked()
        holder.finish("later2")
    assert holder.order == ["attempt1", "later1", "attempt2", "later2"]


async def test_a_cancelled_waiter_leaves_the_queue(autojump_clock: MockClock) -> None:
    metrics = Metrics()
    queue = JudgeQueue(1, metrics)
    group = queue.group(complete=False)
    async with trio.open_nursery() as nursery:
        holder = Holder(queue, nursery)
        await holder.take("busy", queue.ticket())
        await holder.take("gone", queue.ticket(group))
        await holder.take("stays", queue.ticket(group))
        await trio.testing.wait_all_tasks_blocked()
        holder.scopes["gone"].cancel()
        await trio.testing.wait_all_tasks_blocked()
        assert queue.statistics().waiting_collecting == 1
        assert len(group.waiting) == 1
        group.mark_complete()  # the cancelled waiter is not promoted
        assert queue.statistics().promotions == 1
        holder.finish("busy")
        await trio.testing.wait_all_tasks_blocked()
        holder.finish("stays")
    assert holder.order == ["busy", "stays"]
    stats = queue.statistics()
    assert (stats.in_use, stats.waiting) == (0, 0)


async def test_stale_entries_are_compacted(autojump_clock: MockClock) -> None:
    queue = JudgeQueue(1, Metrics())
    async with trio.open_nursery() as nursery:
        holder = Holder(queue, nursery)
        await holder.take("busy", queue.ticket())
        await trio.testing.wait_all_tasks_blocked()
        for round_ in range(5):
            names = [f"w{round_}-{i}" for i in range(100)]
            for name in names:
                await holder.take(name, queue.ticket(queue.group(complete=False)))
            await trio.testing.wait_all_tasks_blocked()
            for name in names:
                holder.scopes[name].cancel()
            await trio.testing.wait_all_tasks_blocked()
            assert queue.statistics().waiting == 0
            assert len(queue._collecting) <= 64
        holder.finish("busy")
    assert holder.order == ["busy"]


async def test_an_already_cancelled_caller_takes_no_slot(autojump_clock: MockClock) -> None:
    queue = JudgeQueue(1, Metrics())
    with trio.CancelScope() as scope:
        scope.cancel()
        await queue.acquire(queue.ticket())
    assert scope.cancelled_caught
    assert queue.statistics().in_use == 0


def test_priority_labels_are_exported_from_the_start() -> None:
    assert typing.get_args(Priority) == QUEUE_PRIORITY_LABELS
    text = Metrics().render().decode()
    for priority in QUEUE_PRIORITY_LABELS:
        line = f'genrm_trio_judge_queue_wait_seconds_count{{priority="{priority}"}} 0.0'
        assert line in text.splitlines()


def test_the_comparator_queue_has_the_fleets_real_capacity() -> None:
    """judge.max_concurrency, or replicas x max_concurrency_per_replica when that is lower."""
    urls = [f"http://127.0.0.1:{9000 + i}/v1" for i in range(3)]
    for per_replica, total in [(None, 100), (8, 24), (50, 100)]:
        judge: dict[str, object] = {"base_url": urls, "max_concurrency": 100}
        if per_replica is not None:
            judge["max_concurrency_per_replica"] = per_replica
        config = settings_from_mapping({"judge": judge})
        comparator = Comparator(SimJudge(), config, Metrics())
        fleet = JudgeFleet([(url, SimJudge()) for url in urls])
        assert judge_queue(fleet, config, Metrics()).statistics().total == total
        assert comparator.statistics().max_concurrency == total
