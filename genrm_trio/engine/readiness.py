"""Which planned comparisons of a group can start, as its members arrive (pure).

With `eager_comparisons` a comparison starts as soon as both of its members are present
(docs/architecture.md, "One group"); the fixed baseline (index N) is present from the start.
:class:`Readiness` hands out each comparison exactly once, in plan order among those that became
ready together, so the judge queue sees them in a reproducible order.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import final

from genrm_trio.domain.scoring import PlannedComparison

__all__ = ["Readiness"]


@final
class Readiness:
    """The comparisons of one plan not started yet, indexed by the members they need."""

    __slots__ = ("_by_member", "_plan", "_present", "_size", "_started", "_unstarted")

    def __init__(self, plan: Sequence[PlannedComparison], size: int) -> None:
        self._size = size  # members 0..size-1; an index >= size is the fixed baseline
        self._by_member: list[list[int]] = [[] for _ in range(size)]
        for c, planned in enumerate(plan):
            for m in {planned.i, planned.j}:
                if m < size:
                    self._by_member[m].append(c)
        self._plan = list(plan)
        self._present = [False] * size
        self._started = [False] * len(plan)
        self._unstarted = len(plan)

    @property
    def unstarted(self) -> int:
        return self._unstarted

    def arrive(self, members: Sequence[int]) -> list[int]:
        """Mark ``members`` present; the comparisons this makes ready, in plan order (each is
        returned once, and counts as started from then on)."""
        for m in members:
            self._present[m] = True
        ready: set[int] = set()
        for m in members:
            for c in self._by_member[m]:
                if not self._started[c] and self._both_present(self._plan[c]):
                    ready.add(c)
        return self._take(sorted(ready))

    def rest(self) -> list[int]:
        """Every comparison not started yet, in plan order (the group is complete)."""
        return self._take([c for c, started in enumerate(self._started) if not started])

    def _both_present(self, planned: PlannedComparison) -> bool:
        return all(m >= self._size or self._present[m] for m in (planned.i, planned.j))

    def _take(self, comparisons: list[int]) -> list[int]:
        for c in comparisons:
            self._started[c] = True
        self._unstarted -= len(comparisons)
        return comparisons
