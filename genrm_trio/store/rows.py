"""Multi-row SQL statements, and the store's mirrors of which rows exist (worker thread only).

Every write replaces a whole row, so the store stages rows (the last one per key wins) and
writes them with one multi-row statement per table. Each statement costs the writer thread a
trip through the GIL, which the busy event loop hands over only after a forced switch, so rows
per statement is what keeps a durable store cheap (docs/benchmarks.md, "Durable state").
"""

from __future__ import annotations

import sqlite3
from functools import cache
from typing import Any, Final, final

from genrm_trio.store.schema import present_schema

__all__ = ["DELETE_COHORTS", "UPSERT_COHORTS", "UPSERT_WATERMARKS", "Mirrors", "write_rows"]

UPSERT_WATERMARKS: Final = (
    "INSERT OR REPLACE INTO watermarks (group_id, latest_attempt, prompt_digest, updated_at) "
    "VALUES "
)
UPSERT_COHORTS: Final = (
    "INSERT OR REPLACE INTO cohorts (key, group_id, group_attempt, legacy, prompt_digest, phase, "
    "failure, failure_kind, members, terminal_at) VALUES "
)
DELETE_COHORTS: Final = "DELETE FROM cohorts WHERE key IN "
_ROWS_PER_STATEMENT: Final = 128


@cache
def _rows_sql(head: str, width: int, count: int) -> str:
    if head == DELETE_COHORTS:  # "key IN (?, ?, …)"
        return head + "(" + ", ".join("?" * count) + ")"
    row = "(" + ", ".join("?" * width) + ")"
    return head + ", ".join([row] * count)


def write_rows(cur: sqlite3.Cursor, head: str, width: int, rows: list[tuple[Any, ...]]) -> None:
    """``rows`` in as few statements as possible. A chunk is padded to a power of two by
    repeating its last row (a no-op: the same row again), so few distinct statements exist."""
    for start in range(0, len(rows), _ROWS_PER_STATEMENT):
        chunk = rows[start : start + _ROWS_PER_STATEMENT]
        padded = chunk + [chunk[-1]] * ((1 << (len(chunk) - 1).bit_length()) - len(chunk))
        cur.execute(_rows_sql(head, width, len(padded)), [value for row in padded for value in row])


@final
class Mirrors:
    """Which keys hold a terminal record and which groups a watermark, kept by the writer
    thread: counts for retention, and no SELECT before each write."""

    __slots__ = ("marks", "terminal")

    def __init__(self, present: tuple[set[bytes], set[bytes]]) -> None:
        self.terminal, self.marks = present

    def reread(self, cur: sqlite3.Cursor) -> None:
        """Read both back from the file (after a rolled-back transaction)."""
        self.terminal, self.marks = present_schema(cur)

    def delete_cohorts(self, cur: sqlite3.Cursor, keys: list[tuple[bytes]]) -> None:
        write_rows(cur, DELETE_COHORTS, 1, [(bytes(key),) for (key,) in keys])
        self.terminal.difference_update(bytes(key) for (key,) in keys)
