"""Scoring: from judge verdicts to rewards (docs/scoring.md). Pure: no trio, no I/O.

One job per module:

- `pairs`: which comparisons run (pair plans, judge passes, position balance, fixed baseline)
  and the verdict triples they yield;
- `regular`: the `regular` strategy's graph (circulant offsets chosen for connectivity);
- `masking`: which rollouts failed comparisons mask (`pair`, `component`), when a group fails;
- `aggregation`: the aggregation methods, the dispatch to them (`aggregator`), and `aggregate`;
- `bradley_terry`: the penalised Bradley–Terry fit (Newton's method);
- `graph`: connected components and preference cycles of the comparison graph;
- `adjustments`: top-percentile bonuses, length and style penalties;
- `style`: Markdown and emoji density of an answer;
- `metrics`: the `genrm_*` group metrics, percentiles, position disagreement;
- `numeric`: float helpers that return inf or nan instead of raising.

Floating-point operations follow the reference order where the reference defines them, so
`simple_tiebreaker` rewards match NeMo Gym's `genrm_compare` to the last bit. The names below
are the package's public face.
"""

from genrm_trio.domain.scoring.adjustments import MemberTexts, adjust, density_weights
from genrm_trio.domain.scoring.aggregation import (
    BT_LOG_LIKELIHOOD,
    CYCLE_RATE,
    NO_ADJUSTMENTS,
    Aggregation,
    BaseScorer,
    BaseScores,
    ScoringInput,
    aggregate,
    aggregator,
    bradley_terry_scores,
    observation,
    tiebreak_scores,
)
from genrm_trio.domain.scoring.bradley_terry import (
    BradleyTerryFit,
    PairObservations,
    fit_bradley_terry,
)
from genrm_trio.domain.scoring.graph import (
    components,
    largest_component,
    preference_cycle_rate,
)
from genrm_trio.domain.scoring.masking import AllMasked, Masking, mask_members
from genrm_trio.domain.scoring.metrics import (
    ESCALATION_RATE,
    ComparisonStats,
    group_metrics,
    percentile,
    position_disagreement_rate,
)
from genrm_trio.domain.scoring.pairs import (
    RANKING_MIDPOINT,
    JudgedComparison,
    PlannedComparison,
    PositionBalance,
    Strategy,
    Triple,
    comparison_pairs,
    flip,
    plan_comparisons,
    plan_fixed_baseline,
    swaps_positions,
)
from genrm_trio.domain.scoring.regular import (
    algebraic_connectivity,
    circulant_offsets,
    fitting_degree,
)
from genrm_trio.domain.scoring.style import count_style_elements, strip_code_blocks, style_density

__all__ = [
    "BT_LOG_LIKELIHOOD",
    "CYCLE_RATE",
    "ESCALATION_RATE",
    "NO_ADJUSTMENTS",
    "RANKING_MIDPOINT",
    "Aggregation",
    "AllMasked",
    "BaseScorer",
    "BaseScores",
    "BradleyTerryFit",
    "ComparisonStats",
    "JudgedComparison",
    "Masking",
    "MemberTexts",
    "PairObservations",
    "PlannedComparison",
    "PositionBalance",
    "ScoringInput",
    "Strategy",
    "Triple",
    "adjust",
    "aggregate",
    "aggregator",
    "algebraic_connectivity",
    "bradley_terry_scores",
    "circulant_offsets",
    "comparison_pairs",
    "components",
    "count_style_elements",
    "density_weights",
    "fit_bradley_terry",
    "fitting_degree",
    "flip",
    "group_metrics",
    "largest_component",
    "mask_members",
    "observation",
    "percentile",
    "plan_comparisons",
    "plan_fixed_baseline",
    "position_disagreement_rate",
    "preference_cycle_rate",
    "strip_code_blocks",
    "style_density",
    "swaps_positions",
    "tiebreak_scores",
]
