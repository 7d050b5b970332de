"""The comparison graph of a group: its connected components (the `component` masking rule) and
its preference cycles (docs/scoring.md, "Masking by connectivity", "Graph metrics"). Pure."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from genrm_trio.domain.scoring.numeric import safe_fsum
from genrm_trio.domain.scoring.pairs import RANKING_MIDPOINT, JudgedComparison

__all__ = ["components", "largest_component", "preference_cycle_rate"]


def components(vertices: int, edges: Iterable[tuple[int, int]]) -> list[list[int]]:
    """The connected components of the graph on ``0..vertices-1``, each in ascending order,
    ordered by their smallest vertex (union-find with path halving)."""
    parent = list(range(vertices))

    def root(v: int) -> int:
        while parent[v] != v:
            parent[v] = parent[parent[v]]
            v = parent[v]
        return v

    for a, b in edges:
        ra, rb = root(a), root(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)  # the root is the component's smallest vertex
    groups: dict[int, list[int]] = {}
    for v in range(vertices):
        groups.setdefault(root(v), []).append(v)
    return list(groups.values())  # roots first seen in ascending order


def largest_component(vertices: int, edges: Iterable[tuple[int, int]]) -> list[int]:
    """The component with the most vertices; on a tie in size, the one holding the smallest
    vertex. Empty only for an empty graph."""
    best: list[int] = []
    for component in components(vertices, edges):
        if len(component) > len(best):  # strictly larger: an earlier (smaller-vertex) one wins ties
            best = component
    return best


def _sign(x: float) -> int:
    return (x > 0) - (x < 0)


def preference_cycle_rate(
    comparisons: Sequence[JudgedComparison], members: Sequence[int]
) -> float | None:
    """Among triangles of distinct ``members`` whose three pairs each have a decided mean
    preference, the share that is cyclic (a over b, b over c, c over a); None without any.

    A pair's mean preference is from all its comparisons, both orientations and every pass:
    decided when the mean ranking relative to the lower index differs from 3.5 (mean y ≠ 0.5).
    """
    scored = set(members)
    margins: dict[tuple[int, int], list[float]] = {}
    for judged in comparisons:
        i, j = judged.i, judged.j
        if i == j or i not in scored or j not in scored:
            continue
        a, b = (i, j) if i < j else (j, i)
        r = judged.scores[2] if i == a else 7 - judged.scores[2]
        margins.setdefault((a, b), []).append(RANKING_MIDPOINT - r)
    # +1: the lower index preferred, -1: the higher one; undecided pairs are left out
    prefers: dict[tuple[int, int], int] = {}
    for pair, values in margins.items():
        sign = _sign(safe_fsum(values))
        if sign != 0:
            prefers[pair] = sign
    # Triangles by bitsets: bit c of decided[a] is set for each decided pair (a, c) with c > a,
    # of wins[a] when a is preferred there, of losses[a] when c is. A triangle a < b < c is one
    # bit of decided[a] & decided[b], found once from its lowest edge (a, b); it is cyclic when
    # (b, c) agrees with (a, b) and (a, c) opposes it. One AND and a popcount per decided pair:
    # O(pairs · N/64) word operations, where intersecting neighbour sets cost O(pairs · d).
    wins: dict[int, int] = {}
    losses: dict[int, int] = {}
    for (a, b), sign in prefers.items():
        if sign > 0:
            wins[a] = wins.get(a, 0) | 1 << b
        else:
            losses[a] = losses.get(a, 0) | 1 << b
    triangles = cyclic = 0
    for (a, b), ab in prefers.items():
        wins_a, losses_a = wins.get(a, 0), losses.get(a, 0)
        wins_b, losses_b = wins.get(b, 0), losses.get(b, 0)
        triangles += ((wins_a | losses_a) & (wins_b | losses_b)).bit_count()
        # a>b: cyclic with b>c and c>a; a<b: with b<c and c<a
        cyclic += (wins_b & losses_a if ab > 0 else losses_b & wins_a).bit_count()
    return cyclic / triangles if triangles else None
