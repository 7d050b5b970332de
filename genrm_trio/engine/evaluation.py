"""From comparison outcomes to member outcomes and result rows.

Pure (no trio): the engine runs the judge calls and records each planned comparison's outcome in
an :class:`Evaluation`; :func:`score_cohort` turns those into scored and masked members (the
masking rule is `domain/scoring/masking.py`, docs/scoring.md "4. Masking") or an all-masked group
failure (D30), and :func:`compare_result` into the `/compare` reply (docs/http-api.md,
"POST /compare"). The aggregation method is `domain/scoring/aggregation.py`'s table.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final, final

from genrm_trio.config import Settings
from genrm_trio.domain.model import CompareResult, JSONValue, Masked, Scored
from genrm_trio.domain.scoring import (
    RANKING_MIDPOINT,
    Aggregation,
    AllMasked,
    ComparisonStats,
    JudgedComparison,
    MemberTexts,
    PlannedComparison,
    aggregate,
    group_metrics,
    mask_members,
    position_disagreement_rate,
    swaps_positions,
)
from genrm_trio.engine.keys import rubric_mode
from genrm_trio.judge.base import ComparisonResult, JudgeCall, Usage

__all__ = [
    "EAGER_RATE_KEY",
    "NON_FINITE_MESSAGE",
    "AllMasked",
    "Evaluation",
    "MemberText",
    "compare_result",
    "default_result",
    "judge_principle",
    "score_cohort",
    "scored_off_loop",
    "shown_preferences",
]

NON_FINITE_MESSAGE: Final = "GenRM returned non-finite cohort rewards"
_RATE_KEYS: Final = (
    "genrm_failed_comparison_rate_per_group",
    "genrm_masked_rollout_rate_per_group",
)
POSITION_DISAGREEMENT: Final = "genrm_position_disagreement_rate_per_group"
EAGER_RATE_KEY: Final = "genrm_eager_comparison_rate_per_group"

INLINE_MAX_COMPARISONS: Final = 240
INLINE_MAX_VERTICES: Final = 33
"""Groups within both bounds are scored on the event loop; larger ones in a worker thread
(`scored_off_loop`)."""


def scored_off_loop(vertices: int, comparisons: int) -> bool:
    """Whether scoring a group of this size runs in a worker thread rather than on the event loop
    (docs/architecture.md, "Scoring off the loop"). Within the bounds (16 rollouts all_pairs
    J = 2; a fit over 33 vertices), scoring takes a few milliseconds of CPU (docs/benchmarks.md,
    "Scoring at scale"), less than handing it to a thread and back costs in latency; beyond them
    it grows as N·d to N³ and would stall every other request."""
    return comparisons > INLINE_MAX_COMPARISONS or vertices > INLINE_MAX_VERTICES


@final
@dataclass(frozen=True, slots=True)
class MemberText:
    """A member's texts as its result row shows them and the adjustments measure them."""

    reasoning_text: str
    answer_text: str


class Evaluation:
    """The planned comparisons of one cohort or `/compare` call and what became of each.

    ``judge_texts[x]`` is the text shown to the judge for index ``x`` (the baseline at index N in
    fixed-baseline mode). Exactly one of ``results[c]`` / ``errors[c]`` is set once comparison
    ``c`` has finished; both are None while it is pending.
    """

    def __init__(
        self,
        plan: Sequence[PlannedComparison],
        judge_texts: Sequence[str],
        history: Sequence[Mapping[str, str]],
        principle: str | None,
    ) -> None:
        self.plan = list(plan)
        self.judge_texts = list(judge_texts)
        self.history = [dict(item) for item in history]
        self.principle = principle
        self.results: list[ComparisonResult | None] = [None] * len(self.plan)
        self.errors: list[str | None] = [None] * len(self.plan)
        self.error_usage: list[Usage | None] = [None] * len(self.plan)
        self.error_escalations: list[int] = [0] * len(self.plan)
        # comparisons finished while the group still collected (the engine counts them with
        # eager_comparisons; None: not reported)
        self.done_before_complete: int | None = None

    @property
    def total(self) -> int:
        return len(self.plan)

    def call(self, planned: PlannedComparison, texts: Mapping[int, str] | None = None) -> JudgeCall:
        """The judge call of ``planned``, from ``judge_texts`` or the given texts by index."""
        first, second = planned.shown
        shown: Mapping[int, str] | Sequence[str] = self.judge_texts if texts is None else texts
        return JudgeCall(
            history=self.history,
            response_1=shown[first],
            response_2=shown[second],
            principle=self.principle,
        )

    def pending(self) -> list[int]:
        return [c for c in range(self.total) if self.results[c] is None and self.errors[c] is None]

    def judged(self, *, overall: bool = False) -> list[tuple[int, JudgedComparison]]:
        """Successful comparisons in member orientation (flipped back when shown swapped)."""
        out: list[tuple[int, JudgedComparison]] = []
        for c, planned in enumerate(self.plan):
            result = self.results[c]
            if result is None:
                continue
            verdict = result.overall if overall else result.selected
            triple = (verdict.score_1, verdict.score_2, verdict.ranking)
            scores = planned.to_member_orientation(triple)
            out.append((c, JudgedComparison(planned.i, planned.j, planned.k, scores)))
        return out

    def stats(self) -> list[ComparisonStats]:
        out: list[ComparisonStats] = []
        for c in range(self.total):
            result = self.results[c]
            if result is not None:
                usage: Usage | None = result.usage
                out.append(
                    ComparisonStats(
                        failed=False,
                        overall_parse_failed=bool(result.overall_parse_failed),
                        rubric_parse_failed=bool(result.rubric_parse_failed),
                        input_tokens=usage.input_tokens if usage else None,
                        output_tokens=usage.output_tokens if usage else None,
                        budget_hit=usage.budget_hit if usage else False,
                        escalated=result.escalations > 0,
                    )
                )
            else:
                usage = self.error_usage[c]
                out.append(
                    ComparisonStats(
                        failed=True,
                        overall_parse_failed=False,
                        rubric_parse_failed=False,
                        input_tokens=usage.input_tokens if usage else None,
                        output_tokens=usage.output_tokens if usage else None,
                        budget_hit=usage.budget_hit if usage else False,
                        escalated=self.error_escalations[c] > 0,
                    )
                )
        return out


def _member_texts(settings: Settings, text: MemberText) -> MemberTexts:
    """What the adjustments read of a member. The style density (regex scans of the answer, the
    costliest part of scoring) is computed only when the style penalty uses it."""
    if settings.group_style_penalty_coeff > 0:
        return MemberTexts.from_texts(text.reasoning_text, text.answer_text)
    return MemberTexts(len(text.reasoning_text.strip()), len(text.answer_text.strip()), 0.0)


def _aggregate(
    settings: Settings,
    comparisons: Sequence[JudgedComparison],
    population: Sequence[int],
    texts: Mapping[int, MemberTexts],
    *,
    adjust: bool,
) -> Aggregation:
    s = settings
    return aggregate(
        comparisons,
        population,
        texts,
        default_score=s.default_score,
        reasoning_bonus=s.reasoning_bonus if adjust else 0.0,
        answer_bonus=s.answer_bonus if adjust else 0.0,
        top_percentile=s.top_percentile,
        group_reasoning_length_penalty_coeff=(
            s.group_reasoning_length_penalty_coeff if adjust else 0.0
        ),
        group_answer_length_penalty_coeff=s.group_answer_length_penalty_coeff if adjust else 0.0,
        group_style_penalty_coeff=s.group_style_penalty_coeff if adjust else 0.0,
        method=s.aggregator_method,
        bradley_terry_prior=s.bradley_terry_prior,
    )


def _rubric_valid(
    settings: Settings,
    evaluation: Evaluation,
    population: Sequence[int],
    texts: Mapping[int, MemberTexts],
) -> dict[int, float | None]:
    """``reward_rubric_aggregate_valid`` of each member (docs/scoring.md, "rubric validity")."""
    out: dict[int, float | None] = dict.fromkeys(population)
    if not rubric_mode(settings):
        return out
    valid: list[JudgedComparison] = []
    touched: set[int] = set()
    for c, judged in evaluation.judged():
        result = evaluation.results[c]
        assert result is not None
        if result.rubric_parse_failed:
            touched.update((judged.i, judged.j))
        else:
            valid.append(judged)
    if not valid:
        return out
    base = _aggregate(settings, valid, population, texts, adjust=False).base
    return {m: (None if m in touched else base[m]) for m in population}


def _metrics(
    settings: Settings, evaluation: Evaluation, *, masked: int, members: int
) -> dict[str, JSONValue]:
    metrics: dict[str, JSONValue] = dict(
        group_metrics(
            evaluation.stats(),
            rubric_mode=rubric_mode(settings),
            masked=masked,
            members=members,
            escalation=settings.judge.budget_escalation is not None,
        )
    )
    if swaps_positions(settings.position_balance):
        pairs = [(judged, evaluation.plan[c].swapped) for c, judged in evaluation.judged()]
        metrics[POSITION_DISAGREEMENT] = position_disagreement_rate(pairs)
    if evaluation.done_before_complete is not None:
        metrics[EAGER_RATE_KEY] = evaluation.done_before_complete / max(1, evaluation.total)
    return metrics


def default_result(settings: Settings, text: MemberText) -> dict[str, JSONValue]:
    """The singleton-path result (docs/differences.md, D41): defaults and metrics at defaults."""
    score = settings.default_score
    result: dict[str, JSONValue] = {
        "reward": score,
        "mask_sample": False,
        "failure_kind": None,
        "failure_reason": None,
        "reasoning_text": text.reasoning_text,
        "answer_text": text.answer_text,
        "reward_score_raw": score,
        "reward_rubric_aggregate_valid": None,
        "reward_overall_score_raw": score,
        "reward_overall_score": score,
        "reward_length_adjustment": 0.0,
    }
    metrics = group_metrics(
        [],
        rubric_mode=rubric_mode(settings),
        masked=0,
        members=1,
        escalation=settings.judge.budget_escalation is not None,
    )
    result.update(metrics)
    if swaps_positions(settings.position_balance):
        result[POSITION_DISAGREEMENT] = None
    if settings.eager_comparisons:
        result[EAGER_RATE_KEY] = 0.0
    return result


def score_cohort(
    settings: Settings,
    evaluation: Evaluation,
    size: int,
    texts: Mapping[int, MemberText],
) -> dict[int, Scored | Masked] | AllMasked:
    """Mask members by `mask_policy` and score the rest from all their successful comparisons.

    Raises ValueError when any float of a row is not finite (a cohort-kind failure,
    docs/scoring.md): the reward, the overall score, an adjustment or a group metric, since a
    reply holding one could not be JSON.
    """
    masking = mask_members(settings.mask_policy, size, evaluation.plan, evaluation.errors)
    if isinstance(masking, AllMasked):
        return masking
    population = masking.scored
    member_texts = {m: _member_texts(settings, texts[m]) for m in population}
    selected = [judged for _, judged in evaluation.judged()]
    overall = [judged for _, judged in evaluation.judged(overall=True)]
    agg = _aggregate(settings, selected, population, member_texts, adjust=True)
    # the same verdicts (score_source: overall) need no second fit
    ovr = (
        agg
        if overall == selected
        else _aggregate(settings, overall, population, member_texts, adjust=True)
    )
    valid = _rubric_valid(settings, evaluation, population, member_texts)
    metrics = _metrics(settings, evaluation, masked=len(masking.reasons), members=size)
    metrics.update(agg.method_metrics)
    if not _finite(metrics.values()):  # shared by every row: checked once
        raise ValueError(NON_FINITE_MESSAGE)
    outcomes: dict[int, Scored | Masked] = {}
    for m in range(size):
        reason = masking.reasons.get(m)
        if reason is not None:
            outcomes[m] = Masked(reason)
            continue
        result: dict[str, JSONValue] = {
            "reward": agg.final[m],
            "mask_sample": False,
            "failure_kind": None,
            "failure_reason": None,
            "reasoning_text": texts[m].reasoning_text,
            "answer_text": texts[m].answer_text,
            "reward_score_raw": agg.base[m],
            "reward_rubric_aggregate_valid": valid[m],
            "reward_overall_score_raw": ovr.base[m],
            "reward_overall_score": ovr.final[m],
            "reward_length_adjustment": agg.adjustments[m],
        }
        if not _finite(result.values()):
            raise ValueError(NON_FINITE_MESSAGE)
        result.update(metrics)
        outcomes[m] = Scored(result)
    return outcomes


def compare_result(
    settings: Settings, evaluation: Evaluation, texts: Sequence[MemberText]
) -> CompareResult:
    """The `/compare` reply once every comparison succeeded (docs/http-api.md, "POST /compare").

    Rewards carry the group adjustments over all inputs, as in the reference. Raises ValueError
    when a reward or metric is not finite (absurd unvalidated verdicts overflow the sums; the
    reply could not be JSON), like :func:`score_cohort`.
    """
    n = len(texts)
    comparisons = [j for _, j in evaluation.judged()]
    population = list(range(n))
    member_texts = {m: _member_texts(settings, texts[m]) for m in population}
    agg = _aggregate(settings, comparisons, population, member_texts, adjust=True)
    rows: list[dict[str, JSONValue]] = [
        {
            "response_i": j.i,
            "response_j": j.j,
            "judge_idx": j.k,
            "score_1": j.scores[0],
            "score_2": j.scores[1],
            "ranking": j.scores[2],
        }
        for j in comparisons
    ]
    metrics: dict[str, JSONValue] = dict(agg.metrics)
    group = _metrics(settings, evaluation, masked=0, members=n)
    for key in _RATE_KEYS:
        group.pop(key, None)
    metrics.update(group)
    metrics.update(agg.method_metrics)
    if not (_finite(agg.final.values()) and _finite(metrics.values())):
        raise ValueError(NON_FINITE_MESSAGE)
    return CompareResult(
        rewards=[agg.final[m] for m in population], comparison_results=rows, metrics=metrics
    )


def _finite(values: Iterable[JSONValue]) -> bool:
    """Whether every float among ``values`` is finite: the one check of `/verify` rows and the
    `/compare` reply (absurd unvalidated verdicts overflow the sums to inf or nan)."""
    return all(math.isfinite(v) for v in values if type(v) is float)


def judge_principle(settings: Settings, principle: str | None) -> str | None:
    """The principle the judge sees: none unless ``use_principle``, else the request's own or
    ``default_principle``."""
    if not settings.use_principle:
        return None
    return principle if principle else settings.default_principle


def shown_preferences(evaluation: Evaluation) -> tuple[int, int, int]:
    """``(first, second, tie)``: how many successful comparisons' overall rankings prefer the
    answer shown first, the one shown second, or neither (3.5), as the judge saw them: the live
    position bias (docs/operations.md, "The judge on live traffic"). A fallback verdict (its
    overall verdict unparsed) is not the judge's preference and is left out."""
    first = second = tie = 0
    for result in evaluation.results:
        if result is None or result.overall_parse_failed:
            continue
        ranking = result.overall.ranking
        if ranking < RANKING_MIDPOINT:
            first += 1
        elif ranking > RANKING_MIDPOINT:
            second += 1
        else:
            tie += 1
    return first, second, tie
