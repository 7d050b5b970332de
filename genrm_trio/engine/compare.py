"""`/compare`: one batch of answers judged pairwise in the caller's own task and context,
fail-fast, under ``cohort_evaluation_timeout_s`` (docs/http-api.md, "POST /compare";
docs/differences.md, D40 / D27).

:class:`Comparisons` runs the batches of one engine: the first judge error cancels the batch's
other comparisons and becomes its :class:`CompareFailed`; the deadline and the engine's shutdown
do too. A disconnect cancels the caller's task, and so its judge calls. In the judge queue a
batch is one group, complete from the start (its inputs arrive together), its comparisons in
plan order.
"""

from __future__ import annotations

import logging
from typing import assert_never, final

import trio

from genrm_trio.config import Settings
from genrm_trio.domain.exceptions import sole_leaf
from genrm_trio.domain.model import (
    SHUTTING_DOWN,
    CompareFailed,
    CompareInput,
    CompareResult,
    Rejection,
    RequestRejected,
)
from genrm_trio.domain.scoring import PlannedComparison, fitting_degree, plan_comparisons
from genrm_trio.domain.text import answer_text, judge_text, reasoning_text
from genrm_trio.engine.evaluation import (
    Evaluation,
    MemberText,
    compare_result,
    judge_principle,
    scored_off_loop,
)
from genrm_trio.engine.keys import RUBRIC_REQUIRED, rubric_mode
from genrm_trio.judge.attempts import Comparator
from genrm_trio.judge.base import JudgeError, unreachable_note
from genrm_trio.judge.offload import score_off_loop
from genrm_trio.judge.queue import JudgeQueue, QueueTicket
from genrm_trio.metrics import Metrics

__all__ = ["Comparisons"]

# The engine's logger: /compare is the engine's route, and operators filter on it.
log = logging.getLogger("genrm_trio.engine")


@final
class Comparisons:
    """The `/compare` batches of one engine (see the module docstring)."""

    def __init__(
        self, settings: Settings, comparator: Comparator, queue: JudgeQueue, metrics: Metrics
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self._comparator = comparator
        self._queue = queue  # the engine's judge queue: a batch is one complete group there
        self._closed = False
        self._compare_scopes: set[trio.CancelScope] = set()
        self._scoring_thread = trio.CapacityLimiter(1)  # large batches are scored one at a time

    @property
    def in_flight(self) -> int:
        """Batches being compared now."""
        return len(self._compare_scopes)

    def close(self) -> None:
        """Refuse new batches and cancel the ones in flight (each fails with the shutdown)."""
        self._closed = True
        for scope in list(self._compare_scopes):
            scope.cancel()

    async def compare(self, item: CompareInput) -> CompareResult:
        """Batch comparison (docs/http-api.md, "POST /compare"), fail-fast, in the caller's task."""
        s = self.settings
        if self._closed:
            raise CompareFailed(SHUTTING_DOWN, reason="shutting_down")
        if rubric_mode(s) and not item.expected_rubric_ids:
            raise RequestRejected(Rejection.INVALID, RUBRIC_REQUIRED)
        n = len(item.responses)
        if s.debug_logging:
            log.info("GenRM compare request: %s responses", n)
        if n < 2:
            return CompareResult([s.default_score] * n, None, None)
        texts = [MemberText(reasoning_text(r), answer_text(r)) for r in item.responses]
        degree = fitting_degree(n, s.comparisons_per_rollout)  # a batch has any size

        def plan_batch() -> list[PlannedComparison]:
            return plan_comparisons(
                n, s.comparison_strategy, s.num_judges_per_comparison, s.position_balance, degree
            )

        match s.comparison_strategy:  # exhaustive: mypy fails here until a new one has its case
            case "regular" if scored_off_loop(n, n * degree // 2 * s.num_judges_per_comparison):
                # a large regular batch: the graph's choice for a size not seen yet (cached
                # after) costs as much CPU as scoring it, so it is made off the loop too
                plan = await score_off_loop(plan_batch, self._scoring_thread)
            case "regular" | "circular" | "all_pairs":  # cheap to plan: on the loop
                plan = plan_batch()
            case _:
                assert_never(s.comparison_strategy)
        evaluation = Evaluation(
            plan,
            [judge_text(t.answer_text) for t in texts],
            item.history,
            judge_principle(s, item.principle),
        )
        first_error: list[JudgeError] = []
        timeout = s.cohort_evaluation_timeout_s
        scope = trio.CancelScope(deadline=trio.current_time() + timeout)
        self._compare_scopes.add(scope)
        # The batch is one complete group in the judge queue; each comparison's place is taken
        # here, in plan order (its task may start in any order).
        queue = self._queue
        batch = queue.group(complete=True)
        try:
            with scope:
                async with trio.open_nursery() as nursery:
                    for c, planned in enumerate(plan):
                        nursery.start_soon(
                            self._compare_one,
                            evaluation,
                            c,
                            planned,
                            item.expected_rubric_ids,
                            queue.ticket(batch),
                            first_error,
                            nursery.cancel_scope,
                        )
        except BaseExceptionGroup as group:
            leaf = sole_leaf(group)  # at any depth: a group of groups of one is still one
            if isinstance(leaf, Exception):
                raise leaf from group
            raise
        finally:
            self._compare_scopes.discard(scope)
        if first_error:
            raise CompareFailed(first_error[0].message)
        if scope.cancelled_caught:
            if self._closed:
                raise CompareFailed(SHUTTING_DOWN, reason="shutting_down")
            self.metrics.deadline_failures.labels("compare").inc()
            why = unreachable_note(self._comparator.unreachable_for())
            raise CompareFailed(f"GenRM compare deadline exceeded after {timeout}s{why}")
        try:
            if scored_off_loop(n, len(plan)):  # a large batch: a worker thread, one at a time
                result = await score_off_loop(
                    lambda: compare_result(s, evaluation, texts), self._scoring_thread
                )
            else:
                result = compare_result(s, evaluation, texts)
        except ValueError as exc:  # non-finite rewards: a failure, as for /verify
            raise CompareFailed(str(exc)) from None
        if s.debug_logging:
            log.info("GenRM compare final rewards: %s", [f"{r:.4f}" for r in result.rewards])
        return result

    async def _compare_one(
        self,
        evaluation: Evaluation,
        c: int,
        planned: PlannedComparison,
        rubric_ids: tuple[int, ...] | None,
        ticket: QueueTicket,
        first_error: list[JudgeError],
        siblings: trio.CancelScope,
    ) -> None:
        try:
            evaluation.results[c] = await self._comparator.compare(
                evaluation.call(planned),
                pair=planned.pair,
                judge_pass=planned.k,
                expected_rubric_ids=rubric_ids,
                ticket=ticket,
            )
        except JudgeError as error:
            if not first_error:
                first_error.append(error)
            siblings.cancel()  # fail-fast: every other comparison ends now
