"""Which planned comparisons of a group can start, as its members arrive (pure).

With `eager_comparisons` a comparison starts as soon as both of its members are present
(docs/architecture.md, "One group"); the fixed baseline (index N) is present from the start.
:class:`Readiness` hands out each comparison exactly once, in plan order among those that became
ready together, so the judge queue sees them in a reproducible order. Finding what is ready
(:meth:`Readiness.arrive`) does not claim it: the caller claims (:meth:`Readiness.take`) only what
it starts, so a comparison it could not start is left to :meth:`Readiness.rest`.

A group waiting for its members holds only two bit sets here (members present, comparisons
started); the member → comparisons index (:class:`ReadinessIndex`) depends only on the plan, so
one is shared by every group of the same plan.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import final

from genrm_trio.domain.scoring import PlannedComparison

__all__ = ["Readiness", "ReadinessIndex"]


@final
class ReadinessIndex:
    """For one plan: the comparisons each member takes part in, and the members each needs."""

    __slots__ = ("by_member", "needs", "size", "total")

    def __init__(self, plan: Sequence[PlannedComparison], size: int) -> None:
        self.size = size  # members 0..size-1; an index >= size is the fixed baseline
        self.total = len(plan)
        by_member: list[list[int]] = [[] for _ in range(size)]
        needs: list[int] = []  # per comparison, the bit set of the members it needs
        for c, planned in enumerate(plan):
            mask = 0
            for m in {planned.i, planned.j}:
                if m < size:
                    by_member[m].append(c)
                    mask |= 1 << m
            needs.append(mask)
        self.by_member = tuple(tuple(cs) for cs in by_member)
        self.needs = tuple(needs)


@final
class Readiness:
    """One group's progress through its plan: members present, comparisons handed out."""

    __slots__ = ("_index", "_present", "_started", "unstarted")

    def __init__(self, index: ReadinessIndex) -> None:
        self._index = index
        self._present = 0  # bit m: member m is present
        self._started = 0  # bit c: comparison c was handed out
        self.unstarted = index.total

    def arrive(self, members: Sequence[int]) -> list[int]:
        """Mark ``members`` present; the comparisons this makes ready and not yet taken, in plan
        order. Nothing is claimed: :meth:`take` the ones started, or :meth:`rest` returns them."""
        index = self._index
        for m in members:
            self._present |= 1 << m
        ready: set[int] = set()
        for m in members:
            for c in index.by_member[m]:
                need = index.needs[c]
                if not self._started >> c & 1 and self._present & need == need:
                    ready.add(c)
        return sorted(ready)

    def take(self, comparisons: Sequence[int]) -> None:
        """Claim ``comparisons`` (from :meth:`arrive`) as started. Raises ValueError for one
        already taken: a comparison is started once."""
        for c in comparisons:
            if self._started >> c & 1:
                raise ValueError(f"comparison {c} was already taken")
            self._started |= 1 << c
        self.unstarted -= len(comparisons)

    def rest(self) -> list[int]:
        """Take every comparison not started yet, in plan order (the group is complete)."""
        rest = [c for c in range(self._index.total) if not self._started >> c & 1]
        self.take(rest)
        return rest
