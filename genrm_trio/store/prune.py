"""Retention in SQL (docs/durable-state.md, "Retention", on wall-clock times): the TTL, then the
count cap, oldest first. The rule itself is :class:`genrm_trio.domain.retention.Retention`."""

from __future__ import annotations

import sqlite3

from genrm_trio.domain.retention import Retention
from genrm_trio.store.rows import Mirrors

__all__ = ["prune"]


def prune(
    cur: sqlite3.Cursor,
    rule: Retention,
    mirrors: Mirrors,
    now: float,
    *,
    ttl: bool = True,
    cap: bool = True,
) -> tuple[int, int]:
    """The TTL, then the count cap (oldest first), each unless switched off. Index range
    scans only: it touches only what it drops. Watermarks of groups with an ``open`` cohort
    are never dropped. Returns (expired, evicted)."""
    horizon = rule.horizon(now) if ttl else None
    expired = evicted = 0
    if horizon is not None:
        keys = cur.execute(
            "SELECT key FROM cohorts WHERE terminal_at IS NOT NULL AND terminal_at <= ?",
            (horizon,),
        ).fetchall()
        if keys:
            mirrors.delete_cohorts(cur, keys)
        gone = cur.execute(
            "DELETE FROM watermarks WHERE updated_at <= ? AND group_id NOT IN "
            "(SELECT group_id FROM cohorts WHERE phase = 'open' AND group_id IS NOT NULL) "
            "RETURNING group_id",
            (horizon,),
        ).fetchall()
        mirrors.marks.difference_update(bytes(gid) for (gid,) in gone)
        expired = len(keys) + len(gone)
    if cap and rule.excess(len(mirrors.terminal)):
        # The oldest records in one row (one statement, see store/rows.py), then deleted.
        oldest = (
            "SELECT key FROM cohorts WHERE terminal_at IS NOT NULL "
            "ORDER BY terminal_at, key LIMIT ?"
        )
        over = (rule.excess(len(mirrors.terminal)),)
        (listed,) = cur.execute(f"SELECT group_concat(hex(key)) FROM ({oldest})", over).fetchone()
        cur.execute(f"DELETE FROM cohorts WHERE key IN ({oldest})", over)
        deleted = [bytes.fromhex(h) for h in str(listed).split(",")] if listed else []
        mirrors.terminal.difference_update(deleted)
        evicted += len(deleted)
    if cap and rule.excess(len(mirrors.marks)):
        gone = cur.execute(
            "DELETE FROM watermarks WHERE group_id IN (SELECT group_id FROM watermarks "
            "WHERE group_id NOT IN (SELECT group_id FROM cohorts WHERE phase = 'open' "
            "AND group_id IS NOT NULL) ORDER BY updated_at, group_id LIMIT ?) "
            "RETURNING group_id",
            (rule.excess(len(mirrors.marks)),),
        ).fetchall()
        mirrors.marks.difference_update(bytes(gid) for (gid,) in gone)
        evicted += len(gone)
    return expired, evicted
