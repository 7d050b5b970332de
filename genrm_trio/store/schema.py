"""The state file's SQL schema: create it, check it, and upgrade an older one in place.

:func:`prepare_schema` runs once per open, on the fresh connection; :func:`present_schema`
reads which keys and groups hold records (at open, and after a rolled-back transaction).
"""

from __future__ import annotations

import json
import logging
import sqlite3
from typing import Final

from genrm_trio.domain.records import MemberRecord, members_json
from genrm_trio.store.codec import column_text, optional_column_text
from genrm_trio.store.errors import StoreError

__all__ = ["APPLICATION", "SCHEMA_VERSION"]

# The one logger of the store, whichever module logs: operators and tests filter on its name.
log = logging.getLogger("genrm_trio.store")

SCHEMA_VERSION: Final = 2
APPLICATION: Final = "genrm-trio"

_SCHEMA: Final = (
    "CREATE TABLE meta (name TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID",
    # group_attempt has no type affinity: an int64 as INTEGER, a larger int as its decimal text.
    """CREATE TABLE cohorts (
        key BLOB PRIMARY KEY,
        group_id BLOB,
        group_attempt NOT NULL,
        legacy INTEGER NOT NULL,
        prompt_digest TEXT NOT NULL,
        phase TEXT NOT NULL CHECK (phase IN ('open', 'completed', 'failed')),
        failure BLOB,
        failure_kind TEXT CHECK (failure_kind IN ('judge', 'cohort')),
        terminal_at REAL,
        members TEXT
    ) WITHOUT ROWID""",
    "CREATE INDEX cohorts_by_terminal_at ON cohorts (terminal_at) WHERE terminal_at IS NOT NULL",
    "CREATE INDEX cohorts_open_groups ON cohorts (group_id) WHERE phase = 'open'",
    """CREATE TABLE watermarks (
        group_id BLOB PRIMARY KEY,
        latest_attempt NOT NULL,
        prompt_digest TEXT NOT NULL,
        updated_at REAL NOT NULL
    ) WITHOUT ROWID""",
    "CREATE INDEX watermarks_by_updated_at ON watermarks (updated_at)",
)


def present_schema(cur: sqlite3.Cursor | sqlite3.Connection) -> tuple[set[bytes], set[bytes]]:
    """The keys that hold a terminal record, and the groups that hold a watermark."""
    terminal = {
        bytes(key) for (key,) in cur.execute("SELECT key FROM cohorts WHERE terminal_at NOT NULL")
    }
    return terminal, {bytes(gid) for (gid,) in cur.execute("SELECT group_id FROM watermarks")}


def _migrate_v1(db: sqlite3.Connection) -> None:
    """Schema 1 → 2 in one transaction: each cohort's ``members`` rows become its ``members``
    column (one row per terminal record instead of one per member)."""
    db.execute("BEGIN IMMEDIATE")
    try:
        db.execute("ALTER TABLE cohorts ADD COLUMN members TEXT")
        packed: dict[bytes, dict[int, MemberRecord]] = {}
        for key, index, digest, result, masked, reason in db.execute(
            "SELECT key, rollout_index, response_digest, result, masked_alone, failure_reason "
            "FROM members"
        ):
            decoded = None if result is None else json.loads(result)
            if decoded is not None and type(decoded) is not dict:
                raise ValueError(
                    f"member {index} of key {column_text(key)!r}: result is not an object"
                )
            packed.setdefault(bytes(key), {})[int(index)] = MemberRecord(
                response_digest=str(digest),
                result=decoded,
                masked_alone=bool(masked),
                failure_reason=optional_column_text(reason),
            )
        db.executemany(
            "UPDATE cohorts SET members = ? WHERE key = ?",
            [(members_json(members), key) for key, members in packed.items()],
        )
        db.execute("DROP TABLE members")
        db.execute(
            "UPDATE meta SET value = ? WHERE name = 'schema_version'", (str(SCHEMA_VERSION),)
        )
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise


def prepare_schema(db: sqlite3.Connection, path: str) -> tuple[set[bytes], set[bytes]]:
    """Check, create or upgrade the schema; returns :func:`present_schema`."""
    tables = {
        str(name) for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
    }
    mode = db.execute("PRAGMA journal_mode = WAL").fetchone()[0]
    if str(mode).lower() != "wal":
        raise StoreError(path, f"cannot switch to WAL mode (journal_mode={mode})")
    db.execute("PRAGMA synchronous = NORMAL")
    db.execute("PRAGMA busy_timeout = 5000")
    if not tables:
        db.execute("BEGIN IMMEDIATE")
        try:
            for statement in _SCHEMA:
                db.execute(statement)
            db.executemany(
                "INSERT INTO meta (name, value) VALUES (?, ?)",
                [("application", APPLICATION), ("schema_version", str(SCHEMA_VERSION))],
            )
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        return set(), set()
    if "meta" not in tables:
        raise StoreError(path, "not a genrm-trio state file (no meta table)")
    meta = {str(k): str(v) for k, v in db.execute("SELECT name, value FROM meta")}
    if meta.get("application") != APPLICATION:
        raise StoreError(
            path, f"not a genrm-trio state file (application={meta.get('application')!r})"
        )
    version = meta.get("schema_version")
    if version not in ("1", str(SCHEMA_VERSION)):
        raise StoreError(
            path,
            f"schema version {version} is not supported by this genrm-trio (it reads version "
            f"{SCHEMA_VERSION}); use the genrm-trio that wrote it, or start with a new file",
        )
    problems = [str(row[0]) for row in db.execute("PRAGMA quick_check")]
    if problems != ["ok"]:
        raise StoreError(path, "the database is corrupt: " + "; ".join(problems[:5]))
    if version == "1":
        try:
            _migrate_v1(db)
        except (ValueError, TypeError) as exc:
            raise StoreError(path, f"cannot upgrade schema 1 to {SCHEMA_VERSION}: {exc}") from exc
        log.info("durable state %s: upgraded schema 1 to %d", path, SCHEMA_VERSION)
    return present_schema(db)
