"""Pair plans, tie-break aggregation, length/style adjustments and group metrics (docs/scoring.md).

Pure: no trio, no I/O. Floating-point operations follow the reference order (accumulation in
comparison order, bonuses before length weights before style weights) so rewards match NeMo Gym's
`genrm_compare` to the last bit where the reference defines them. docs/scoring.md has the maths
with worked examples.

Verdicts are plain ``(score_1, score_2, ranking)`` triples; a ``NamedTuple`` verdict with those
three fields is a subtype and works everywhere a :data:`Triple` is accepted.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal, TypeVar, cast, final

import regex

__all__ = [
    "ESCALATION_RATE",
    "RANKING_MIDPOINT",
    "Aggregation",
    "ComparisonStats",
    "JudgedComparison",
    "MemberTexts",
    "PlannedComparison",
    "PositionBalance",
    "Strategy",
    "Triple",
    "aggregate",
    "comparison_pairs",
    "count_style_elements",
    "density_weights",
    "flip",
    "group_metrics",
    "percentile",
    "plan_comparisons",
    "plan_fixed_baseline",
    "position_disagreement_rate",
    "strip_code_blocks",
    "style_density",
]

Strategy = Literal["circular", "all_pairs"]
PositionBalance = Literal["none", "alternate"]
Triple = tuple[float, float, float]
"""``(score_1, score_2, ranking)``: scores 1–5 for response_1/response_2, ranking 1–6."""

RANKING_MIDPOINT: Final = 3.5
"""Constant tie-break midpoint (docs/scoring.md section 2, D4): not ``default_ranking``."""

_STRATEGIES: Final = frozenset({"circular", "all_pairs"})
_BALANCES: Final = frozenset({"none", "alternate"})

_T = TypeVar("_T", bound=Triple)


# --------------------------------------------------------------------------------------------
# Pair plans (docs/scoring.md section 1, D7)
# --------------------------------------------------------------------------------------------


def comparison_pairs(n: int, strategy: str) -> list[tuple[int, int]]:
    """The ``(response_1, response_2)`` member pairs of one judge pass (docs/scoring.md, "Pairs").

    ``circular``: ``(i, (i+1) mod n)``, n pairs (n = 2 gives ``(0, 1), (1, 0)``).
    ``all_pairs``: every ``(i, j)`` with ``i < j`` in lexicographic order.
    Raises ValueError for an unknown strategy or ``n < 2``.
    """
    if strategy not in _STRATEGIES:
        raise ValueError(
            f"Unsupported comparison_strategy: {strategy!r}. Supported: {sorted(_STRATEGIES)}"
        )
    if n < 2:
        raise ValueError(f"Need at least 2 responses for pairwise comparison, got {n}")
    if strategy == "circular":
        return [(i, (i + 1) % n) for i in range(n)]
    return [(i, j) for i in range(n) for j in range(i + 1, n)]


@final
@dataclass(frozen=True, slots=True)
class PlannedComparison:
    """One scheduled judge call: member ``i`` is response_1 logically, ``j`` response_2, pass ``k``.

    ``swapped`` means ``j`` is shown to the judge first; the judge's verdict must then be flipped
    back (:meth:`to_member_orientation`) before aggregation.
    """

    i: int
    j: int
    k: int
    swapped: bool = False

    @property
    def pair(self) -> tuple[int, int]:
        """``(i, j)``: the logical pair, as written in log lines."""
        return (self.i, self.j)

    @property
    def shown(self) -> tuple[int, int]:
        """``(first, second)`` as shown to the judge."""
        return (self.j, self.i) if self.swapped else (self.i, self.j)

    def to_member_orientation(self, verdict: _T) -> _T:
        """The judge's verdict expressed as ``(score of i, score of j, ranking i vs j)``."""
        return flip(verdict) if self.swapped else verdict


def flip(v: _T) -> _T:
    """Swap the sides of a verdict: ``(s1, s2, r) -> (s2, s1, 7 - r)``.

    A NamedTuple verdict comes back as the same NamedTuple type.
    """
    s1, s2, r = v
    flipped = (s2, s1, 7 - r)
    make = getattr(type(v), "_make", None)
    return cast(_T, make(flipped) if make is not None else flipped)


def plan_comparisons(
    n: int, strategy: str, judges: int, position_balance: str = "none"
) -> list[PlannedComparison]:
    """Every comparison of a rollout cohort, judge-major (docs/scoring.md, "Judge passes", D7).

    ``[(pairs, k=0)] + [(pairs, k=1)] + …``. With ``position_balance="alternate"`` the comparison
    ``(i, j, k)`` is shown ``j`` first iff ``(i + j + k)`` is odd.
    """
    if judges < 1:
        raise ValueError(f"num_judges_per_comparison must be >= 1, got {judges}")
    if position_balance not in _BALANCES:
        raise ValueError(
            f"Unsupported position_balance: {position_balance!r}. Supported: {sorted(_BALANCES)}"
        )
    pairs = comparison_pairs(n, strategy)
    alternate = position_balance == "alternate"
    return [
        PlannedComparison(i, j, k, swapped=alternate and (i + j + k) % 2 == 1)
        for k in range(judges)
        for i, j in pairs
    ]


def _baseline_order(cohort_key: str, member: int) -> int:
    # surrogatepass: identical to UTF-8 for every well-formed key, and a key carrying a lone
    # surrogate (legal in request JSON, docs/http-api.md) still gets a deterministic order.
    data = f"{cohort_key}:{member}".encode("utf-8", "surrogatepass")
    return int(hashlib.sha256(data).hexdigest(), 16)


def plan_fixed_baseline(n: int, judges: int, cohort_key: str) -> list[PlannedComparison]:
    """Member-vs-baseline comparisons (docs/scoring.md, "Fixed baseline"): baseline index ``n``,
    judge-major over members.

    Member ``m`` goes first at pass ``k`` iff ``(sha256(f"{cohort_key}:{m}") + k) % 2 == 0``;
    otherwise the baseline is shown first (``swapped``). Runs for ``n == 1`` too.
    """
    if n < 1:
        raise ValueError(f"fixed_baseline needs at least 1 member, got {n}")
    if judges < 1:
        raise ValueError(f"num_judges_per_comparison must be >= 1, got {judges}")
    orders = [_baseline_order(cohort_key, m) for m in range(n)]
    return [
        PlannedComparison(m, n, k, swapped=(orders[m] + k) % 2 != 0)
        for k in range(judges)
        for m in range(n)
    ]


# --------------------------------------------------------------------------------------------
# Style control (docs/scoring.md, "(c) Style density penalty", D1)
# --------------------------------------------------------------------------------------------

_CODE_BLOCK = re.compile(r"```[\s\S]*?```")
_HEADER = re.compile(r"^#{1,6}\s", re.MULTILINE)
_ORDERED = re.compile(r"^\s*\d+\.\s", re.MULTILINE)
_UNORDERED = re.compile(r"^\s*[-*+]\s", re.MULTILINE)
_BOLD_STARS = re.compile(r"\*\*[^*\n]+\*\*")
_BOLD_UNDERSCORES = re.compile(r"__[^_\n]+__")
_PICTOGRAPHIC: Any = regex.compile(r"\p{Extended_Pictographic}")


def strip_code_blocks(text: str) -> str:
    """Remove fenced code spans: three backticks up to the next three backticks, across lines."""
    return _CODE_BLOCK.sub("", text)


def count_style_elements(answer: str) -> dict[str, int]:
    """Markdown style elements outside fenced code (Arena-Hard + emoji; docs/scoring.md, D1).

    Keys: ``headers``, ``ordered_lists``, ``unordered_lists``, ``bold``, ``emoji``. Emoji are
    non-ASCII code points with Extended_Pictographic=Yes, counted per code point: CJK, Hangul,
    kana and the plain arrows U+2190–U+2193 count 0; ©, ®, ™, ‼ count 1 each.
    """
    text = strip_code_blocks(answer)
    emoji = sum(1 for ch in _PICTOGRAPHIC.findall(text) if ord(ch) > 0x7F)
    return {
        "headers": len(_HEADER.findall(text)),
        "ordered_lists": len(_ORDERED.findall(text)),
        "unordered_lists": len(_UNORDERED.findall(text)),
        "bold": len(_BOLD_STARS.findall(text)) + len(_BOLD_UNDERSCORES.findall(text)),
        "emoji": emoji,
    }


def style_density(answer: str) -> float:
    """Style elements per character of the stripped code-free answer; 0.0 when that is empty.

    As in the reference, the elements are counted on the code-free text (code removal is applied
    to it again inside :func:`count_style_elements`, a no-op except for pathological fences).
    """
    code_free = strip_code_blocks(answer)
    length = len(code_free.strip())
    if length <= 0:
        return 0.0
    return sum(count_style_elements(code_free).values()) / length


def density_weights(values: Sequence[float]) -> list[float]:
    """Zero-centred weights, lower value ⇒ higher weight (docs/scoring.md 3 (b); lengths, style).

    ``w = 1 - (v - min) / (max - min)``, then ``w - mean(w)``; all zeros when ``max == min``.
    """
    if not values:
        return []
    hi, lo = max(values), min(values)
    if hi == lo:
        return [0.0] * len(values)
    span = hi - lo
    raw = [1.0 - ((v - lo) / span) for v in values]
    mean = sum(raw) / len(raw)
    return [w - mean for w in raw]


# --------------------------------------------------------------------------------------------
# Aggregation (docs/scoring.md sections 2-5)
# --------------------------------------------------------------------------------------------


def _fsum(values: Sequence[float]) -> float:
    """``math.fsum``, but ±inf or nan instead of an error when a partial sum overflows.

    fsum raises OverflowError on an intermediate overflow (finite scores near 1e308 are legal
    with ``validate_verdict_range: false``) and ValueError on ``inf + -inf``; plain summation
    then gives the inf or nan that the engine's finiteness check turns into a cohort failure
    (docs/scoring.md section 7). Every sum fsum can do keeps fsum's exact result.
    """
    try:
        return math.fsum(values)
    except OverflowError:
        return sum(values, 0.0)
    except ValueError:
        return math.nan


def _square(x: float) -> float:
    """``x ** 2``, inf instead of OverflowError when it does not fit a double."""
    try:
        return x**2
    except OverflowError:
        return math.inf


@final
@dataclass(frozen=True, slots=True)
class JudgedComparison:
    """A successful comparison in member orientation (already flipped back if it was swapped).

    ``scores`` is ``(score of i, score of j, ranking i vs j)`` before the tie-break.
    """

    i: int
    j: int
    k: int
    scores: Triple


@final
@dataclass(frozen=True, slots=True)
class MemberTexts:
    """What the adjustments need from one member's response (docs/scoring.md section 3)."""

    reasoning_len: int  # characters of the stripped reasoning text
    answer_len: int  # characters of the stripped answer text
    style_density: float  # style_density(answer)

    @classmethod
    def from_texts(cls, reasoning: str, answer: str) -> MemberTexts:
        """From the extracted texts. ``answer`` is the raw extracted output text (empty when the
        response has none), not the ``"None"`` placeholder shown to the judge."""
        return cls(len(reasoning.strip()), len(answer.strip()), style_density(answer))


@final
@dataclass(frozen=True, slots=True)
class Aggregation:
    """Aggregation result over the population (docs/scoring.md, "Result", "Aggregation metrics")."""

    final: dict[int, float]  # member -> score after adjustments
    base: dict[int, float]  # member -> base score (pre-adjustment)
    adjustments: dict[int, float]  # member -> total adjustment (length + style)
    metrics: dict[str, float]  # aggregation metrics; empty when there were no comparisons


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
) -> Aggregation:
    """``simple_tiebreaker`` scores with group adjustments over ``population`` (docs/scoring.md).

    Every comparison accumulates into both its members, including members outside
    ``population`` (masked members, the fixed baseline); only population members are returned,
    and thresholds, shortest-length searches, weight spans and zero-centring use the population
    only (docs/scoring.md section 4). ``texts`` must cover the population whenever an adjustment
    pass runs. Raises ValueError for ``top_percentile`` outside (0, 1] (D5) or a duplicated member.
    """
    if not 0.0 < top_percentile <= 1.0:
        raise ValueError(f"top_percentile must be in (0, 1], got {top_percentile!r}")
    members = sorted(population)
    if len(set(members)) != len(members):
        raise ValueError(f"population lists a member twice: {list(population)!r}")

    acc: dict[int, float] = {}
    cnt: dict[int, int] = {}
    individual: list[float] = []
    ties = 0
    for c in comparisons:
        s1, s2, r = c.scores
        individual.append(s1)
        individual.append(s2)
        if s1 == s2:
            ties += 1
            d = RANKING_MIDPOINT - r
            s1 = s1 + d
            s2 = s2 - d
        acc[c.i] = acc.get(c.i, 0.0) + s1
        cnt[c.i] = cnt.get(c.i, 0) + 1
        acc[c.j] = acc.get(c.j, 0.0) + s2
        cnt[c.j] = cnt.get(c.j, 0) + 1

    base = [acc[m] / cnt[m] if cnt.get(m, 0) > 0 else default_score for m in members]
    scores = list(base)
    adjustments = [0.0] * len(members)

    length_pass = (
        reasoning_bonus > 0
        or answer_bonus > 0
        or group_reasoning_length_penalty_coeff > 0
        or group_answer_length_penalty_coeff > 0
    )
    style_pass = group_style_penalty_coeff > 0
    if len(members) >= 2 and (length_pass or style_pass):
        missing = [m for m in members if m not in texts]
        if missing:
            raise ValueError(f"no MemberTexts for population members {missing}")
        if length_pass:
            _length_adjustments(
                scores,
                adjustments,
                [texts[m].reasoning_len for m in members],
                [texts[m].answer_len for m in members],
                reasoning_bonus=reasoning_bonus,
                answer_bonus=answer_bonus,
                top_percentile=top_percentile,
                reasoning_coeff=group_reasoning_length_penalty_coeff,
                answer_coeff=group_answer_length_penalty_coeff,
            )
        if style_pass:
            weights = density_weights([texts[m].style_density for m in members])
            for idx, w in enumerate(weights):
                adj = w * group_style_penalty_coeff
                if adj != 0:
                    scores[idx] += adj
                    adjustments[idx] += adj

    metrics: dict[str, float] = {}
    if comparisons:
        mean = _fsum(individual) / len(individual)
        metrics["mean_individual_score"] = mean
        metrics["std_individual_score"] = math.sqrt(
            _fsum([_square(x - mean) for x in individual]) / len(individual)
        )
        metrics["tiebreak_usage_rate"] = ties / len(comparisons)

    return Aggregation(
        final=dict(zip(members, scores, strict=True)),
        base=dict(zip(members, base, strict=True)),
        adjustments=dict(zip(members, adjustments, strict=True)),
        metrics=metrics,
    )


def _shortest_nonempty(lengths: Sequence[int]) -> int | None:
    """Position of the smallest length > 0, the first on ties; None when all are empty."""
    best: int | None = None
    for idx, length in enumerate(lengths):
        if length > 0 and (best is None or length < lengths[best]):
            best = idx
    return best


def _length_adjustments(
    scores: list[float],
    adjustments: list[float],
    reasoning_lens: Sequence[int],
    answer_lens: Sequence[int],
    *,
    reasoning_bonus: float,
    answer_bonus: float,
    top_percentile: float,
    reasoning_coeff: float,
    answer_coeff: float,
) -> None:
    """docs/scoring.md 3 (a) top-percentile bonuses then (b) group length penalties, in place."""
    t_idx = max(0, int(len(scores) * top_percentile) - 1)
    threshold = sorted(scores, reverse=True)[t_idx]  # once, before any bonus
    for bonus, lengths in ((reasoning_bonus, reasoning_lens), (answer_bonus, answer_lens)):
        if bonus > 0:
            idx = _shortest_nonempty(lengths)
            # the answer check sees the reasoning bonus (reference behaviour)
            if idx is not None and scores[idx] >= threshold:
                scores[idx] += bonus
                adjustments[idx] += bonus
    if reasoning_coeff > 0 or answer_coeff > 0:
        r_weights = density_weights(reasoning_lens)
        a_weights = density_weights(answer_lens)
        for idx in range(len(scores)):
            total = r_weights[idx] * reasoning_coeff + a_weights[idx] * answer_coeff
            if total != 0:
                scores[idx] += total
                adjustments[idx] += total


# --------------------------------------------------------------------------------------------
# Metrics (docs/scoring.md section 5, D7, D32)
# --------------------------------------------------------------------------------------------


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
        signs = {_sign(RANKING_MIDPOINT - _fsum(rs) / len(rs)) for rs in by_first.values()}
        disagree += len(signs) > 1
    return disagree / len(both)
