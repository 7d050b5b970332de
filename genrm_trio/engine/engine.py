"""The engine: `/verify` cohorts and `/compare` batches on one engine-owned trio nursery.

``open_engine(settings, judge)`` opens the nursery that owns every cohort's run (collection
deadline, then evaluation under the group deadline; with ``eager_comparisons`` each comparison
starts once both of its members are in, while the group collects) and every `/verify` judge
call, each waiting for its slot in the critical-path judge queue (judge/queue.py); request
handlers only attach waiters and wait, so a client disconnect cancels its own wait and never a
cohort (docs/architecture.md, "How cancellation flows"). Cohort tasks start in a fresh, empty
``contextvars`` context so that no per-request variable leaks into shared judge calls. `/compare`
runs in the request's own task and context, fail-fast, under ``cohort_evaluation_timeout_s``
(docs/differences.md, D40 / D27).

The request algorithm is docs/architecture.md "One /verify request", in order. The registry
section (prune, watermarks, supersession, get-or-create) is synchronous under one lock, and so is
attaching, so a state transition (the final arrival's ``start_judging`` or the collection timer's
``fail``) decides every race: all members get rewards or none do. With a durable store the
section only *queues* its commit points (docs/architecture.md "Durable-state commit points": the
advanced watermark, the new cohort's ``open`` record) in registry order; the request then
leaves the lock, waits for its commits, and attaches only after them. Members of a cohort whose
``open`` record is still being committed wait for it (a per-cohort event set by the creating
request) before they attach; ``_attach`` re-reads the cohort's state afterwards, so a cohort
superseded or shut down meanwhile answers with its failure. The store applies commits in
submission order, so it sees watermark, then ``open``, then terminal.
"""

from __future__ import annotations

import contextvars
import itertools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Final, final

import trio

from genrm_trio.config import Settings
from genrm_trio.domain.checkpoint import RestoreReport, checkpoint, restore
from genrm_trio.domain.model import (
    SHUTTING_DOWN,
    CohortView,
    CompareFailed,
    CompareInput,
    CompareResult,
    FailureKind,
    GroupFailed,
    MemberOutcome,
    Rejection,
    RequestRejected,
    Scored,
    VerifyInput,
)
from genrm_trio.domain.records import OpenRecord, TerminalRecord, WatermarkRecord
from genrm_trio.domain.scoring import PlannedComparison, plan_comparisons, plan_fixed_baseline
from genrm_trio.domain.text import (
    answer_text,
    judge_text,
    reasoning_text,
    response_digest,
)
from genrm_trio.engine import machine
from genrm_trio.engine.cohort import Cohort, Member, Waiter
from genrm_trio.engine.compare import Comparisons
from genrm_trio.engine.evaluation import (
    AllMasked,
    Evaluation,
    MemberText,
    default_result,
    judge_principle,
    score_cohort,
)
from genrm_trio.engine.exceptions import leaves
from genrm_trio.engine.keys import RUBRIC_REQUIRED, CohortKey, cohort_key
from genrm_trio.engine.readiness import Readiness, ReadinessIndex
from genrm_trio.engine.registry import KEY_LOG_LIMIT, Registry
from genrm_trio.engine.restore import apply_restore, plan_restore
from genrm_trio.judge.attempts import Comparator, ComparatorStatistics
from genrm_trio.judge.base import (
    Judge,
    JudgeCall,
    JudgeError,
    ReplicaReporting,
    ReplicaStats,
    Usage,
    one_line,
)
from genrm_trio.judge.queue import QueueGroup, QueueTicket
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
class _GroupRun:
    """What one cohort's run task keeps between collection and evaluation."""

    __slots__ = ("cohort", "evaluation", "members_seen", "queue_group", "readiness")

    def __init__(
        self,
        cohort: Cohort,
        evaluation: Evaluation,
        readiness: ReadinessIndex,
        queue_group: QueueGroup,
    ) -> None:
        self.cohort = cohort
        self.evaluation = evaluation
        self.queue_group = queue_group
        self.readiness = Readiness(readiness)
        self.members_seen = 0  # members in arrival order (`cohort.members`) already looked at


@final
class Engine:
    """Cohort verification and batch comparison. Create it with :func:`open_engine`."""

    def __init__(
        self,
        settings: Settings,
        judge: Judge,
        metrics: Metrics,
        store: CohortStore | None,
        nursery: trio.Nursery,
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
        self._comparator = Comparator(judge, settings, metrics)
        self._queue = self._comparator.limiter  # the critical-path judge queue (judge/queue.py)
        self._fleet = judge if isinstance(judge, ReplicaReporting) else None
        if self._fleet is not None:
            metrics.watch_replicas(self._fleet.replica_stats)
        self._registry = Registry(settings, metrics)
        self._lock = trio.Lock()
        self._closed = False
        self._running = 0
        self._idle = trio.Event()
        self._idle.set()
        self._compares = Comparisons(settings, self._comparator, metrics)
        # the plan of every rollout-cohort group and its readiness index, shared (made once)
        self._shared_plan: tuple[list[PlannedComparison], ReadinessIndex] | None = None

    # --- public surface ---------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed

    def active_cohorts(self) -> list[CohortView]:
        """Collecting and judging cohorts, oldest first (``GET /cohorts``, docs/http-api.md)."""
        return self._registry.views(trio.current_time())

    def judge_replicas(self) -> list[ReplicaStats]:
        """Per-replica counters of the judge (``GET /judge/replicas``): one per base URL, a single
        URL being a fleet of one; [] for a judge that reports none (a simulated one)."""
        return [] if self._fleet is None else self._fleet.replica_stats()

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
                    self._fail(cohort, "cohort", SHUTTING_DOWN)
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
            raise RequestRejected(Rejection.UNAVAILABLE, SHUTTING_DOWN)
        if s.score_source == "rubric_mean" and not item.expected_rubric_ids:
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
                return cohort, index, self._attach(cohort, member, digest)
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
                self._fail(
                    cohort,
                    "cohort",
                    f"GenRM durable store could not record cohort "
                    f"{key[:KEY_LOG_LIMIT]!r}: {type(failure).__name__}: {failure}",
                )
            opening.set()
        if failure is not None:
            raise failure
        return cohort, index, self._attach(cohort, member, digest)

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
        """Watermarks and supersession, then get or create the cohort (docs/architecture.md,
        "Keys, digests and replay").

        Synchronous: with a store, the commit points are queued onto ``commits`` in order.
        Returns the cohort and whether this request created it."""
        key, digest = arrival.key, arrival.digest
        store = self._store
        s = self.settings
        reg = self._registry
        if self._closed:
            raise RequestRejected(Rejection.UNAVAILABLE, SHUTTING_DOWN)
        now = trio.current_time()
        reg.prune(now)
        group_id = arrival.group_id
        attempt = arrival.group_attempt
        advances = False
        if group_id is not None:
            watermark = reg.watermarks.get(group_id)
            if watermark is not None and watermark.prompt_digest != digest:
                raise RequestRejected(
                    Rejection.CONFLICT,
                    f"GenRM group {group_id!r} received inconsistent prompt or principle content",
                )
            if watermark is not None and attempt < watermark.latest_attempt:
                raise RequestRejected(
                    Rejection.CONFLICT,
                    f"GenRM group {group_id!r} attempt {attempt} was superseded by attempt "
                    f"{watermark.latest_attempt}",
                )
            advances = watermark is None or attempt > watermark.latest_attempt
        if reg.get(key) is None:
            active = len(reg.active)
            if advances and group_id is not None:
                active -= sum(1 for c in reg.group_actives(group_id) if c.group_attempt < attempt)
            if active >= s.server.max_active_cohorts:
                raise RequestRejected(
                    Rejection.UNAVAILABLE,
                    f"GenRM server is at capacity ({len(reg.active)} active cohorts); retry later",
                    retry_after_s=1.0,
                )
        if group_id is not None:
            if advances:
                reg.set_watermark(group_id, attempt, digest, now)
                for old in reg.group_actives(group_id):
                    if old.group_attempt < attempt:
                        self._fail(
                            old,
                            "cohort",
                            f"GenRM group {group_id!r} attempt {old.group_attempt} was superseded "
                            f"by attempt {attempt}",
                        )
                if store is not None:
                    commits.append(
                        store.submit_watermark(WatermarkRecord(group_id, attempt, digest))
                    )
            else:
                reg.touch_watermark(group_id, now)
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

    def _attach(self, cohort: Cohort, member: Member, digest: str) -> Waiter | MemberOutcome:
        """The replay/conflict matrix, then attach (docs/architecture.md, "Keys, digests and
        replay"). Synchronous."""
        index = member.index
        if cohort.prompt_digest != digest:
            raise RequestRejected(
                Rejection.CONFLICT,
                f"GenRM cohort {cohort.key!r} received inconsistent prompt or principle content",
            )
        state = cohort.state
        if state == "failed":
            return cohort.failure_outcome()
        if cohort.terminal:
            assert cohort.record is not None
            record = cohort.record.members.get(index)
            if record is None:
                raise RequestRejected(
                    Rejection.CONFLICT,
                    f"GenRM cohort {cohort.key!r} is already {machine.wire_phase(state)}; "
                    f"rollout_index={index} cannot be added",
                )
            if not record.masked_alone and record.response_digest != member.response_digest:
                raise RequestRejected(
                    Rejection.CONFLICT,
                    f"GenRM cohort {cohort.key!r} already has a different response for "
                    f"rollout_index={index}",
                )
            return cohort.outcome_of(record)
        present = cohort.members.get(index)
        waiter = Waiter()
        if present is not None:
            if present.response_digest != member.response_digest:
                raise RequestRejected(
                    Rejection.CONFLICT,
                    f"GenRM cohort {cohort.key!r} already has a different response for "
                    f"rollout_index={index}",
                )
            present.waiters.append(waiter)
            return waiter
        if state != "collecting":
            raise RequestRejected(
                Rejection.CONFLICT,
                f"GenRM cohort {cohort.key!r} is already {machine.wire_phase(state)}; "
                f"rollout_index={index} cannot be added",
            )
        member.waiters.append(waiter)
        cohort.add_member(member)
        machine.start_judging(cohort)  # guarded by is_full: a no-op until all N are present
        return waiter

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

    def _fail(self, cohort: Cohort, kind: FailureKind, message: str) -> bool:
        return machine.fail(cohort, failure=GroupFailed(kind, message))

    async def _run(self, cohort: Cohort) -> None:
        """Collection, then evaluation (`_judge`); finally commit the record and release."""
        try:
            with cohort.scope:
                await self._judge(cohort)
        except Exception as exc:
            errors = leaves(exc)  # every leaf of a (nested) group, each with its traceback
            for n, error in enumerate(errors, 1):
                log.error(
                    "GenRM cohort evaluation failed for key=%r%s",
                    cohort.key[:KEY_LOG_LIMIT],
                    f" ({n} of {len(errors)} errors)" if len(errors) > 1 else "",
                    exc_info=error,
                )
            error = errors[0]
            self._fail(
                cohort,
                "cohort",
                f"GenRM cohort evaluation failed: {type(error).__name__}: {str(error)[:1000]}",
            )
        finally:
            if not cohort.terminal:
                self._fail(cohort, "cohort", "GenRM cohort evaluation was cancelled")
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
                        "GenRM durable store failed to commit key=%r", cohort.key[:KEY_LOG_LIMIT]
                    )
                except trio.Cancelled:  # shielded by the caller: only its deadline gets here
                    log.error(
                        "GenRM durable store did not confirm the commit of key=%r within %ss "
                        "(state_commit_timeout_s); answering without it",
                        cohort.key[:KEY_LOG_LIMIT],
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

    def _new_run(self, cohort: Cohort) -> _GroupRun:
        """The cohort's comparisons (known from its creation: size, strategy, key) and its place
        in the judge queue; the judge texts are set once the group is complete
        (`_read_members`)."""
        s = self.settings
        if s.comparison_mode == "fixed_baseline":
            plan = plan_fixed_baseline(cohort.size, s.num_judges_per_comparison, cohort.key)
            index = ReadinessIndex(plan, cohort.size)
            slots = cohort.size + 1  # the baseline is index N
        else:
            if self._shared_plan is None:
                shared = plan_comparisons(
                    cohort.size,
                    s.comparison_strategy,
                    s.num_judges_per_comparison,
                    s.position_balance,
                )
                self._shared_plan = shared, ReadinessIndex(shared, cohort.size)
            plan, index = self._shared_plan
            slots = cohort.size
        evaluation = Evaluation(
            plan, [""] * slots, cohort.history, judge_principle(s, cohort.principle)
        )
        cohort.history = []  # the evaluation has its own copy from now on
        if s.eager_comparisons:
            evaluation.done_before_complete = 0
        return _GroupRun(cohort, evaluation, index, self._queue.group(complete=False))

    def _consistent(self, cohort: Cohort, member: Member) -> bool:
        """The member agrees with its cohort on rubric ids and baseline (`_read_members`)."""
        if member.rubric_ids != cohort.rubric_ids:
            return False
        if self.settings.comparison_mode == "fixed_baseline":
            return cohort.baseline is not None and member.baseline_digest == cohort.baseline_digest
        return True

    def _read_members(self, cohort: Cohort, evaluation: Evaluation) -> dict[int, MemberText]:
        """The complete group's texts, once each; every judge text set. Raises ValueError for
        members that disagree (a cohort failure)."""
        s = self.settings
        members = [cohort.members[i] for i in range(cohort.size)]
        for m in members:
            if m.rubric_ids != cohort.rubric_ids:
                raise ValueError("GenRM cohort members have inconsistent expected_rubric_ids")
        texts = {m.index: MemberText(*m.texts()) for m in members}  # one read of each
        judge_texts = [judge_text(t.answer_text) for t in texts.values()]
        if s.comparison_mode == "fixed_baseline":
            if cohort.baseline is None or any(
                m.baseline_digest != cohort.baseline_digest for m in members
            ):
                raise ValueError("GenRM cohort members have inconsistent baseline_response values")
            judge_texts.append(judge_text(cohort.baseline))
        evaluation.judge_texts = judge_texts
        return texts

    async def _judge(self, cohort: Cohort) -> None:
        """One group from its first member to its scores (docs/architecture.md, "One group").

        Every comparison runs in one nursery inside the cohort's scope: a failure while the
        group collects (collection deadline, supersession, shutdown) cancels the comparisons it
        started. The group deadline is set on the scope around that nursery when the group is
        complete, so it bounds the comparisons started earlier too, from that moment on."""
        s = self.settings
        # Without eager starts nothing is planned before the group is complete, as before.
        run = self._new_run(cohort) if s.eager_comparisons else None
        texts: dict[int, MemberText] | None = None
        with trio.CancelScope() as group_deadline:
            async with trio.open_nursery() as nursery:
                with trio.move_on_at(cohort.collect_deadline):
                    if run is not None:
                        cohort.comparisons_total = run.evaluation.total
                        await self._collect_eagerly(run, nursery)
                    else:
                        await cohort.full.wait()
                if cohort.state == "collecting":
                    self.metrics.deadline_failures.labels("collection").inc()
                    self._fail(  # cancels the cohort's scope: every comparison started hangs up
                        cohort,
                        "cohort",
                        f"GenRM cohort {cohort.key!r} did not collect {cohort.size} unique rollout "
                        f"indices within {s.cohort_collection_timeout_s}s",
                    )
                    return
                if cohort.state != "judging":
                    return
                cohort.eval_deadline = trio.current_time() + s.cohort_evaluation_timeout_s
                group_deadline.deadline = cohort.eval_deadline
                if run is None:
                    run = self._new_run(cohort)
                evaluation = run.evaluation
                texts = self._read_members(cohort, evaluation)
                cohort.comparisons_total = evaluation.total
                run.queue_group.mark_complete()  # its waiting attempts go first from now on
                for c in run.readiness.rest():
                    self._start(run, nursery, c)
        if run is not None and texts is not None and cohort.state == "judging":
            self._conclude(cohort, run.evaluation, texts, deadline=group_deadline.cancelled_caught)

    async def _collect_eagerly(self, run: _GroupRun, nursery: trio.Nursery) -> None:
        """While the group collects, start each comparison once both of its members are in.

        Returns when the group is complete; the last member's comparisons are left to the
        complete group (they start with its priority)."""
        cohort = run.cohort
        while True:
            arrived = list(itertools.islice(cohort.members, run.members_seen, None))
            run.members_seen += len(arrived)
            if cohort.state != "collecting":
                return
            present = [m for m in arrived if self._consistent(cohort, cohort.members[m])]
            ready = run.readiness.arrive(present)
            if ready and machine.start_comparisons(cohort, count=len(ready)):
                self.metrics.eager_comparisons.inc(len(ready))
                self._start_eagerly(run, nursery, ready)
            # No checkpoint between the scan above and this event: no arrival is missed.
            cohort.arrival = trio.Event()
            await cohort.arrival.wait()

    def _start_eagerly(self, run: _GroupRun, nursery: trio.Nursery, ready: list[int]) -> None:
        """Start comparisons of a collecting group. Each member's text is read once for them and
        then held only by their calls: a waiting member keeps its compressed texts (D22), not a
        judge text beside them (so this is a function of its own: no frame keeps ``texts``)."""
        cohort, evaluation = run.cohort, run.evaluation
        texts: dict[int, str] = {}
        for c in ready:
            planned = evaluation.plan[c]
            for x in planned.shown:
                if x not in texts:
                    texts[x] = self._eager_judge_text(cohort, x)
            self._start(run, nursery, c, evaluation.call(planned, texts))

    def _eager_judge_text(self, cohort: Cohort, index: int) -> str:
        if index == cohort.size:  # the fixed baseline, known from the first member
            assert cohort.baseline is not None
            return judge_text(cohort.baseline)
        return judge_text(cohort.members[index].texts()[1])

    def _start(
        self, run: _GroupRun, nursery: trio.Nursery, c: int, call: JudgeCall | None = None
    ) -> None:
        """Start comparison ``c`` with its place in the judge queue (taken now: ready order)."""
        ticket = self._queue.ticket(run.queue_group)
        evaluation = run.evaluation
        planned = evaluation.plan[c]
        if call is None:
            call = evaluation.call(planned)
        nursery.start_soon(
            self._verify_comparison, run.cohort, evaluation, c, planned, call, ticket
        )

    def _conclude(
        self,
        cohort: Cohort,
        evaluation: Evaluation,
        texts: dict[int, MemberText],
        *,
        deadline: bool,
    ) -> None:
        """The group deadline's policy, then masking and scores, then publish."""
        s = self.settings
        timeout = s.cohort_evaluation_timeout_s
        if deadline:
            if s.evaluation_deadline_policy == "fail_group":
                self.metrics.deadline_failures.labels("evaluation").inc()
                self._fail(
                    cohort, "judge", f"GenRM cohort evaluation deadline exceeded after {timeout}s"
                )
                return
            for c in evaluation.pending():  # mask_pending (docs/differences.md, D12)
                planned = evaluation.plan[c]
                self.metrics.deadline_failures.labels("evaluation").inc()
                self._comparison_failed(
                    cohort,
                    evaluation,
                    c,
                    f"GenRM comparison {planned.pair} (judge {planned.k}) was still running at "
                    f"the group deadline ({timeout}s) and was cancelled",
                    None,
                )
        outcome = score_cohort(s, evaluation, cohort.size, texts)
        if isinstance(outcome, AllMasked):
            self._fail(cohort, "judge", outcome.message)
        elif not machine.publish(cohort, outcomes=outcome):
            log.debug("Discarding late GenRM completion for key=%r", cohort.key[:KEY_LOG_LIMIT])

    async def _verify_comparison(
        self,
        cohort: Cohort,
        evaluation: Evaluation,
        c: int,
        planned: PlannedComparison,
        call: JudgeCall,
        ticket: QueueTicket,
    ) -> None:
        """One comparison of a cohort: a JudgeError is recorded, anything else escapes."""
        try:
            result = await self._comparator.compare(
                call,
                pair=planned.pair,
                judge_pass=planned.k,
                expected_rubric_ids=cohort.rubric_ids,
                ticket=ticket,
            )
        except JudgeError as error:
            self._comparison_failed(
                cohort, evaluation, c, error.message, error.usage, error.escalations
            )
            return
        evaluation.results[c] = result
        self._comparison_done(cohort, evaluation)

    def _comparison_done(self, cohort: Cohort, evaluation: Evaluation) -> None:
        cohort.comparisons_done += 1
        if cohort.state == "collecting" and evaluation.done_before_complete is not None:
            evaluation.done_before_complete += 1

    def _comparison_failed(
        self,
        cohort: Cohort,
        evaluation: Evaluation,
        c: int,
        message: str,
        usage: Usage | None,
        escalations: int = 0,
    ) -> None:
        planned = evaluation.plan[c]
        evaluation.errors[c] = message
        evaluation.error_usage[c] = usage
        evaluation.error_escalations[c] = escalations
        self._comparison_done(cohort, evaluation)
        cohort.comparisons_failed += 1
        self.metrics.failed_comparisons.inc()
        log.warning(
            "GenRM dropped comparison %s (judge %s) of %s after a judge failure: %s",
            planned.pair,
            planned.k,
            evaluation.total,
            one_line(message, 2000),
        )

    # --- /compare -----------------------------------------------------------------------------

    async def compare(self, item: CompareInput) -> CompareResult:
        """Batch comparison (docs/http-api.md, "POST /compare"): ``engine/compare.py``."""
        if self._closed:  # closed at once, before the batches in flight are cancelled
            raise CompareFailed(SHUTTING_DOWN)
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
        clock set back by ``watermark_age_s[group_id]``) when the digests agree. Restored members
        replay without judging. Added records and raised watermarks are committed to the store in
        one transaction (``commit_many``) before any of them is applied; if that fails, nothing is
        applied."""
        async with self._lock:
            if self._closed:
                raise RequestRejected(Rejection.UNAVAILABLE, SHUTTING_DOWN)
            plan = plan_restore(self._registry, records, watermarks)
            if self._store is not None and (plan.adds or plan.raises):
                # bounded: the lock is held; a stalled store fails the restore, nothing applied
                with trio.CancelScope(shield=True, deadline=self._commit_deadline()) as bound:
                    await self._store.commit_many(
                        list(plan.adds.values()), list(plan.raises.values())
                    )
                if bound.cancelled_caught:
                    raise CommitTimeout("the restore's commit", self._commit_timeout_s)
            apply_restore(
                self._registry,
                plan,
                size=self.settings.num_rollouts_per_prompt,
                now=trio.current_time(),
                age_s=age_s,
                watermark_age_s=watermark_age_s,
            )
        return RestoreReport(len(plan.adds), plan.unchanged, len(plan.raises), plan.conflicts)


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
    async with trio.open_nursery() as nursery:
        engine = Engine(settings, judge, metrics or Metrics(), store, nursery)
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
            nursery.cancel_scope.cancel()
