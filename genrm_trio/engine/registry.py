"""The cohort registry: keys, active cohorts, terminal records, group watermarks and retention.

Retention (docs/durable-state.md, "Retention") uses ordered indexes instead of scanning the
registry (D21): a heap of terminal cohorts by ``terminal_at`` and a heap of *idle* group
watermarks (groups with no active cohort) by ``updated_at``, both with lazy deletion and amortised
compaction. Pruning pops only
what it drops, so a request pays O(log n) amortised however many records are retained.

The registry's policy is here too: :meth:`Registry.admit` applies a request's watermark checks,
the capacity limit and supersession (docs/architecture.md, "Keys, digests and replay"), before the
engine gets or creates the request's cohort.

Every method is synchronous: the engine calls them inside its registry critical section, and
the state machine's callbacks call :meth:`Registry.cohort_state_changed` and
:meth:`Registry.cohort_terminal`.
"""

from __future__ import annotations

import heapq
import itertools
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final, assert_never, final

from genrm_trio.config import Settings
from genrm_trio.domain.model import CohortView, Rejection, RequestRejected
from genrm_trio.domain.retention import Retention
from genrm_trio.domain.text import ID_LOGGED_LIMIT, shown_id
from genrm_trio.engine.cohort import Cohort
from genrm_trio.engine.machine import ACTIVE_STATES
from genrm_trio.metrics import MASKED_ALONE, MASKED_WHOLE_GROUP, Metrics

__all__ = ["Registry", "RegistryStatistics", "Watermark"]

log = logging.getLogger("genrm_trio.cohort")

_COMPACT_SLACK: Final = 64


@final
class Watermark:
    """The newest attempt seen for one explicit group."""

    __slots__ = ("heap_seq", "latest_attempt", "prompt_digest", "updated_at")

    def __init__(self, latest_attempt: int, prompt_digest: str, updated_at: float) -> None:
        self.latest_attempt = latest_attempt
        self.prompt_digest = prompt_digest
        self.updated_at = updated_at
        self.heap_seq = -1  # sequence number of its live idle-heap entry; -1 while none


@final
@dataclass(frozen=True, slots=True)
class RegistryStatistics:
    cohorts: int  # keys held (active + retained terminal)
    by_state: dict[str, int]
    active: int
    terminal_records: int
    watermarks: int
    waiters: int
    terminal_index: int  # heap entries, live or stale
    watermark_index: int


@final
class Registry:
    """All cohorts of one engine, with the indexes retention needs."""

    def __init__(self, settings: Settings, metrics: Metrics) -> None:
        self._settings = settings
        self._retention = Retention.of(settings)
        self._metrics = metrics
        self.cohorts: dict[str, Cohort] = {}
        self.active: dict[Cohort, None] = {}  # insertion order = creation order (oldest first)
        self._group_active: dict[str, dict[Cohort, None]] = {}
        self.watermarks: dict[str, Watermark] = {}
        self._terminal_heap: list[tuple[float, int, Cohort]] = []
        self._terminal_count = 0
        self._watermark_heap: list[tuple[float, int, str]] = []
        self._seq = itertools.count()

    # --- lookups ------------------------------------------------------------------------------

    def get(self, key: str) -> Cohort | None:
        return self.cohorts.get(key)

    def group_actives(self, group_id: str) -> Iterator[Cohort]:
        return iter(list(self._group_active.get(group_id, ())))

    def views(self, now: float) -> list[CohortView]:
        """Active cohorts, oldest first (``GET /cohorts``)."""
        out: list[CohortView] = []
        for c in self.active:
            judging = c.state == "judging"
            deadline = (c.eval_deadline if judging else c.collect_deadline) or now
            out.append(
                CohortView(
                    key=c.key,
                    group_id=c.group_id,
                    group_attempt=c.group_attempt,
                    state="judging" if judging else "collecting",
                    members_present=len(c.members),
                    members_expected=c.size,
                    requests_waiting=c.waiter_count,
                    comparisons_total=c.comparisons_total,
                    comparisons_done=c.comparisons_done,
                    comparisons_failed=c.comparisons_failed,
                    comparisons_pending=c.comparisons_total - c.comparisons_done,
                    deadline="evaluation" if judging else "collection",
                    deadline_s_left=max(0.0, deadline - now),
                    age_s=max(0.0, now - c.created_at),
                )
            )
        return out

    def statistics(self) -> RegistryStatistics:
        by_state: dict[str, int] = {}
        for c in self.cohorts.values():
            by_state[c.state] = by_state.get(c.state, 0) + 1
        for c in self.active:  # superseded keys never hide an active cohort, but be exact
            if self.cohorts.get(c.key) is not c:
                by_state[c.state] = by_state.get(c.state, 0) + 1
        return RegistryStatistics(
            cohorts=len(self.cohorts),
            by_state=by_state,
            active=len(self.active),
            terminal_records=self._terminal_count,
            watermarks=len(self.watermarks),
            waiters=sum(c.waiter_count for c in self.cohorts.values()),
            terminal_index=len(self._terminal_heap),
            watermark_index=len(self._watermark_heap),
        )

    # --- registration -----------------------------------------------------------------------

    def add(self, cohort: Cohort) -> None:
        """Register a new active cohort under its key."""
        self.cohorts[cohort.key] = cohort
        self.active[cohort] = None
        self._metrics.active_cohorts.labels(cohort.state).inc()
        if cohort.group_id is not None:
            group = self._group_active.setdefault(cohort.group_id, {})
            group[cohort] = None
            watermark = self.watermarks.get(cohort.group_id)
            if watermark is not None:
                watermark.heap_seq = -1  # active groups' watermarks are never pruned

    def adopt(self, cohort: Cohort, terminal_at: float) -> None:
        """Register a restored terminal cohort with the given (possibly back-dated) clock."""
        assert cohort.terminal
        cohort.terminal_at = terminal_at
        self.cohorts[cohort.key] = cohort
        self._push_terminal(cohort)

    def discard(self, cohort: Cohort) -> None:
        """Forget a terminal cohort (no-op when its key now names another cohort)."""
        if self.cohorts.get(cohort.key) is cohort and cohort.terminal:
            del self.cohorts[cohort.key]
            self._terminal_count -= 1

    def clear(self) -> None:
        self.cohorts.clear()
        self.active.clear()
        self._group_active.clear()
        self.watermarks.clear()
        self._terminal_heap.clear()
        self._watermark_heap.clear()
        self._terminal_count = 0

    # --- policy: watermarks, capacity, supersession -------------------------------------------

    def admit(
        self, key: str, group_id: str | None, attempt: int, prompt_digest: str, now: float
    ) -> bool:
        """Admit a request for cohort ``key`` (docs/architecture.md, "Keys, digests and replay"):
        prune; the watermark checks; the capacity check (``server.max_active_cohorts``, counting
        the active cohorts this request supersedes as gone) for a key not held; then a new or
        higher attempt sets the watermark and supersedes every active lower attempt of the group,
        an equal one refreshes it.

        Raises RequestRejected: conflict (inconsistent prompt, superseded attempt) or unavailable
        (at capacity, ``retry_after_s`` 1). Returns whether the group's watermark advanced (the
        caller commits it)."""
        self.prune(now)
        advances = False
        if group_id is not None:
            watermark = self.watermarks.get(group_id)
            if watermark is not None and watermark.prompt_digest != prompt_digest:
                raise RequestRejected(
                    Rejection.CONFLICT,
                    f"GenRM group {shown_id(group_id)} received inconsistent prompt or principle "
                    "content",
                )
            if watermark is not None and attempt < watermark.latest_attempt:
                raise RequestRejected(
                    Rejection.CONFLICT,
                    f"GenRM group {shown_id(group_id)} attempt {attempt} was superseded by attempt "
                    f"{watermark.latest_attempt}",
                )
            advances = watermark is None or attempt > watermark.latest_attempt
        if self.get(key) is None:
            active = len(self.active)
            if advances and group_id is not None:
                active -= sum(1 for c in self.group_actives(group_id) if c.group_attempt < attempt)
            if active >= self._settings.server.max_active_cohorts:
                raise RequestRejected(
                    Rejection.UNAVAILABLE,
                    f"GenRM server is at capacity ({len(self.active)} active cohorts); retry later",
                    retry_after_s=1.0,
                    unavailable="at_capacity",
                )
        if group_id is not None:
            if advances:
                self.set_watermark(group_id, attempt, prompt_digest, now)
                self.supersede(group_id, attempt)
            else:
                self.touch_watermark(group_id, now)
        return advances

    def supersede(self, group_id: str, attempt: int) -> int:
        """Fail every active cohort of ``group_id`` older than ``attempt`` (cohort kind,
        "superseded": its waiters get the supersession 503, its comparisons hang up). Returns
        how many it failed."""
        superseded = 0
        for old in self.group_actives(group_id):
            if old.group_attempt < attempt and old.fail(
                "cohort",
                f"GenRM group {shown_id(group_id)} attempt {old.group_attempt} was superseded "
                f"by attempt {attempt}",
                reason="superseded",
            ):
                superseded += 1
        return superseded

    # --- watermarks ---------------------------------------------------------------------------

    def set_watermark(self, group_id: str, attempt: int, prompt_digest: str, now: float) -> None:
        watermark = self.watermarks.get(group_id)
        if watermark is None:
            watermark = self.watermarks[group_id] = Watermark(attempt, prompt_digest, now)
        else:
            watermark.latest_attempt = attempt
            watermark.prompt_digest = prompt_digest
            watermark.updated_at = now
        self._index_watermark(group_id, watermark)

    def touch_watermark(self, group_id: str, now: float) -> None:
        watermark = self.watermarks[group_id]
        watermark.updated_at = now
        self._index_watermark(group_id, watermark)

    def _index_watermark(self, group_id: str, watermark: Watermark) -> None:
        if self._group_active.get(group_id):
            watermark.heap_seq = -1
            return
        seq = next(self._seq)
        watermark.heap_seq = seq
        heapq.heappush(self._watermark_heap, (watermark.updated_at, seq, group_id))
        if len(self._watermark_heap) > 2 * len(self.watermarks) + _COMPACT_SLACK:
            self._watermark_heap = [
                entry
                for entry in self._watermark_heap
                if (w := self.watermarks.get(entry[2])) is not None and w.heap_seq == entry[1]
            ]
            heapq.heapify(self._watermark_heap)

    # --- retention (docs/durable-state.md, "Retention") ---------------------------------------

    def prune(self, now: float) -> None:
        """Drop terminal records and watermarks that the retention rule no longer keeps."""
        rule = self._retention
        heap = self._terminal_heap
        while heap:
            terminal_at, _, cohort = heap[0]
            if self.cohorts.get(cohort.key) is not cohort:
                heapq.heappop(heap)
                continue
            if rule.expired(terminal_at, now) or rule.excess(self._terminal_count):
                heapq.heappop(heap)
                del self.cohorts[cohort.key]
                self._terminal_count -= 1
                continue
            break
        wheap = self._watermark_heap
        while wheap:
            updated_at, seq, group_id = wheap[0]
            watermark = self.watermarks.get(group_id)
            if watermark is None or watermark.heap_seq != seq:
                heapq.heappop(wheap)
                continue
            if rule.expired(updated_at, now) or rule.excess(len(self.watermarks)):
                heapq.heappop(wheap)
                del self.watermarks[group_id]
                continue
            break

    def _push_terminal(self, cohort: Cohort) -> None:
        assert cohort.terminal_at is not None
        heapq.heappush(self._terminal_heap, (cohort.terminal_at, next(self._seq), cohort))
        self._terminal_count += 1
        if len(self._terminal_heap) > 2 * self._terminal_count + _COMPACT_SLACK:
            self._terminal_heap = [
                entry for entry in self._terminal_heap if self.cohorts.get(entry[2].key) is entry[2]
            ]
            heapq.heapify(self._terminal_heap)

    # --- state machine hooks ------------------------------------------------------------------

    def cohort_state_changed(self, cohort: Cohort, source: str, dest: str) -> None:
        gauge = self._metrics.active_cohorts
        if source in ACTIVE_STATES:
            gauge.labels(source).dec()
        if dest in ACTIVE_STATES:
            gauge.labels(dest).inc()

    def cohort_terminal(self, cohort: Cohort) -> None:
        record = cohort.record
        assert record is not None
        self.active.pop(cohort, None)
        group_id = cohort.group_id
        if group_id is not None:
            group = self._group_active.get(group_id)
            if group is not None:
                group.pop(cohort, None)
                if not group:
                    del self._group_active[group_id]
                    watermark = self.watermarks.get(group_id)
                    if watermark is not None:
                        self._index_watermark(group_id, watermark)
        self._metrics.cohorts_terminal.labels(record.state).inc()
        key = shown_id(cohort.key, ID_LOGGED_LIMIT)
        members = len(cohort.members)
        self._metrics.cohort_rollouts.labels(record.state).inc(members)
        match record.phase:  # exhaustive: mypy fails here until a new phase has its case
            case "completed":
                masked = record.masked
                if masked:
                    self._metrics.masked_rollouts.labels(MASKED_ALONE).inc(masked)
                    for member in record.members.values():
                        if member.masked_alone:
                            log.warning(
                                "GenRM masked one rollout of key=%s: %s",
                                key,
                                member.failure_reason,
                            )
                log.info(
                    "GenRM cohort disposition=completed key=%s attempt=%s members=%s",
                    key,
                    cohort.group_attempt,
                    members,
                )
            case "failed":
                if record.failure_kind == "judge":  # every member answered a failsafe row
                    self._metrics.masked_rollouts.labels(MASKED_WHOLE_GROUP).inc(members)
                log.warning(
                    "GenRM cohort disposition=failed key=%s attempt=%s members=%s kind=%s "
                    "reason=%r",
                    key,
                    cohort.group_attempt,
                    members,
                    record.failure_kind,
                    (record.failure or "")[:500],
                )
            case _:
                assert_never(record.phase)
        if self.cohorts.get(cohort.key) is not cohort:
            return  # already evicted or replaced: nothing to retain
        if record.retained:
            self._push_terminal(cohort)
            assert cohort.terminal_at is not None
            self.prune(cohort.terminal_at)  # keep the cap between resolutions too
        else:
            del self.cohorts[cohort.key]  # completed legacy cohorts are not replayable
