"""Group metrics of one comparison group: percentiles, the `genrm_*` per-group rates and token
statistics, and the position disagreement rate (docs/scoring.md section 5, D7, D32). Pure."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, final

from genrm_trio.domain.scoring.numeric import safe_fsum
from genrm_trio.domain.scoring.pairs import RANKING_MIDPOINT, JudgedComparison

__all__ = [
    "ESCALATION_RATE",
    "ComparisonStats",
    "group_metrics",
    "percentile",
    "position_disagreement_rate",
]


def percentile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between order statistics, ``q`` in [0, 1] (docs/scoring.md).

    ``pos = (n-1)·q``, ``p = v[lo] + (v[hi] - v[lo])·(pos - lo)``. Raises ValueError when empty.
    """
    if not values:
        raise ValueError("percentile of no values")
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"percentile q must be in [0, 1], got {q!r}")
    v = sorted(values)
    pos = (len(v) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(v) - 1)
    return float(v[lo] + (v[hi] - v[lo]) * (pos - lo))


@final
@dataclass(frozen=True, slots=True)
class ComparisonStats:
    """One scheduled comparison's outcome, as the group metrics see it."""

    failed: bool  # ended in a judge error (a failed comparison, masks its members)
    overall_parse_failed: bool
    rubric_parse_failed: bool
    input_tokens: int | None  # summed over attempts that reported usage; None when none did
    output_tokens: int | None
    budget_hit: bool  # any attempt exhausted max_output_tokens
    escalated: bool = False  # an attempt asked for an escalated output budget


ESCALATION_RATE: Final = "genrm_budget_escalation_rate_per_group"
"""Share of a group's comparisons that escalated their output budget (only with escalation on)."""

_TOKEN_KEYS: Final = (
    "genrm_input_tokens_per_comparison_mean",
    "genrm_input_tokens_per_comparison_p50",
    "genrm_input_tokens_per_comparison_p95",
    "genrm_output_tokens_per_comparison_mean",
    "genrm_output_tokens_per_comparison_p50",
    "genrm_output_tokens_per_comparison_p95",
    "genrm_output_tokens_total_per_group",
    "genrm_max_output_tokens_hit_rate_per_group",
)


def group_metrics(
    stats: Sequence[ComparisonStats],
    *,
    rubric_mode: bool,
    masked: int,
    members: int,
    escalation: bool = False,
) -> dict[str, float | None]:
    """The ``genrm_*`` group metrics of one group (docs/scoring.md, "Group metrics").

    Parse-failure rates: over successful comparisons, denominator ``max(1, successful)`` (D32).
    Token metrics and the budget hit rate: over every comparison that reported usage (both
    counts present), failed ones included; ``None`` when none did. Failed-comparison rate:
    ``failed / max(1, len(stats))``; masked-rollout rate: ``masked / max(1, members)``. With
    ``escalation`` (``judge.budget_escalation`` is set), also the share of comparisons with an
    escalated attempt, failed ones included: ``escalated / max(1, len(stats))``.
    """
    ok = [s for s in stats if not s.failed]
    denom = max(1, len(ok))
    out: dict[str, float | None] = {
        "genrm_parse_failure_rate_per_group": sum(s.overall_parse_failed for s in ok) / denom,
        "genrm_rubric_parse_failure_rate_per_group": (
            sum(s.rubric_parse_failed for s in ok) / denom if rubric_mode else 0.0
        ),
    }
    usage = [
        (s.input_tokens, s.output_tokens, s.budget_hit)
        for s in stats
        if s.input_tokens is not None and s.output_tokens is not None
    ]
    if usage:
        ins = [float(u[0]) for u in usage]
        outs = [float(u[1]) for u in usage]
        total_out = math.fsum(outs)
        out["genrm_input_tokens_per_comparison_mean"] = math.fsum(ins) / len(ins)
        out["genrm_input_tokens_per_comparison_p50"] = percentile(ins, 0.5)
        out["genrm_input_tokens_per_comparison_p95"] = percentile(ins, 0.95)
        out["genrm_output_tokens_per_comparison_mean"] = total_out / len(outs)
        out["genrm_output_tokens_per_comparison_p50"] = percentile(outs, 0.5)
        out["genrm_output_tokens_per_comparison_p95"] = percentile(outs, 0.95)
        out["genrm_output_tokens_total_per_group"] = total_out
        out["genrm_max_output_tokens_hit_rate_per_group"] = sum(u[2] for u in usage) / len(usage)
    else:
        out.update(dict.fromkeys(_TOKEN_KEYS))
    out["genrm_failed_comparison_rate_per_group"] = sum(s.failed for s in stats) / max(
        1, len(stats)
    )
    out["genrm_masked_rollout_rate_per_group"] = masked / max(1, members)
    if escalation:
        out[ESCALATION_RATE] = sum(s.escalated for s in stats) / max(1, len(stats))
    return out


def _sign(x: float) -> int:
    return (x > 0) - (x < 0)


def position_disagreement_rate(
    comparisons: Sequence[tuple[JudgedComparison, bool]],
) -> float | None:
    """Share of pairs judged in both orientations whose preferred member differs (D7).

    Each item is a member-oriented comparison and whether it was shown swapped (``j`` first).
    Rankings are re-expressed relative to the pair's lower index ``a`` (``7 - r`` when ``i`` is
    the higher one); per orientation (which member was shown first) the preference is
    ``sign(3.5 - mean ranking)``. A tie agrees only with a tie. None when no pair was judged in
    both orientations.
    """
    rankings: dict[tuple[int, int], dict[int, list[float]]] = {}
    for c, swapped in comparisons:
        a, b = (c.i, c.j) if c.i <= c.j else (c.j, c.i)
        r = c.scores[2] if c.i == a else 7 - c.scores[2]
        first = c.j if swapped else c.i
        rankings.setdefault((a, b), {}).setdefault(first, []).append(r)
    both = [by_first for by_first in rankings.values() if len(by_first) == 2]
    if not both:
        return None
    disagree = 0
    for by_first in both:
        signs = {_sign(RANKING_MIDPOINT - safe_fsum(rs) / len(rs)) for rs in by_first.values()}
        disagree += len(signs) > 1
    return disagree / len(both)
