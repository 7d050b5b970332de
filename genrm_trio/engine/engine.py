"""The engine: `/verify` cohorts and `/compare` batches on one engine-owned trio nursery.

``open_engine(settings, judge)`` opens the nursery that owns every cohort's run
(engine/group_run.py: collection deadline, then evaluation under the group deadline; with
``eager_comparisons`` each comparison starts once both of its members are in, while the group
collects) and every `/verify` judge call, each waiting for its slot in the critical-path judge
queue (judge/queue.py); request handlers only attach waiters and wait, so a client disconnect
cancels its own wait and never a cohort (docs/architecture.md, "How cancellation flows").
Cohort tasks start in a fresh, empty ``contextvars`` context so that no per-request variable
leaks into shared judge calls. `/compare` runs in the request's own task and context,
fail-fast, under ``cohort_evaluation_timeout_s`` (docs/differences.md, D40 / D27).

The request algorithm is docs/architecture.md "One /verify request", in order. The registry
section (the registry's policy, `Registry.admit`: prune, watermarks, capacity, supersession;
then get-or-create) is synchronous under one lock, and so is attaching (`Cohort.attach`), so a
state transition (the final arrival's ``start_judging`` or the collection timer's ``fail``)
decides every race: all members get rewards or none do. With a durable store the section only
*queues* its commit points (docs/architecture.md "Durable-state commit points": the advanced
watermark, the new cohort's ``open`` record) in registry order; the request then leaves the
lock, waits for its commits, and attaches only after them. Members of a cohort whose ``open``
record is still being committed wait for it (a per-cohort event set by the creating request)
before they attach; ``Cohort.attach`` re-reads the cohort's state afterwards, so a cohort
superseded or shut down meanwhile answers with its failure. The store applies commits in
submission order, so it sees watermark, then ``open``, then terminal.
"""

from __future__ import annotations

import contextvars
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Final, final

import trio

from genrm_trio.config import Settings
from genrm_trio.domain.checkpoint import RestoreReport, checkpoint, restore
from genrm_trio.domain.exceptions import leaves
from genrm_trio.domain.model import (
    SHUTTING_DOWN,
    CohortView,
    CompareFailed,
    CompareInput,
    CompareResult,
    MemberOutcome,
    Rejection,
    RequestRejected,
    Scored,
    VerifyInput,
)
from genrm_trio.domain.records import OpenRecord, TerminalRecord, WatermarkRecord
from genrm_trio.domain.text import (
    ID_LOGGED_LIMIT,
    answer_text,
    reasoning_text,
    response_digest,
    shown_id,
)
from genrm_trio.engine.cohort import Cohort, Member, Waiter
from genrm_trio.engine.compare import Comparisons
from genrm_trio.engine.evaluation import MemberText, default_result
from genrm_trio.engine.group_run import GroupRunner
from genrm_trio.engine.keys import RUBRIC_REQUIRED, CohortKey, cohort_key, rubric_mode
from genrm_trio.engine.registry import Registry
from genrm_trio.engine.restore import apply_restore, plan_restore
from genrm_trio.judge.attempts import Comparator, ComparatorStatistics
from genrm_trio.judge.base import Judge, ReplicaStats
from genrm_trio.judge.fleet import JudgeFleet, as_fleet
from genrm_trio.judge.queue import JudgeQueue, judge_queue
from genrm_trio.metrics import Metrics
from genrm_trio.store.errors import CommitTimeout
from genrm_trio.store.protocol import CohortStore, Commit, QueuedCohortStore, queued

__all__ = ["SHUTTING_DOWN", "Engine", "EngineStatistics", "open_engine"]

log = logging.getLogger("genrm_trio.engine")

LEGACY_ATTEMPT_MESSAGE: Final = (
    "GenRM group attempt omitted; treating legacy requests as group attempt zero"
)

_legacy_attempt_logged = False


def _log_legacy_attempt_once() -> None:
    """The once-per-process attempt-omitted line (a log record, never warnings.warn)."""
    global _legacy_attempt_logged
    if not _legacy_attempt_logged:
        _legacy_attempt_logged = True
        log.warning(LEGACY_ATTEMPT_MESSAGE)


@final
@dataclass(frozen=True, slots=True)
class EngineStatistics:
    """A frozen snapshot of everything the engine holds; all zeros after ``aclose()``."""

    closed: bool
    cohorts: int  # keys held: active cohorts plus retained terminal records
    cohorts_by_state: Mapping[str, int]
    active_cohorts: int
    terminal_records: int
    watermarks: int
    waiters: int  # attached requests not yet answered
    running_tasks: int  # cohort run tasks in the engine nursery
    compares_in_flight: int
    judge: ComparatorStatistics  # the comparator's own snapshot (in flight, queued, calls...)


@final
class _Arrival:
    """What a validated `/verify` request needs for its cohort: not its decoded body."""

    __slots__ = (
        "baseline",
        "baseline_digest",
        "digest",
        "group_attempt",
        "group_id",
        "history",
        "key",
        "member",
        "principle",
        "rubric_ids",
    )

    def __init__(self, item: VerifyInput, keyed: CohortKey, member: Member) -> None:
        self.group_id = item.group_id
        self.group_attempt = item.group_attempt
        self.principle = item.principle
        self.rubric_ids = item.expected_rubric_ids
        self.key = keyed.key
        self.digest = keyed.digest
        self.history = keyed.history
        self.baseline = keyed.baseline
        self.baseline_digest = keyed.baseline_digest
        self.member = member


@final
class Engine:
    """Cohort verification and batch comparison. Create it with :func:`open_engine`."""

    def __init__(
        self,
        settings: Settings,
        fleet: JudgeFleet,
        metrics: Metrics,
        store: CohortStore | None,
        nursery: trio.Nursery,
        queue: JudgeQueue,
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self._commit_timeout_s = settings.state_commit_timeout_s
        self._store: QueuedCohortStore | None = (
            None if store is None else queued(store, timeout_s=self._commit_timeout_s)
        )
        # Cohorts whose `open` record is queued but not yet committed: set by the creator.
        self._opening: dict[Cohort, trio.Event] = {}
        self._nursery = nursery
        # the critical-path judge queue (judge/queue.py), open_engine's: one owner, shared by
        # the comparator (every attempt's slot), the group runs and /compare (their places)
        self._queue = queue
        self._comparator = Comparator(fleet, settings, metrics, queue=queue)
        self._fleet = fleet
        metrics.watch_replicas(fleet.replica_stats)
        metrics.watch_judge(fleet)
        # its probe loops: a judge that cannot be reached is waited for (judge/outage.py)
        nursery.start_soon(fleet.keep_watch)
        self._registry = Registry(settings, metrics)
        self._lock = trio.Lock()
        self._closed = False
        self._running = 0
        self._idle = trio.Event()
        self._idle.set()
        self._compares = Comparisons(settings, self._comparator, queue, metrics)
        self._runner = GroupRunner(settings, metrics, self._comparator, self._queue)

    # --- public surface ---------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed

    def active_cohorts(self) -> list[CohortView]:
        """Collecting and judging cohorts, oldest first (``GET /cohorts``, docs/http-api.md)."""
        return self._registry.views(trio.current_time())

    def judge_unreachable(self) -> str | None:
        """Why the judge cannot be used now (no replica can be reached), or None; `/readyz`
        answers 503 with it."""
        gone = self._comparator.unreachable_for()
        if gone is None:
            return None
        return f"judge unreachable for {gone:.0f}s: no judge replica can be reached"

    def judge_replicas(self) -> list[ReplicaStats]:
        """Per-replica counters of the judge (``GET /judge/replicas``): one per base URL, a single
        URL being a fleet of one; [] for an in-process judge (a simulated one)."""
        return self._fleet.replica_stats()

    def statistics(self) -> EngineStatistics:
        r = self._registry.statistics()
        return EngineStatistics(
            closed=self._closed,
            cohorts=r.cohorts,
            cohorts_by_state=r.by_state,
            active_cohorts=r.active,
            terminal_records=r.terminal_records,
            watermarks=r.watermarks,
            waiters=r.waiters,
            running_tasks=self._running,
            compares_in_flight=self._compares.in_flight,
            judge=self._comparator.statistics(),
        )

    async def aclose(self) -> None:
        """Shutdown (docs/differences.md, D28): refuse new work, fail active cohorts (cohort
        kind, SHUTTING_DOWN), cancel timers, evaluations and `/compare` calls, wait for them,
        then clear every record."""
        if not self._closed:
            self._closed = True  # refuse new requests at once (D28)
            async with self._lock:  # let a request already inside the registry finish
                for cohort in list(self._registry.active):
                    cohort.fail("cohort", SHUTTING_DOWN, reason="shutting_down")
            self._compares.close()
        await self._idle.wait()
        self._registry.clear()

    # --- /verify ----------------------------------------------------------------------------

    async def verify(self, item: VerifyInput) -> MemberOutcome:
        """One `/verify` request (docs/architecture.md, "One /verify request"). Raises
        RequestRejected (its ``Rejection`` reason: invalid, conflict, unavailable) for a refusal;
        otherwise the member's outcome (Scored, Masked, or GroupFailed of either kind). What
        each becomes at HTTP is the HTTP layer's (``http/asgi.py``, ``rejection_status``)."""
        arrival = self._arrive(item)
        # From here a request holds only what its cohort needs (queued at the registry lock, a
        # few hundred bytes beside its answer text), then only its cohort, slot and waiter
        # token: the decoded body stays the caller's (docs/differences.md, D22).
        del item
        if not isinstance(arrival, _Arrival):
            return arrival
        cohort, index, attached = await self._join(arrival)
        del arrival
        if not isinstance(attached, Waiter):
            if not cohort.released.is_set():  # terminal, record not yet committed
                await cohort.released.wait()
            return attached
        try:
            await cohort.released.wait()
        except BaseException:
            # Detach only this request. No await here, so no cancellation can cut it short.
            slot = cohort.members.get(index)
            if slot is not None and attached in slot.waiters:
                slot.waiters.remove(attached)
            raise
        outcome = attached.outcome
        assert outcome is not None  # handed over by Cohort.release before it wakes us
        return outcome

    def _arrive(self, item: VerifyInput) -> _Arrival | MemberOutcome:
        """Validate, key and digest the request (docs/architecture.md "One /verify request",
        step 3, up to the lock). Returns the singleton outcome, or what the rest of the request
        needs of it."""
        s = self.settings
        if item.group_id is not None and not item.group_attempt_given:
            _log_legacy_attempt_once()
        if self._closed:
            raise RequestRejected(Rejection.UNAVAILABLE, SHUTTING_DOWN, unavailable="shutting_down")
        if rubric_mode(s) and not item.expected_rubric_ids:
            raise RequestRejected(Rejection.INVALID, RUBRIC_REQUIRED)
        if not s.cohorting:
            text = MemberText(reasoning_text(item.response), answer_text(item.response))
            return Scored(default_result(s, text))
        keyed = cohort_key(s, item)  # engine/keys.py (pure)
        member = Member(
            index=keyed.index,
            response_digest=response_digest(item.response),
            answer_text=answer_text(item.response),
            reasoning_text=reasoning_text(item.response),
            rubric_ids=item.expected_rubric_ids,
            baseline_digest=keyed.baseline_digest,
        )
        return _Arrival(item, keyed, member)

    async def _join(self, arrival: _Arrival) -> tuple[Cohort, int, Waiter | MemberOutcome]:
        """Resolve the request's cohort and attach it (docs/architecture.md "One /verify request",
        step 3 under the lock). Returns the cohort, the slot and a waiter or the replayed
        outcome."""
        member = arrival.member
        key, digest, index = arrival.key, arrival.digest, member.index
        commits: list[Commit] = []
        # `async with` yields once while holding the lock, so requests pass this section one per
        # scheduler pass, in arrival order: a throttle on intake that leaves the CPU to groups
        # being judged and answered. Taking it without yielding doubled the p99 at G=64
        # (docs/benchmarks.md, "Session 3").
        async with self._lock:
            try:
                cohort, created = self._resolve(arrival, commits)
            except BaseException:
                if commits:  # a commit queued before the refusal is still waited for
                    # bounded: a stalled store holds the lock for at most the commit timeout
                    with trio.CancelScope(shield=True, deadline=self._commit_deadline()):
                        await self._wait_commits(commits)
                raise
            opening = self._opening.get(cohort) if self._opening else None
            if not commits and opening is None:
                return cohort, index, cohort.attach(member, digest)
        # Durable store: the commits were queued in registry order; wait for them unlocked.
        # Shielded, so that the creator sets `opening` in every case; bounded by the commit
        # timeout, so that a stalled store fails the request (not confirmed: CommitTimeout)
        # instead of holding it and a shutdown. Another member waits for `opening`, which the
        # creator sets at its own, earlier, deadline at the latest.
        failure: Exception | None = None
        with trio.CancelScope(shield=True, deadline=self._commit_deadline()) as bound:
            failure = await self._wait_commits(commits)
            if opening is not None and not created:
                await opening.wait()
        if bound.cancelled_caught and failure is None:
            failure = CommitTimeout("GenRM durable store commit", self._commit_timeout_s)
        if opening is not None and created:  # this request queued the `open` record: done
            del self._opening[cohort]
            if failure is not None:
                cohort.fail(
                    "cohort",
                    f"GenRM durable store could not record cohort "
                    f"{shown_id(key, ID_LOGGED_LIMIT)}: {type(failure).__name__}: {failure}",
                )
            opening.set()
        if failure is not None:
            raise failure
        return cohort, index, cohort.attach(member, digest)

    async def _wait_commits(self, commits: list[Commit]) -> Exception | None:
        """Wait for every commit (shielded and bounded by the caller); returns the first
        failure."""
        error: Exception | None = None
        for commit in commits:
            try:
                await commit.wait()
            except Exception as exc:
                if error is None:
                    error = exc
        return error

    def _resolve(self, arrival: _Arrival, commits: list[Commit]) -> tuple[Cohort, bool]:
        """The registry's policy (`Registry.admit`: watermarks, capacity, supersession), then get
        or create the cohort (docs/architecture.md, "Keys, digests and replay").

        Synchronous: with a store, the commit points are queued onto ``commits`` in order.
        Returns the cohort and whether this request created it."""
        key, digest = arrival.key, arrival.digest
        store = self._store
        s = self.settings
        reg = self._registry
        if self._closed:
            raise RequestRejected(Rejection.UNAVAILABLE, SHUTTING_DOWN, unavailable="shutting_down")
        now = trio.current_time()
        group_id = arrival.group_id
        attempt = arrival.group_attempt
        if reg.admit(key, group_id, attempt, digest, now) and store is not None:
            assert group_id is not None  # only an explicit group has a watermark
            commits.append(store.submit_watermark(WatermarkRecord(group_id, attempt, digest)))
        cohort = reg.get(key)
        if cohort is not None:
            return cohort, False
        cohort = Cohort(
            key=key,
            group_id=group_id,
            group_attempt=attempt,
            prompt_digest=digest,
            size=s.num_rollouts_per_prompt,
            history=arrival.history,
            principle=arrival.principle,
            baseline=arrival.baseline,
            baseline_digest=arrival.baseline_digest,
            rubric_ids=arrival.rubric_ids,
            created_at=now,
            collect_deadline=now + s.cohort_collection_timeout_s,
            host=reg,
        )
        if store is not None:
            commits.append(
                store.submit_open(OpenRecord(key, group_id, attempt, group_id is None, digest))
            )
            self._opening[cohort] = trio.Event()
        reg.add(cohort)
        self._spawn(self._run, cohort)
        return cohort, True

    # --- cohort run (engine nursery) ----------------------------------------------------------

    def _spawn(self, fn: Callable[[Cohort], Awaitable[None]], cohort: Cohort) -> None:
        """Start ``fn(cohort)`` in the engine nursery, in a fresh empty context.

        docs/architecture.md, "Context isolation of judge calls".
        """
        if self._running == 0:
            self._idle = trio.Event()
        self._running += 1
        name = f"genrm-cohort {cohort.key[:80]}"
        contextvars.Context().run(lambda: self._nursery.start_soon(fn, cohort, name=name))

    def _task_done(self) -> None:
        self._running -= 1
        if self._running == 0:
            self._idle.set()

    def _commit_deadline(self) -> float:
        """The deadline of a wait for the store: ``state_commit_timeout_s`` from now."""
        return trio.current_time() + self._commit_timeout_s

    async def _run(self, cohort: Cohort) -> None:
        """Collection, then evaluation (`GroupRunner.run_group`, engine/group_run.py); finally
        commit the record and release."""
        try:
            with cohort.scope:
                await self._runner.run_group(cohort)
        except Exception as exc:
            errors = leaves(exc)  # every leaf of a (nested) group, each with its traceback
            for n, error in enumerate(errors, 1):
                log.error(
                    "GenRM cohort evaluation failed for key=%s%s",
                    shown_id(cohort.key, ID_LOGGED_LIMIT),
                    f" ({n} of {len(errors)} errors)" if len(errors) > 1 else "",
                    exc_info=error,
                )
            error = errors[0]
            cohort.fail(
                "cohort",
                f"GenRM cohort evaluation failed: {type(error).__name__}: {str(error)[:1000]}",
            )
        finally:
            if not cohort.terminal:
                cohort.fail("cohort", "GenRM cohort evaluation was cancelled")
            # bounded: _finalize releases the waiters whether or not the store confirms in time
            with trio.CancelScope(shield=True, deadline=self._commit_deadline()):
                await self._finalize(cohort)
            self._task_done()

    async def _finalize(self, cohort: Cohort) -> None:
        """Commit the terminal record, then wake every waiter (no reply before its commit). A
        commit that fails, or is not confirmed by the caller's deadline (the commit timeout), is
        logged and the waiters are released all the same: no request hangs on the store."""
        record = cohort.record
        assert record is not None
        try:
            if self._store is not None:
                try:
                    await self._store.submit_terminal(record).wait()
                except Exception:
                    log.exception(
                        "GenRM durable store failed to commit key=%s",
                        shown_id(cohort.key, ID_LOGGED_LIMIT),
                    )
                except trio.Cancelled:  # shielded by the caller: only its deadline gets here
                    log.error(
                        "GenRM durable store did not confirm the commit of key=%s within %ss "
                        "(state_commit_timeout_s); answering without it",
                        shown_id(cohort.key, ID_LOGGED_LIMIT),
                        self._commit_timeout_s,
                    )
                    raise
        finally:
            if record.phase == "completed":  # published now: the waiters wake with their rewards
                now = trio.current_time()
                self.metrics.group_latency_seconds.observe(now - cohort.created_at)
                if cohort.complete_at is not None:  # the last member in -> rewards published
                    self.metrics.reward_latency_seconds.observe(now - cohort.complete_at)
            cohort.release()

    # --- /compare -----------------------------------------------------------------------------

    async def compare(self, item: CompareInput) -> CompareResult:
        """Batch comparison (docs/http-api.md, "POST /compare"): ``engine/compare.py``."""
        if self._closed:  # closed at once, before the batches in flight are cancelled
            raise CompareFailed(SHUTTING_DOWN, reason="shutting_down")
        return await self._compares.compare(item)

    # --- terminal records (durable state and checkpoints) ------------------------------------

    def terminal_records(self) -> list[TerminalRecord]:
        """Every retained terminal cohort's record, oldest first (checkpoint export)."""
        cohorts = [
            c for c in self._registry.cohorts.values() if c.terminal and c.record is not None
        ]
        cohorts.sort(key=lambda c: c.terminal_at or 0.0)
        return [c.record for c in cohorts if c.record is not None]

    def watermark_records(self) -> list[WatermarkRecord]:
        return [
            WatermarkRecord(group_id, w.latest_attempt, w.prompt_digest)
            for group_id, w in self._registry.watermarks.items()
        ]

    def checkpoint(self) -> dict[str, Any]:
        """The checkpoint v1 export of every terminal record and watermark.

        docs/durable-state.md, "Checkpoint format, version 1".
        """
        return checkpoint(self)

    async def restore(self, data: object) -> RestoreReport:
        """Merge a checkpoint v1 body; raises CheckpointError (an invalid body) before applying
        anything."""
        return await restore(self, data, num_rollouts=self.settings.num_rollouts_per_prompt)

    async def restore_records(
        self,
        records: Iterable[TerminalRecord],
        watermarks: Iterable[WatermarkRecord] = (),
        *,
        age_s: Mapping[str, float] | None = None,
        watermark_age_s: Mapping[str, float] | None = None,
    ) -> RestoreReport:
        """Merge terminal records and watermarks (docs/durable-state.md, "Restore rules"): an
        absent key is added with a fresh retention clock (or one set back by ``age_s[key]``), an
        identical record is left alone, anything else is a conflict; a watermark is raised (its
        clock set back by ``watermark_age_s[group_id]``) when the digests agree, and supersedes
        the group's active older attempts as a newer request would. Restored members
        replay without judging. Added records and raised watermarks are committed to the store in
        one transaction (``commit_many``) before any of them is applied; if that fails, nothing is
        applied."""
        async with self._lock:
            if self._closed:
                raise RequestRejected(
                    Rejection.UNAVAILABLE, SHUTTING_DOWN, unavailable="shutting_down"
                )
            plan = plan_restore(self._registry, records, watermarks)
            if self._store is not None and (plan.adds or plan.raises):
                # bounded: the lock is held; a stalled store fails the restore, nothing applied
                with trio.CancelScope(shield=True, deadline=self._commit_deadline()) as bound:
                    await self._store.commit_many(
                        list(plan.adds.values()), list(plan.raises.values())
                    )
                if bound.cancelled_caught:
                    raise CommitTimeout("the restore's commit", self._commit_timeout_s)
            superseded = apply_restore(
                self._registry,
                plan,
                size=self.settings.num_rollouts_per_prompt,
                now=trio.current_time(),
                age_s=age_s,
                watermark_age_s=watermark_age_s,
            )
        return RestoreReport(
            len(plan.adds), plan.unchanged, len(plan.raises), plan.conflicts, superseded
        )


@asynccontextmanager
async def open_engine(
    settings: Settings,
    judge: Judge,
    *,
    metrics: Metrics | None = None,
    store: CohortStore | None = None,
) -> AsyncIterator[Engine]:
    """Open the engine nursery and yield the :class:`Engine`; on exit, ``aclose()`` it.

    The judge is not closed: it belongs to the caller.
    """
    metrics = metrics or Metrics()
    fleet = as_fleet(judge)  # one judge path: any judge is a fleet (judge/fleet.py)
    queue = judge_queue(fleet, settings, metrics)  # the judge queue's one owner
    async with trio.open_nursery() as nursery:
        engine = Engine(settings, fleet, metrics, store, nursery, queue)
        try:
            yield engine
        finally:
            # bounded: aclose waits for the lock (a refused request may hold it for one commit
            # timeout) and then for the cohort tasks (their terminal commits, one timeout each,
            # side by side); a margin of a second for the rest
            close_s = 2 * settings.state_commit_timeout_s + 1.0
            with trio.CancelScope(shield=True, deadline=trio.current_time() + close_s) as bound:
                await engine.aclose()
            if bound.cancelled_caught:
                log.error("GenRM engine did not close within %ss; cancelling its tasks", close_s)
            queue.close()  # a fleet that outlives this engine no longer holds its queue
            nursery.cancel_scope.cancel()
