"""The store's exceptions: the state file cannot be used, and a commit not confirmed in time.

Apart from the store so that the schema check (:mod:`genrm_trio.store.schema`) and the store
itself (:mod:`genrm_trio.store.sqlite`, which exports it) raise the same class.
"""

from __future__ import annotations

__all__ = ["CommitTimeout", "StoreError"]


class StoreError(Exception):
    """The state file cannot be used: unreadable, corrupt, foreign, newer, locked or closed."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"state file {path}: {message}")
        self.path = path
        self.message = message


class CommitTimeout(Exception):
    """A commit not confirmed within ``state_commit_timeout_s``: the store is stalled (a disk
    that does not return, a hook that hangs). The SQLite store still applies it later, in
    order, if its thread ever returns; a plain store's hook call is cancelled."""

    def __init__(self, what: str, timeout_s: float) -> None:
        super().__init__(f"{what} not confirmed within {timeout_s}s (state_commit_timeout_s)")
        self.timeout_s = timeout_s
