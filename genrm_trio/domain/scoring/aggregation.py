"""From judged comparisons to rewards: the aggregation methods, their dispatch, and `aggregate`
(docs/scoring.md sections 2, 3 and 5; D4, D8, D10, D45). Pure.

An aggregation method turns the successful comparisons into base scores of the population (the
scored members) and may report group metrics of its own; `aggregate` then applies the same
length and style adjustments whatever the method (docs/scoring.md section 3). A new method is
one function of the `BaseScorer` shape, its name in the key's vocabulary `AggregatorMethod`
(config/settings.py) and its case in `aggregator`, where mypy fails until it has one.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final, assert_never, final, get_args

from genrm_trio.config import DEFAULT_BRADLEY_TERRY_PRIOR, AggregatorMethod
from genrm_trio.domain.scoring.adjustments import MemberTexts, adjust
from genrm_trio.domain.scoring.bradley_terry import PairObservations, fit_bradley_terry
from genrm_trio.domain.scoring.graph import preference_cycle_rate
from genrm_trio.domain.scoring.numeric import safe_fsum, sigmoid, square
from genrm_trio.domain.scoring.pairs import RANKING_MIDPOINT, JudgedComparison

__all__ = [
    "BT_LOG_LIKELIHOOD",
    "CYCLE_RATE",
    "Aggregation",
    "BaseScorer",
    "BaseScores",
    "ScoringInput",
    "aggregate",
    "aggregator",
    "bradley_terry_scores",
    "observation",
    "tiebreak_scores",
]

BT_LOG_LIKELIHOOD: Final = "genrm_bradley_terry_log_likelihood_per_observation"
"""The Bradley–Terry fit's log-likelihood divided by its number of observations."""
CYCLE_RATE: Final = "genrm_preference_cycle_rate_per_group"
"""Share of decided triangles of scored members whose preferences form a cycle."""


@final
@dataclass(frozen=True, slots=True)
class ScoringInput:
    """What a method sees: the successful comparisons in member orientation (those against
    masked members and the fixed baseline included) and the population, ascending."""

    comparisons: Sequence[JudgedComparison]
    population: Sequence[int]
    default_score: float
    bradley_terry_prior: float


@final
@dataclass(frozen=True, slots=True)
class BaseScores:
    """A method's result: one base score per population member (in population order) and the
    group metrics the method reports (row keys; empty for `simple_tiebreaker`)."""

    scores: list[float]
    metrics: dict[str, float] = field(default_factory=dict)


BaseScorer = Callable[[ScoringInput], BaseScores]


def tiebreak_scores(given: ScoringInput) -> BaseScores:
    """`simple_tiebreaker` (docs/scoring.md section 2, D4, D8): each member's mean of its own
    scores, equal scores first moved apart by ``3.5 − ranking``; ``default_score`` without any.

    Accumulates in comparison order (the reference's float order)."""
    acc: dict[int, float] = {}
    cnt: dict[int, int] = {}
    for c in given.comparisons:
        s1, s2, r = c.scores
        if s1 == s2:
            d = RANKING_MIDPOINT - r
            s1 = s1 + d
            s2 = s2 - d
        acc[c.i] = acc.get(c.i, 0.0) + s1
        cnt[c.i] = cnt.get(c.i, 0) + 1
        acc[c.j] = acc.get(c.j, 0.0) + s2
        cnt[c.j] = cnt.get(c.j, 0) + 1
    return BaseScores(
        [acc[m] / cnt[m] if cnt.get(m, 0) > 0 else given.default_score for m in given.population]
    )


def observation(c: JudgedComparison) -> float:
    """y = (6 − r) / 5 from ``c.i``'s side: 1 when i is ranked clearly better, 0 when j is.

    In member orientation this equals the observation with the member actually shown first
    as a, since flipping a verdict maps r to 7 − r and so y to 1 − y."""
    return (6.0 - c.scores[2]) / 5.0


def bradley_terry_scores(given: ScoringInput) -> BaseScores:
    """`bradley_terry` (docs/scoring.md, "Bradley–Terry", D45): θ maximises the penalised
    log-likelihood over every vertex (masked members and the fixed baseline too); a member's
    base score is 1 + 4·σ(θ_m − θ̄), θ̄ the mean over the population.

    Reports the fit's log-likelihood per observation and, where decided triangles of scored
    members exist, their share that is cyclic."""
    vertices = sorted({*given.population, *(v for c in given.comparisons for v in (c.i, c.j))})
    index = {v: x for x, v in enumerate(vertices)}
    totals: dict[tuple[int, int], list[float]] = {}  # (a, b), a < b: [count, Σ y from a]
    for c in given.comparisons:
        a, b = index[c.i], index[c.j]
        y = observation(c)
        if a > b:
            a, b, y = b, a, 1.0 - y
        total = totals.setdefault((a, b), [0.0, 0.0])
        total[0] += 1
        total[1] += y
    pairs = [PairObservations(a, b, int(n), wins) for (a, b), (n, wins) in totals.items()]
    fit = fit_bradley_terry(len(vertices), pairs, given.bradley_terry_prior)
    theta = [fit.theta[index[m]] for m in given.population]
    mean = safe_fsum(theta) / len(theta) if theta else 0.0
    metrics: dict[str, float] = {}
    if fit.observations:
        metrics[BT_LOG_LIKELIHOOD] = fit.log_likelihood / fit.observations
    cycles = preference_cycle_rate(given.comparisons, given.population)
    if cycles is not None:
        metrics[CYCLE_RATE] = cycles
    return BaseScores([1.0 + 4.0 * sigmoid(t - mean) for t in theta], metrics)


def aggregator(method: AggregatorMethod) -> BaseScorer:
    """`aggregator_method` → its method: the one place an aggregation method is registered."""
    match method:  # exhaustive: mypy fails here until a new method has its case
        case "simple_tiebreaker":
            return tiebreak_scores
        case "bradley_terry":
            return bradley_terry_scores
        case _:
            assert_never(method)


# the settings' vocabulary is the one source (config/settings.py); this only checks arguments
_METHODS: Final[tuple[str, ...]] = get_args(AggregatorMethod)


@final
@dataclass(frozen=True, slots=True)
class Aggregation:
    """Aggregation result over the population (docs/scoring.md, "Result", "Aggregation metrics")."""

    final: dict[int, float]  # member -> score after adjustments
    base: dict[int, float]  # member -> base score (pre-adjustment)
    adjustments: dict[int, float]  # member -> total adjustment (length + style)
    metrics: dict[str, float]  # aggregation metrics (D10); empty when there were no comparisons
    method_metrics: dict[str, float] = field(default_factory=dict)  # the method's row metrics


NO_ADJUSTMENTS: Final[Mapping[str, float]] = {
    "default_score": 3.0,
    "reasoning_bonus": 0.0,
    "answer_bonus": 0.0,
    "top_percentile": 0.2,
    "group_reasoning_length_penalty_coeff": 0.0,
    "group_answer_length_penalty_coeff": 0.0,
    "group_style_penalty_coeff": 0.0,
}
"""`aggregate`'s adjustment keywords with every bonus and penalty off: the base scores are the
rewards (calibration's simulated frontier, the reward-quality benchmark, the scoring tests)."""


def aggregate(
    comparisons: Sequence[JudgedComparison],
    population: Sequence[int],
    texts: Mapping[int, MemberTexts],
    *,
    default_score: float,
    reasoning_bonus: float,
    answer_bonus: float,
    top_percentile: float,
    group_reasoning_length_penalty_coeff: float,
    group_answer_length_penalty_coeff: float,
    group_style_penalty_coeff: float,
    method: AggregatorMethod = "simple_tiebreaker",
    bradley_terry_prior: float = DEFAULT_BRADLEY_TERRY_PRIOR,
) -> Aggregation:
    """Base scores by ``method`` (`aggregator`), then the group adjustments over
    ``population`` (docs/scoring.md).

    Every comparison counts for both its members, including members outside ``population``
    (masked members, the fixed baseline); only population members are returned, and
    thresholds, shortest-length searches, weight spans and zero-centring use the population
    only (docs/scoring.md section 4). ``texts`` must cover the population whenever an adjustment
    pass runs. Raises ValueError for an unknown method, ``top_percentile`` outside (0, 1] (D5)
    or a duplicated member.
    """
    if method not in _METHODS:  # an untyped caller's
        raise ValueError(f"Unsupported aggregator_method: {method!r}. Supported: {list(_METHODS)}")
    if not 0.0 < top_percentile <= 1.0:
        raise ValueError(f"top_percentile must be in (0, 1], got {top_percentile!r}")
    members = sorted(population)
    if len(set(members)) != len(members):
        raise ValueError(f"population lists a member twice: {list(population)!r}")
    base = aggregator(method)(
        ScoringInput(comparisons, members, default_score, bradley_terry_prior)
    )
    scores, adjustments = adjust(
        base.scores,
        members,
        texts,
        reasoning_bonus=reasoning_bonus,
        answer_bonus=answer_bonus,
        top_percentile=top_percentile,
        group_reasoning_length_penalty_coeff=group_reasoning_length_penalty_coeff,
        group_answer_length_penalty_coeff=group_answer_length_penalty_coeff,
        group_style_penalty_coeff=group_style_penalty_coeff,
    )
    return Aggregation(
        final=dict(zip(members, scores, strict=True)),
        base=dict(zip(members, base.scores, strict=True)),
        adjustments=dict(zip(members, adjustments, strict=True)),
        metrics=_score_metrics(comparisons),
        method_metrics=base.metrics,
    )


def _score_metrics(comparisons: Sequence[JudgedComparison]) -> dict[str, float]:
    """D10 over the pre-tie-break scores, whatever the method: mean, population std, and the
    share of comparisons whose two scores are equal (the ones `simple_tiebreaker` moves)."""
    if not comparisons:
        return {}
    individual = [s for c in comparisons for s in c.scores[:2]]
    ties = sum(1 for c in comparisons if c.scores[0] == c.scores[1])
    mean = safe_fsum(individual) / len(individual)
    return {
        "mean_individual_score": mean,
        "std_individual_score": math.sqrt(
            safe_fsum([square(x - mean) for x in individual]) / len(individual)
        ),
        "tiebreak_usage_rate": ties / len(comparisons),
    }
