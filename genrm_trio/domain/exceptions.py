"""Exception groups, read whole: every leaf, the one leaf of a group that has only one, the
first leaf of a kind, and a one-line description of them all (pure).

trio nurseries wrap what their tasks raise in groups, nested as the nurseries are; this is the
one walker every layer uses (domain/ is below them all).
"""

from __future__ import annotations

from typing import TypeVar

__all__ = ["describe", "first_leaf", "leaves", "sole_leaf"]

_E = TypeVar("_E", bound=BaseException)


def leaves(error: BaseException) -> list[BaseException]:
    """The non-group exceptions inside ``error``, depth first (``[error]`` if it is none)."""
    if not isinstance(error, BaseExceptionGroup):
        return [error]
    found: list[BaseException] = []
    for inner in error.exceptions:
        found.extend(leaves(inner))
    return found


def sole_leaf(error: BaseException) -> BaseException | None:
    """The one leaf of ``error`` however deeply nested, or None when it holds several (or none)."""
    found = leaves(error)
    return found[0] if len(found) == 1 else None


def first_leaf(error: BaseException, kind: type[_E]) -> _E | None:
    """The first leaf of ``error`` (depth first, every nested group searched) that is a
    ``kind``; None when there is none."""
    for leaf in leaves(error):
        if isinstance(leaf, kind):
            return leaf
    return None


def describe(error: BaseException) -> str:
    """Every leaf as ``Type: message`` (``Type`` alone when the message is empty), joined by
    ``"; "``: one line that loses none of a group's errors."""
    return "; ".join(
        f"{type(leaf).__name__}: {leaf}" if str(leaf) else type(leaf).__name__
        for leaf in leaves(error)
    )
