"""Which comparisons run, and the verdict triples they produce (docs/scoring.md section 1, D7).

Pure. Verdicts are plain ``(score_1, score_2, ranking)`` triples; a ``NamedTuple`` verdict with
those three fields is a subtype and works everywhere a :data:`Triple` is accepted.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Final, TypeVar, assert_never, cast, final, get_args

from genrm_trio.config import DEFAULT_COMPARISONS_PER_ROLLOUT, ComparisonStrategy, PositionBalance
from genrm_trio.domain.scoring.regular import regular_pairs

__all__ = [
    "RANKING_MIDPOINT",
    "JudgedComparison",
    "PlannedComparison",
    "PositionBalance",
    "Strategy",
    "Triple",
    "comparison_pairs",
    "flip",
    "plan_comparisons",
    "plan_fixed_baseline",
    "shown_swapped",
    "swaps_positions",
]

Strategy = ComparisonStrategy
Triple = tuple[float, float, float]
"""``(score_1, score_2, ranking)``: scores 1–5 for response_1/response_2, ranking 1–6."""

RANKING_MIDPOINT: Final = 3.5
"""Constant tie-break midpoint (docs/scoring.md section 2, D4): not ``default_ranking``."""

# the settings' vocabularies are the one source (config/settings.py); these only check arguments
_STRATEGIES: Final = frozenset(get_args(ComparisonStrategy))
_BALANCES: Final = frozenset(get_args(PositionBalance))

_T = TypeVar("_T", bound=Triple)


def comparison_pairs(
    n: int, strategy: ComparisonStrategy, degree: int = DEFAULT_COMPARISONS_PER_ROLLOUT
) -> list[tuple[int, int]]:
    """The ``(response_1, response_2)`` member pairs of one judge pass (docs/scoring.md, "Pairs").

    ``circular``: ``(i, (i+1) mod n)``, n pairs (n = 2 gives ``(0, 1), (1, 0)``).
    ``all_pairs``: every ``(i, j)`` with ``i < j`` in lexicographic order.
    ``regular``: the ``degree``-regular circulant graph of `regular_pairs`, n·degree/2 pairs.
    Raises ValueError for an unknown strategy (an untyped caller's), ``n < 2``, or a degree the
    graph cannot have.
    """
    if strategy not in _STRATEGIES:
        raise ValueError(
            f"Unsupported comparison_strategy: {strategy!r}. Supported: {sorted(_STRATEGIES)}"
        )
    if n < 2:
        raise ValueError(f"Need at least 2 responses for pairwise comparison, got {n}")
    match strategy:  # exhaustive: mypy fails here until a new strategy has its case
        case "circular":
            return [(i, (i + 1) % n) for i in range(n)]
        case "all_pairs":
            return [(i, j) for i in range(n) for j in range(i + 1, n)]
        case "regular":
            return regular_pairs(n, degree)
        case _:
            assert_never(strategy)


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


def flip(v: _T) -> _T:
    """Swap the sides of a verdict: ``(s1, s2, r) -> (s2, s1, 7 - r)``.

    A NamedTuple verdict comes back as the same NamedTuple type.
    """
    s1, s2, r = v
    flipped = (s2, s1, 7 - r)
    make = getattr(type(v), "_make", None)
    return cast(_T, make(flipped) if make is not None else flipped)


def plan_comparisons(
    n: int,
    strategy: ComparisonStrategy,
    judges: int,
    position_balance: PositionBalance = "none",
    degree: int = DEFAULT_COMPARISONS_PER_ROLLOUT,
) -> list[PlannedComparison]:
    """Every comparison of a rollout cohort, judge-major (docs/scoring.md, "Judge passes", D7).

    ``[(pairs, k=0)] + [(pairs, k=1)] + …``. With ``position_balance="alternate"`` the comparison
    ``(i, j, k)`` is shown ``j`` first iff ``(i + j + k)`` is odd. ``degree``: d of ``regular``.
    """
    if judges < 1:
        raise ValueError(f"num_judges_per_comparison must be >= 1, got {judges}")
    if position_balance not in _BALANCES:
        raise ValueError(
            f"Unsupported position_balance: {position_balance!r}. Supported: {sorted(_BALANCES)}"
        )
    pairs = comparison_pairs(n, strategy, degree)
    return [
        PlannedComparison(i, j, k, swapped=shown_swapped(position_balance, i, j, k))
        for k in range(judges)
        for i, j in pairs
    ]


def shown_swapped(position_balance: PositionBalance, i: int, j: int, k: int) -> bool:
    """Whether judge pass ``k`` of the pair ``(i, j)`` is shown ``j`` first: the one statement of
    each balance's rule (docs/scoring.md, "Judge passes and position balance")."""
    match position_balance:  # exhaustive: mypy fails here until a new balance has its case
        case "none":
            return False
        case "alternate":
            return (i + j + k) % 2 == 1
        case _:
            assert_never(position_balance)


def swaps_positions(position_balance: PositionBalance) -> bool:
    """Whether ``position_balance`` shows some comparisons with their members swapped (then a
    group reports how often the two orders disagree: docs/scoring.md, "Position disagreement")."""
    match position_balance:  # exhaustive: mypy fails here until a new balance has its case
        case "none":
            return False
        case "alternate":
            return True
        case _:
            assert_never(position_balance)


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
