"""Exception groups, read whole: every leaf, and the one leaf of a group that has only one
(pure). trio nurseries wrap what their tasks raise in groups, nested as the nurseries are."""

from __future__ import annotations

__all__ = ["leaves", "sole_leaf"]


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
