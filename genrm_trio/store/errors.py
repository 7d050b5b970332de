"""The store's one exception: the state file cannot be used.

Apart from the store so that the schema check (:mod:`genrm_trio.store.schema`) and the store
itself (:mod:`genrm_trio.store.sqlite`, which exports it) raise the same class.
"""

from __future__ import annotations

__all__ = ["StoreError"]


class StoreError(Exception):
    """The state file cannot be used: unreadable, corrupt, foreign, newer, locked or closed."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"state file {path}: {message}")
        self.path = path
        self.message = message
