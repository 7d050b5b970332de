"""The `regular` comparison graph: a d-regular circulant graph on N members whose offsets are
spread over the ring (docs/scoring.md, "The regular graph"). Pure.

A circulant graph joins member i to i ± s (mod N) for every offset s of a set S. Every member
then has the same neighbourhood shape, so the graph is d-regular with d = 2·|S| (plus one for
the offset N/2, which joins i to a single opposite member: how an odd d is made, N even). The
offsets are chosen to maximise the graph's algebraic connectivity, the smallest nonzero
eigenvalue of its Laplacian: the larger it is, the faster comparisons chain through shared
opponents, and the better a fit over the graph (Bradley–Terry) pins every member against every
other. A circulant's Laplacian eigenvalues have a closed form, one per k = 1 … N−1:

    μ_k = Σ_{s ∈ S, s < N/2} (2 − 2·cos(2π·k·s/N))  +  [N/2 ∈ S]·(1 − (−1)^k)

(μ_k = μ_{N−k}, so k ≤ N/2 suffice), so a candidate set is scored in O(N·|S|) without any
matrix. The choice scores every set when that takes at most `EXHAUSTIVE_LIMIT` terms (every
N ≤ 64 at d ≤ 8, N ≤ 32 at any d), else builds one greedily (offset 1, then each
next offset the one that lifts the smallest eigenvalue most) and swaps single offsets while that
improves it (best swap first): a local optimum, a few per cent below the best where both were
compared. Both are deterministic: ties go to the first set found, the lexicographically smallest
one of the exhaustive search (within `_TIE`, so libm's last bit cannot change the graph).
`circulant_offsets` caches its answer per (N, d); docs/scoring.md gives the times up to N = 512.
"""

from __future__ import annotations

import functools
import itertools
import math
from operator import add
from typing import Final

__all__ = [
    "EXHAUSTIVE_LIMIT",
    "algebraic_connectivity",
    "check_degree",
    "circulant_offsets",
    "fitting_degree",
    "regular_pairs",
]

EXHAUSTIVE_LIMIT: Final = 2_000_000
"""Offset sets are scored one by one while (sets × ⌊N/2⌋ eigenvalues) is at most this; a local
search beyond."""

_TIE: Final = 1e-9  # eigenvalues closer than this are equal (floating-point noise)


def check_degree(n: int, d: int) -> None:
    """ValueError unless a connected simple d-regular graph on n vertices exists: 2 ≤ d ≤ n − 1
    and n·d even (and the single edge of n = 2, d = 1)."""
    if not (2 <= d <= n - 1 or (n == 2 and d == 1)):
        raise ValueError(f"comparisons_per_rollout must satisfy 2 <= d <= N - 1, got d={d}, N={n}")
    if n * d % 2:
        raise ValueError(f"N·d must be even for a d-regular graph, got d={d}, N={n}")


def fitting_degree(n: int, d: int) -> int:
    """The degree a batch of n answers uses when d does not fit it (`/compare`, whose batches
    have any size): the largest d' ≤ min(d, n − 1) with n·d' even; 1 for n = 2 (one pair).
    d itself whenever it fits. n ≥ 2, d ≥ 1."""
    fit = min(d, n - 1)
    return fit - 1 if n * fit % 2 else fit


def _eigenvalue_rows(n: int, candidates: range) -> dict[int, list[float]]:
    """For each offset t, its term of μ_k for k = 1 … ⌊N/2⌋."""
    terms = [2.0 - 2.0 * math.cos(2.0 * math.pi * r / n) for r in range(n)]
    ks = range(1, n // 2 + 1)
    return {t: [terms[k * t % n] for k in ks] for t in candidates}


def _opposite_row(n: int, odd: bool) -> list[float]:
    """The offset N/2's term of μ_k: 1 − (−1)^k (zeros without it)."""
    return [(2.0 if k % 2 else 0.0) if odd else 0.0 for k in range(1, n // 2 + 1)]


def algebraic_connectivity(n: int, offsets: tuple[int, ...]) -> float:
    """The smallest nonzero-index Laplacian eigenvalue μ_1 … of the circulant graph on n vertices
    with these offsets (0 when it is disconnected). The offset n/2 (n even) counts once."""
    opposite = n % 2 == 0 and n // 2 in offsets
    rows = _eigenvalue_rows(n, range(1, (n + 1) // 2))
    return _score(rows, _opposite_row(n, opposite), tuple(s for s in offsets if 2 * s != n))


@functools.cache
def circulant_offsets(n: int, d: int) -> tuple[int, ...]:
    """The sorted offsets of the d-regular circulant graph on n vertices this service uses
    (module docstring); ``n // 2`` is among them iff d is odd. ValueError from `check_degree`."""
    check_degree(n, d)
    odd = d % 2 == 1
    m = d // 2
    candidates = range(1, (n + 1) // 2)  # 1 … ⌈N/2⌉ − 1: every offset but N/2
    opposite = (n // 2,) if odd else ()
    if m == len(candidates):
        return (*candidates, *opposite)
    rows = _eigenvalue_rows(n, candidates)
    base = _opposite_row(n, odd)
    if math.comb(len(candidates), m) * (n // 2) <= EXHAUSTIVE_LIMIT:
        chosen = _exhaustive(rows, base, candidates, m)
    else:
        chosen = _local_search(rows, base, candidates, m)
    return (*sorted(chosen), *opposite)


def _score(rows: dict[int, list[float]], base: list[float], offsets: tuple[int, ...]) -> float:
    total = base
    for s in offsets:
        total = list(map(add, total, rows[s]))
    return min(total)


def _exhaustive(
    rows: dict[int, list[float]], base: list[float], candidates: range, m: int
) -> tuple[int, ...]:
    best: tuple[int, ...] = ()
    best_value = -math.inf
    for offsets in itertools.combinations(candidates, m):  # lexicographic: ties keep the first
        value = _score(rows, base, offsets)
        if value > best_value + _TIE:
            best, best_value = offsets, value
    return best


def _local_search(
    rows: dict[int, list[float]], base: list[float], candidates: range, m: int
) -> tuple[int, ...]:
    chosen: list[int] = []
    total = base
    for _ in range(m):  # greedy: the offset that lifts the smallest eigenvalue most
        best_t, best_value = 0, -math.inf
        for t in candidates:
            if t in chosen:
                continue
            value = min(map(add, total, rows[t]))
            if value > best_value + _TIE:
                best_t, best_value = t, value
        chosen.append(best_t)
        total = list(map(add, total, rows[best_t]))
    value = min(total)
    while True:  # then the best single swap, while one improves
        best_swap: tuple[int, int] | None = None
        best_value = value
        for position, s in enumerate(chosen):
            without = [a - b for a, b in zip(total, rows[s], strict=True)]
            for t in candidates:
                if t in chosen:
                    continue
                candidate = min(map(add, without, rows[t]))
                if candidate > best_value + _TIE:
                    best_swap, best_value = (position, t), candidate
        if best_swap is None:
            return tuple(chosen)
        position, t = best_swap
        total = [a - b + c for a, b, c in zip(total, rows[chosen[position]], rows[t], strict=True)]
        chosen[position] = t
        value = min(total)


def regular_pairs(n: int, d: int) -> list[tuple[int, int]]:
    """The N·d/2 ``(response_1, response_2)`` pairs of one pass, offset by offset: ``(i, i+s mod
    N)`` for every member i and offset s < N/2, then ``(i, i + N/2)`` for i < N/2 when d is odd.
    Each member is response_1 in ⌊d/2⌋ or ⌈d/2⌉ of its d pairs. d = 2 gives circular's pairs."""
    pairs: list[tuple[int, int]] = []
    for s in circulant_offsets(n, d):
        if 2 * s == n:
            pairs.extend((i, i + s) for i in range(s))
        else:
            pairs.extend((i, (i + s) % n) for i in range(n))
    return pairs
