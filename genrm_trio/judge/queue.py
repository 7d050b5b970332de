"""The critical-path judge queue: `judge.max_concurrency` slots, complete groups first.

Every judge attempt holds one slot while it runs (`Comparator._attempt`). When none is free the
attempt waits here, and a freed slot goes to the waiting attempt that shortens a training step
the most (docs/operations.md, "Sizing judge.max_concurrency"):

1. an attempt of a **complete** group (every member is in: the trainer waits for its rewards)
   before any attempt of a group that is still **collecting** (its comparisons started early,
   `eager_comparisons`);
2. among complete groups, the group that completed first; within a group, its comparisons in the
   order they became ready;
3. among collecting groups, the comparison that became ready first, whatever its group.

A group is a :class:`QueueGroup`; it is promoted (:meth:`QueueGroup.mark_complete`) when its last
member arrives, and its waiting attempts move to the complete class at once. Each comparison has a
:class:`QueueTicket`, its place: its group and the moment it became ready. A retry waits with the
same ticket, so it keeps its group's place instead of going to the back. A `/compare` batch is
one group, complete from the start (its members arrive together; engine/compare.py); a
comparison without a ticket gets one of a fresh complete group.

The queue sits where the priority is known only if it is where calls wait, so
`judge.max_concurrency` should be the judge's real capacity (vLLM's `max_num_seqs` x replicas):
above it, the judge's own first-in first-out queue decides instead. For the same reason a fleet
with `judge.max_concurrency_per_replica` tells the queue what it can take *now* (`capacity`,
`JudgeFleet.capacity`): while replicas are ejected only the others' slots are handed out, so a
call no replica can take waits here, by priority and before its attempt deadline starts, rather
than inside the fleet holding a slot.

Waiting for a slot is never a failed attempt (D13). A cancelled waiter leaves the queue; a slot
handed to a waiter that is cancelled in the same moment is passed on. Two heaps with lazy deletion
make a grant O(log n); promoted and cancelled entries are compacted away when they outnumber the
live ones.

The queue has one owner: `open_engine` builds it (`judge_queue`) and hands it to the
`Comparator`, the group runs and `/compare`. It is the one count of the judge attempts in flight
(slots held) and queued (waiting), which `genrm_trio_judge_inflight` and `genrm_trio_judge_queued`
read. A fleet tells it when its capacity changes (a replica back in service), so the slots it
adds are handed out at once rather than at the next release.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass
from typing import Final, Literal, final

import trio

from genrm_trio.config import Settings
from genrm_trio.judge.fleet import JudgeFleet
from genrm_trio.metrics import Metrics

__all__ = [
    "JudgeQueue",
    "Priority",
    "QueueGroup",
    "QueueStatistics",
    "QueueTicket",
    "judge_queue",
]

Priority = Literal["complete", "collecting"]

_COMPACT_SLACK: Final = 64


@final
class QueueGroup:
    """One `/verify` group (or `/compare` batch) in the queue: collecting, then complete."""

    __slots__ = ("_completed", "_queue", "complete_seq", "waiting")

    def __init__(self, queue: JudgeQueue, complete_seq: int | None) -> None:
        self._queue = queue
        self.complete_seq = complete_seq  # the order of completion; None while collecting
        self.waiting: set[_Waiter] = set()
        self._completed: trio.Event | None = None  # made by the first `wait_complete`

    @property
    def complete(self) -> bool:
        return self.complete_seq is not None

    def mark_complete(self) -> None:
        """The group's last member is in: promote its waiting attempts. Idempotent."""
        if self.complete_seq is None:
            self._queue._promote(self)
            if self._completed is not None:
                self._completed.set()

    async def wait_complete(self) -> None:
        """Return once the group is complete (at once if it is). The engine sets a group's
        deadline in the step that marks it complete, so a waiter wakes under that deadline."""
        if self.complete_seq is not None:
            await trio.lowlevel.checkpoint()
            return
        if self._completed is None:
            self._completed = trio.Event()
        await self._completed.wait()


@final
class QueueTicket:
    """One comparison's place: its group and when it became ready (kept by its retries)."""

    __slots__ = ("group", "ready_seq")

    def __init__(self, group: QueueGroup, ready_seq: int) -> None:
        self.group = group
        self.ready_seq = ready_seq

    @property
    def priority(self) -> Priority:
        return "complete" if self.group.complete else "collecting"


@final
class _Waiter:
    __slots__ = ("event", "granted", "priority", "since", "ticket")

    def __init__(self, ticket: QueueTicket, now: float) -> None:
        self.ticket = ticket
        self.event = trio.Event()
        self.granted = False
        self.priority: Priority | None = ticket.priority  # the heap it is live in; None: gone
        self.since = now  # entered its current class (enqueued, or promoted)


@final
@dataclass(frozen=True, slots=True)
class QueueStatistics:
    total: int  # slots (judge.max_concurrency, or the fleet's total when its replicas serve)
    in_use: int
    waiting_complete: int
    waiting_collecting: int
    granted_complete: int  # slots given since the start, by the class that won them
    granted_collecting: int
    promotions: int  # waiting attempts moved to the complete class when their group completed

    @property
    def waiting(self) -> int:
        return self.waiting_complete + self.waiting_collecting


@final
class JudgeQueue:
    """`total` judge slots shared by every comparison, granted by priority (module docstring).

    Observes `genrm_trio_judge_queue_wait_seconds{priority}`: the wait of an attempt in the
    class that served it (a promoted attempt counts from its group's completion; one served at
    once waited 0).
    """

    def __init__(
        self,
        total: int,
        metrics: Metrics,
        *,
        fleet: JudgeFleet | None = None,
    ) -> None:
        """`fleet`: the judge, which says how many slots are usable now (`capacity`) and when
        that grows (`watch_capacity`, until `close`); None: `total`, always."""
        if total < 1:
            raise ValueError("a judge queue needs at least one slot")
        self._total = total
        # the slots usable now, when the judge says (a fleet with replicas out); None: `total`
        self._capacity = None if fleet is None else fleet.capacity
        self._metrics = metrics
        self._in_use = 0
        self._ready = itertools.count()
        self._completed = itertools.count()
        self._tie = itertools.count()
        # (complete_seq, ready_seq, tie, waiter) and (ready_seq, tie, waiter)
        self._complete: list[tuple[int, int, int, _Waiter]] = []
        self._collecting: list[tuple[int, int, _Waiter]] = []
        self._live = {"complete": 0, "collecting": 0}
        self._granted = {"complete": 0, "collecting": 0}
        self._promotions = 0
        # stops the judge telling this queue that its capacity grew (`close`)
        self._unwatch = None if fleet is None else fleet.watch_capacity(self.capacity_changed)
        # the one count of attempts in flight and queued: the gauges read it at scrape time
        metrics.judge_inflight.set_function(lambda: self._in_use)
        metrics.judge_queued.set_function(lambda: self._live["complete"] + self._live["collecting"])

    # --- places -----------------------------------------------------------------------------

    def group(self, *, complete: bool) -> QueueGroup:
        """A new group; a complete one is ordered after every group completed before it."""
        return QueueGroup(self, next(self._completed) if complete else None)

    def ticket(self, group: QueueGroup | None = None) -> QueueTicket:
        """The place of a comparison that is ready now (None: a fresh complete group)."""
        if group is None:
            group = self.group(complete=True)
        return QueueTicket(group, next(self._ready))

    # --- the CapacityLimiter-like surface -----------------------------------------------------

    def statistics(self) -> QueueStatistics:
        return QueueStatistics(
            total=self._total,
            in_use=self._in_use,
            waiting_complete=self._live["complete"],
            waiting_collecting=self._live["collecting"],
            granted_complete=self._granted["complete"],
            granted_collecting=self._granted["collecting"],
            promotions=self._promotions,
        )

    def _free(self) -> bool:
        """A slot may be handed out now."""
        limit = self._total
        if self._capacity is not None:
            now = self._capacity()
            if now is not None and now < limit:
                limit = now
        return self._in_use < limit

    async def acquire(self, ticket: QueueTicket) -> None:
        """Take a slot, waiting by priority when none is free. Pair with :meth:`release`."""
        await trio.lowlevel.checkpoint_if_cancelled()
        live = self._live
        if not live["complete"] and not live["collecting"] and self._free():
            self._in_use += 1
            self._granted[ticket.priority] += 1
            self._metrics.judge_queue_wait_seconds.labels(priority=ticket.priority).observe(0.0)
            await trio.lowlevel.cancel_shielded_checkpoint()
            return
        waiter = _Waiter(ticket, trio.current_time())
        self._push(waiter)
        ticket.group.waiting.add(waiter)
        # Slots are handed out on release; a capacity that grew meanwhile is used from here too.
        self._grant()
        try:
            await waiter.event.wait()
        except BaseException:
            if waiter.granted:  # handed a slot in the same moment: pass it on
                self.release()
            else:
                self._leave(waiter)
            raise

    def release(self) -> None:
        """Give the slot back: to the best waiting attempts the capacity admits, else to the
        pool. Raises RuntimeError when no slot is held (a release without its acquire), as
        trio's `CapacityLimiter` does."""
        if self._in_use <= 0:
            raise RuntimeError("JudgeQueue.release() without a slot held")
        self._in_use -= 1
        self._grant()

    def close(self) -> None:
        """The queue's engine closed: the judge, which may outlive it (a fleet shared by two
        engines), stops telling it of capacity, so that it no longer holds this queue."""
        if self._unwatch is not None:
            self._unwatch()
            self._unwatch = None

    def capacity_changed(self) -> None:
        """The judge can place more (or fewer) attempts now (a fleet's replica back in
        service): hand out what it admits at once."""
        self._grant()

    def _grant(self) -> None:
        """Hand free slots to the best waiting attempts."""
        while self._free():
            waiter = self._pop()
            if waiter is None:
                return
            priority = waiter.priority
            assert priority is not None
            self._in_use += 1
            self._live[priority] -= 1
            self._granted[priority] += 1
            waiter.priority = None
            waiter.granted = True
            waiter.ticket.group.waiting.discard(waiter)
            self._metrics.judge_queue_wait_seconds.labels(priority=priority).observe(
                trio.current_time() - waiter.since
            )
            waiter.event.set()

    # --- the heaps ----------------------------------------------------------------------------

    def _push(self, waiter: _Waiter) -> None:
        ticket = waiter.ticket
        complete_seq = ticket.group.complete_seq
        if complete_seq is None:
            waiter.priority = "collecting"
            heapq.heappush(self._collecting, (ticket.ready_seq, next(self._tie), waiter))
        else:
            waiter.priority = "complete"
            entry = (complete_seq, ticket.ready_seq, next(self._tie), waiter)
            heapq.heappush(self._complete, entry)
        self._live[waiter.priority] += 1

    def _pop(self) -> _Waiter | None:
        while self._complete:
            waiter = heapq.heappop(self._complete)[3]
            if waiter.priority == "complete":
                return waiter
        while self._collecting:
            waiter = heapq.heappop(self._collecting)[2]
            if waiter.priority == "collecting":
                return waiter
        return None

    def _leave(self, waiter: _Waiter) -> None:
        """A cancelled waiter: its heap entry becomes stale."""
        priority = waiter.priority
        if priority is None:
            return
        waiter.priority = None
        self._live[priority] -= 1
        waiter.ticket.group.waiting.discard(waiter)
        self._compact()

    def _promote(self, group: QueueGroup) -> None:
        group.complete_seq = next(self._completed)
        now = trio.current_time()
        # in ready order, so the group's comparisons keep their order among themselves
        for waiter in sorted(group.waiting, key=lambda w: w.ticket.ready_seq):
            if waiter.priority != "collecting":
                continue
            self._live["collecting"] -= 1  # its collecting entry is now stale
            waiter.since = now
            self._push(waiter)
            self._promotions += 1
        self._compact()

    def _compact(self) -> None:
        """Drop stale entries once they outnumber the live ones (bounded memory)."""
        live = self._live
        if len(self._collecting) > 2 * live["collecting"] + _COMPACT_SLACK:
            self._collecting = [e for e in self._collecting if e[2].priority == "collecting"]
            heapq.heapify(self._collecting)
        if len(self._complete) > 2 * live["complete"] + _COMPACT_SLACK:
            self._complete = [e for e in self._complete if e[3].priority == "complete"]
            heapq.heapify(self._complete)


def judge_queue(fleet: JudgeFleet, settings: Settings, metrics: Metrics) -> JudgeQueue:
    """The judge queue of `fleet`: `settings.judge.total_concurrency` slots; the fleet also tells
    it how many it can place now (`capacity`: with replicas out it places fewer, and the rest
    wait here, not inside the fleet) and when that grows (`watch_capacity`, until `close`)."""
    return JudgeQueue(settings.judge.total_concurrency, metrics, fleet=fleet)
