"""The run of one group: collection, then evaluation under the group deadline, then the scores.

:class:`GroupRunner` holds what every group's run shares (the settings, the judge's `Comparator`,
the critical-path judge queue, the comparison plan of rollout-cohort groups); its
:meth:`~GroupRunner.run_group` is the body of a cohort's run task, from its first member to its
published scores (docs/architecture.md, "One group"). :class:`GroupRun` is one group's state
between collection and evaluation: its evaluation, which comparisons have started
(engine/readiness.py) and its place in the judge queue.

Every comparison of a group runs in one nursery inside the cohort's scope, so a failure while
the group collects (collection deadline, supersession, shutdown) cancels the comparisons it
started. The group deadline is set on the scope around that nursery when the group is complete,
so it bounds the comparisons started earlier too, from that moment on.
"""

from __future__ import annotations

import itertools
import logging
from typing import Final, assert_never, final

import trio

from genrm_trio.config import Settings
from genrm_trio.domain.model import Masked, Scored
from genrm_trio.domain.scoring import (
    CYCLE_RATE,
    PlannedComparison,
    plan_comparisons,
    plan_fixed_baseline,
)
from genrm_trio.domain.text import ID_LOGGED_LIMIT, judge_text, shown_id
from genrm_trio.engine import machine
from genrm_trio.engine.cohort import Cohort, Member
from genrm_trio.engine.evaluation import (
    POSITION_DISAGREEMENT,
    AllMasked,
    Evaluation,
    MemberText,
    judge_principle,
    score_cohort,
    scored_off_loop,
    shown_preferences,
)
from genrm_trio.engine.keys import compares_with_baseline
from genrm_trio.engine.readiness import Readiness, ReadinessIndex
from genrm_trio.judge.attempts import Comparator
from genrm_trio.judge.base import JudgeCall, JudgeError, Usage, one_line, unreachable_note
from genrm_trio.judge.offload import score_off_loop
from genrm_trio.judge.queue import JudgeQueue, QueueGroup, QueueTicket
from genrm_trio.metrics import Metrics

__all__ = ["GroupRun", "GroupRunner"]

log = logging.getLogger("genrm_trio.engine")

INCONSISTENT_RUBRIC_IDS: Final = "GenRM cohort members have inconsistent expected_rubric_ids"
INCONSISTENT_BASELINE: Final = "GenRM cohort members have inconsistent baseline_response values"
# a group whose members disagree in both ways reports the rubric ids first
_DISAGREEMENTS: Final = (INCONSISTENT_RUBRIC_IDS, INCONSISTENT_BASELINE)


@final
class GroupRun:
    """What one cohort's run keeps between collection and evaluation."""

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
class GroupRunner:
    """Runs groups for one engine: each cohort's run task awaits :meth:`run_group`."""

    def __init__(
        self, settings: Settings, metrics: Metrics, comparator: Comparator, queue: JudgeQueue
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self._comparator = comparator
        self._queue = queue
        # one scoring thread at a time; other large groups wait their turn here (a bounded queue:
        # at most the active cohorts), each scored whole by `score_cohort` off the event loop
        self._scoring_thread = trio.CapacityLimiter(1)
        # the plan of every rollout-cohort group and its readiness index, shared: made here, so
        # a `regular` graph's choice (costly at large N, docs/benchmarks.md "The regular graph's
        # choice") is paid at the start and never on a group's path
        self._shared_plan: tuple[list[PlannedComparison], ReadinessIndex] | None = None
        if not compares_with_baseline(settings) and settings.num_rollouts_per_prompt > 1:
            self._shared_plan = self._plan(settings.num_rollouts_per_prompt)

    def _plan(self, size: int) -> tuple[list[PlannedComparison], ReadinessIndex]:
        s = self.settings
        plan = plan_comparisons(
            size,
            s.comparison_strategy,
            s.num_judges_per_comparison,
            s.position_balance,
            s.comparisons_per_rollout,
        )
        return plan, ReadinessIndex(plan, size)

    async def run_group(self, cohort: Cohort) -> None:
        """One group from its first member to its scores (docs/architecture.md, "One group").

        Returns when the cohort is terminal or its scores are published; a failure of the group
        (collection deadline, the group deadline under ``fail_group``, every member masked) is
        the cohort's terminal state. Raises whatever else escapes a comparison (ValueError for
        members that disagree): the run task fails the cohort with it."""
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
                    cohort.fail(  # cancels the cohort's scope: every comparison started hangs up
                        "cohort",
                        f"GenRM cohort {shown_id(cohort.key)} did not collect {cohort.size} unique "
                        f"rollout indices within {s.cohort_collection_timeout_s}s",
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
            await self._conclude(
                cohort, run.evaluation, texts, deadline=group_deadline.cancelled_caught
            )

    def _new_run(self, cohort: Cohort) -> GroupRun:
        """The cohort's comparisons (known from its creation: size, strategy, key) and its place
        in the judge queue; the judge texts are set once the group is complete
        (`_read_members`)."""
        s = self.settings
        if compares_with_baseline(s):
            plan = plan_fixed_baseline(cohort.size, s.num_judges_per_comparison, cohort.key)
            index = ReadinessIndex(plan, cohort.size)
            slots = cohort.size + 1  # the baseline is index N
        else:
            # made in __init__: a rollout cohort exists only when N > 1 (`Settings.cohorting`)
            assert self._shared_plan is not None
            plan, index = self._shared_plan
            slots = cohort.size
        evaluation = Evaluation(
            plan, [""] * slots, cohort.history, judge_principle(s, cohort.principle)
        )
        cohort.history = []  # the evaluation has its own copy from now on
        if s.eager_comparisons:
            evaluation.done_before_complete = 0
        return GroupRun(cohort, evaluation, index, self._queue.group(complete=False))

    def _disagreement(self, cohort: Cohort, member: Member) -> str | None:
        """How ``member`` disagrees with its cohort (rubric ids, baseline), or None: the one
        consistency check, of an arriving member and of the complete group."""
        if member.rubric_ids != cohort.rubric_ids:
            return INCONSISTENT_RUBRIC_IDS
        if compares_with_baseline(self.settings) and (
            cohort.baseline is None or member.baseline_digest != cohort.baseline_digest
        ):
            return INCONSISTENT_BASELINE
        return None

    def _read_members(self, cohort: Cohort, evaluation: Evaluation) -> dict[int, MemberText]:
        """The complete group's texts, once each; every judge text set. Raises ValueError for
        members that disagree (a cohort failure)."""
        members = [cohort.members[i] for i in range(cohort.size)]
        found = {self._disagreement(cohort, m) for m in members}
        for disagreement in _DISAGREEMENTS:
            if disagreement in found:
                raise ValueError(disagreement)
        texts = {m.index: MemberText(*m.texts()) for m in members}  # one read of each
        judge_texts = [judge_text(t.answer_text) for t in texts.values()]
        if compares_with_baseline(self.settings):
            assert cohort.baseline is not None  # `_disagreement` checked it
            judge_texts.append(judge_text(cohort.baseline))
        evaluation.judge_texts = judge_texts
        return texts

    async def _collect_eagerly(self, run: GroupRun, nursery: trio.Nursery) -> None:
        """While the group collects, start each comparison once both of its members are in.

        Returns when the group is complete; the last member's comparisons are left to the
        complete group (they start with its priority)."""
        cohort = run.cohort
        while True:
            arrived = list(itertools.islice(cohort.members, run.members_seen, None))
            run.members_seen += len(arrived)
            if cohort.state != "collecting":
                return
            present = [m for m in arrived if self._disagreement(cohort, cohort.members[m]) is None]
            ready = run.readiness.arrive(present)
            # Claimed only once the machine agrees (machine.start_comparisons): a comparison it
            # refuses stays unstarted, for the complete group (`readiness.rest`).
            if ready and machine.start_comparisons(cohort):
                run.readiness.take(ready)
                self.metrics.eager_comparisons.inc(len(ready))
                self._start_eagerly(run, nursery, ready)
            # No checkpoint between the scan above and this event: no arrival is missed.
            cohort.arrival = trio.Event()
            await cohort.arrival.wait()

    def _start_eagerly(self, run: GroupRun, nursery: trio.Nursery, ready: list[int]) -> None:
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
        self, run: GroupRun, nursery: trio.Nursery, c: int, call: JudgeCall | None = None
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

    async def _conclude(
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
            # one group ended by its deadline, whatever its policy does with it
            self.metrics.deadline_failures.labels("evaluation").inc()
            # comparisons that waited for a judge that could not be reached say so
            why = unreachable_note(self._comparator.unreachable_for())
            match s.evaluation_deadline_policy:  # exhaustive: mypy fails until each has a case
                case "fail_group":
                    cohort.fail(
                        "judge", f"GenRM cohort evaluation deadline exceeded after {timeout}s{why}"
                    )
                    return
                case "mask_pending":  # docs/differences.md, D12
                    for c in evaluation.pending():
                        planned = evaluation.plan[c]
                        self._comparison_failed(
                            cohort,
                            evaluation,
                            c,
                            f"GenRM comparison {planned.pair} (judge {planned.k}) was still "
                            f"running at the group deadline ({timeout}s) and was cancelled{why}",
                            None,
                        )
                case _:
                    assert_never(s.evaluation_deadline_policy)
        if scored_off_loop(len(evaluation.judge_texts), len(evaluation.plan)):
            # every comparison has ended, so nothing else touches the evaluation meanwhile; a
            # cancellation (supersession, shutdown) waits for the thread, then applies
            outcome = await score_off_loop(
                lambda: score_cohort(s, evaluation, cohort.size, texts), self._scoring_thread
            )
            if cohort.state != "judging":  # failed or superseded while it was being scored
                return
        else:
            outcome = score_cohort(s, evaluation, cohort.size, texts)
        if isinstance(outcome, AllMasked):
            cohort.fail("judge", outcome.message)
        elif not machine.publish(cohort, outcomes=outcome):
            log.debug(
                "Discarding late GenRM completion for key=%s", shown_id(cohort.key, ID_LOGGED_LIMIT)
            )
        else:
            self._observe_judge(evaluation, outcome)

    def _observe_judge(self, evaluation: Evaluation, outcome: dict[int, Scored | Masked]) -> None:
        """A scored group's position preferences, order disagreement and preference cycles:
        the judge on live traffic (docs/operations.md)."""
        first, second, tie = shown_preferences(evaluation)
        verdicts = self.metrics.judge_verdicts
        verdicts.labels("first").inc(first)
        verdicts.labels("second").inc(second)
        verdicts.labels("tie").inc(tie)
        row = next((o.result for o in outcome.values() if isinstance(o, Scored)), None)
        if row is None:
            return
        disagreement, cycles = row.get(POSITION_DISAGREEMENT), row.get(CYCLE_RATE)
        if isinstance(disagreement, float):  # None: no pair judged in both orders
            self.metrics.group_position_disagreement.observe(disagreement)
        if isinstance(cycles, float):  # absent or None: not bradley_terry, or no triangle
            self.metrics.group_preference_cycles.observe(cycles)

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
