"""Loading the state file at start (docs/durable-state.md, "What happens at start").

:func:`apply_start_rules` runs inside the load's one transaction (the store opens and commits
it, in its writer thread): the TTL, the interrupted fences, the count cap, then the read of what
the engine restores. Nothing is recomputed: a record reads back as it was stored.
"""

from __future__ import annotations

import math
import sqlite3
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, final

from genrm_trio.domain.records import TerminalRecord, WatermarkRecord, check_result
from genrm_trio.domain.retention import Retention
from genrm_trio.domain.text import shown_id
from genrm_trio.store.codec import (
    column_int,
    column_members,
    column_text,
    optional_column_text,
    text_column,
)
from genrm_trio.store.prune import prune
from genrm_trio.store.rows import Mirrors

__all__ = ["INTERRUPTED_TEMPLATE", "LoadedState", "apply_start_rules"]

INTERRUPTED_TEMPLATE: Final = (
    "GenRM cohort {key} was interrupted by a server restart; retry the whole group with a new "
    "_ng_group_attempt"
)


@final
@dataclass(frozen=True, slots=True)
class LoadedState:
    """What the engine restores at start (docs/durable-state.md), oldest record first.

    ``record_ages`` and ``watermark_ages`` are seconds since ``terminal_at`` / ``updated_at``
    (never negative), so the engine can set its monotonic clocks back by them.
    """

    records: tuple[TerminalRecord, ...]
    record_ages: Mapping[str, float]
    watermarks: tuple[WatermarkRecord, ...]
    watermark_ages: Mapping[str, float]
    interrupted: int = 0  # open explicit cohorts turned into fences by this load
    dropped_open: int = 0  # open legacy cohorts dropped by this load
    expired: int = 0  # terminal records and watermarks past cohort_result_ttl_s
    evicted: int = 0  # terminal records and watermarks over max_terminal_cohorts


def apply_start_rules(
    cur: sqlite3.Cursor, rule: Retention, mirrors: Mirrors, now: float
) -> LoadedState:
    """Terminal records and watermarks older than ``cohort_result_ttl_s`` are deleted; an
    ``open`` record of an explicit group becomes a failed cohort-kind fence; an ``open`` legacy
    record is dropped; then only the newest ``max_terminal_cohorts`` records and watermarks are
    kept. A row that cannot be decoded raises ValueError (or TypeError, KeyError)."""
    expired, evicted = prune(cur, rule, mirrors, now, cap=False)
    dropped = cur.execute("DELETE FROM cohorts WHERE phase = 'open' AND legacy = 1").rowcount
    opened = cur.execute("SELECT key FROM cohorts WHERE phase = 'open' ORDER BY key").fetchall()
    cur.executemany(
        "UPDATE cohorts SET phase = 'failed', failure = ?, failure_kind = 'cohort', "
        "terminal_at = ? WHERE key = ?",
        [
            (text_column(INTERRUPTED_TEMPLATE.format(key=shown_id(column_text(k)))), now, k)
            for (k,) in opened
        ],
    )
    mirrors.terminal.update(bytes(key) for (key,) in opened)
    more_expired, more_evicted = prune(cur, rule, mirrors, now, ttl=False)
    records, ages = _read_records(cur, now)
    marks, mark_ages = _read_watermarks(cur, now)
    return LoadedState(
        records=tuple(records),
        record_ages=ages,
        watermarks=tuple(marks),
        watermark_ages=mark_ages,
        interrupted=len(opened),
        dropped_open=dropped,
        expired=expired + more_expired,
        evicted=evicted + more_evicted,
    )


def _read_records(cur: sqlite3.Cursor, now: float) -> tuple[list[TerminalRecord], dict[str, float]]:
    records: list[TerminalRecord] = []
    ages: dict[str, float] = {}
    for row in cur.execute(
        "SELECT key, group_id, group_attempt, legacy, prompt_digest, phase, failure, "
        "failure_kind, terminal_at, members FROM cohorts ORDER BY terminal_at, key"
    ):
        key_blob, gid, attempt, legacy, digest, phase, failure, kind, terminal_at, packed = row
        key = column_text(key_blob)
        shown = shown_id(key)  # a client's id may be 10,000 characters: cut in the error line
        if phase not in ("completed", "failed") or terminal_at is None:
            raise ValueError(f"key {shown}: unexpected phase {phase!r}")
        if (phase == "failed") != (kind in ("judge", "cohort")):
            raise ValueError(f"key {shown}: failure_kind {kind!r} with phase {phase!r}")
        if not math.isfinite(terminal_at):
            raise ValueError(f"key {shown}: terminal_at {terminal_at!r}")
        try:
            members = column_members(packed)
            for index, member in members.items():
                if member.result is not None:  # as strictly as a restored one (checkpoint v1)
                    try:
                        check_result(member.result)
                    except ValueError as exc:
                        raise ValueError(f"member {index}: {exc}") from None
        except (ValueError, TypeError) as exc:
            raise ValueError(f"key {shown}: members: {exc}") from None
        records.append(
            TerminalRecord(
                key=key,
                group_id=optional_column_text(gid),
                group_attempt=column_int(attempt),
                legacy=bool(legacy),
                prompt_digest=str(digest),
                phase=phase,
                failure=optional_column_text(failure),
                failure_kind=kind,
                members=members,
            )
        )
        ages[key] = max(0.0, now - float(terminal_at))
    return records, ages


def _read_watermarks(
    cur: sqlite3.Cursor, now: float
) -> tuple[list[WatermarkRecord], dict[str, float]]:
    marks: list[WatermarkRecord] = []
    ages: dict[str, float] = {}
    for gid, attempt, digest, updated_at in cur.execute(
        "SELECT group_id, latest_attempt, prompt_digest, updated_at FROM watermarks "
        "ORDER BY updated_at, group_id"
    ):
        group_id = column_text(gid)
        marks.append(WatermarkRecord(group_id, column_int(attempt), str(digest)))
        ages[group_id] = max(0.0, now - float(updated_at))
    return marks, ages
