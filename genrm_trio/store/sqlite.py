"""Durable cohort state in SQLite (docs/durable-state.md): terminal records, fences, watermarks.

:class:`SqliteStore` implements the engine's
:class:`~genrm_trio.store.protocol.CohortStore` commit hooks on one stdlib ``sqlite3``
connection in WAL mode. The connection is only ever used from one long-lived worker thread, so
the trio loop never blocks on disk I/O; WAL fsyncs run in a second thread, beside new
transactions. Commits that arrive while a transaction is in flight are
grouped into the next one, and fsyncs likewise (group commit): concurrent cohorts share them.

What is stored is exactly what a replay reads: a terminal record is one ``cohorts`` row whose
members (digests, result mappings, masking) are one ``json.dumps`` text (repr floats round-trip
to the same IEEE doubles, lone surrogates survive as ``\\uXXXX`` escapes) and
texts that may hold lone surrogates (keys, group ids, failure messages) as UTF-8 BLOBs encoded
with ``surrogatepass``. Nothing is recomputed on load. Timestamps are wall-clock seconds; the
engine's clocks are monotonic, so :meth:`SqliteStore.load` reports each record's *age*.

This module is the store itself: the group-commit pipeline, load, retention and statistics. The
schema and its upgrades are :mod:`genrm_trio.store.schema`, the column encodings
:mod:`genrm_trio.store.codec`, the worker thread :mod:`genrm_trio.store.worker`.
"""

from __future__ import annotations

import fcntl
import logging
import math
import os
import sqlite3
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from functools import cache, partial
from pathlib import Path
from typing import Any, Final, Literal, final

import trio

from genrm_trio.config import Settings
from genrm_trio.domain.records import OpenRecord, TerminalRecord, WatermarkRecord, members_json
from genrm_trio.domain.retention import Retention
from genrm_trio.store.codec import (
    column_int,
    column_members,
    column_text,
    int_column,
    optional_column_text,
    optional_text_column,
    text_column,
)
from genrm_trio.store.errors import StoreError
from genrm_trio.store.lock import in_use_message
from genrm_trio.store.protocol import CommitsBySubmit
from genrm_trio.store.schema import prepare_schema, present_schema
from genrm_trio.store.worker import Worker

__all__ = [
    "INTERRUPTED_TEMPLATE",
    "LoadedState",
    "SqliteStore",
    "StoreError",
    "StoreStatistics",
    "open_store",
]

log = logging.getLogger("genrm_trio.store")

INTERRUPTED_TEMPLATE: Final = (
    "GenRM cohort {key!r} was interrupted by a server restart; retry the whole group with a new "
    "_ng_group_attempt"
)
# The engine's shutdown failure (docs/differences.md, D28). A cohort failed by a graceful stop
# keeps its `open` record, so that the next start turns it into the interrupted fence
# (docs/durable-state.md, "What happens at start") instead of
# answering "shutting down" forever.
_SHUTTING_DOWN: Final = "GenRM server is shutting down"
# The TTL pass runs at most this often (wall seconds); the count cap is checked on every commit.
_TTL_PRUNE_INTERVAL_S: Final = 1.0
_KEY_LOG_LIMIT: Final = 160
Synchronous = Literal["NORMAL", "FULL"]


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


@final
@dataclass(frozen=True, slots=True)
class StoreStatistics:
    path: str
    closed: bool
    transactions: int  # committed write transactions
    operations: int  # commit hooks applied (several share a transaction under load)
    fsyncs: int  # WAL fsyncs for terminal records (synchronous="FULL"; several share one)
    terminal_records: int
    watermarks: int
    queued: int  # operations waiting for the next transaction


# --- the store ---------------------------------------------------------------------------------


@final
class _Commit:
    """A queued commit of :class:`SqliteStore` (the :class:`~genrm_trio.store.protocol.Commit`
    protocol); ``_NOTHING`` is the one that had nothing to write."""

    __slots__ = ("_pending", "_store", "_sync")

    def __init__(self, store: SqliteStore | None, pending: _Pending | None, sync: bool) -> None:
        self._store = store
        self._pending = pending
        self._sync = sync

    async def wait(self) -> None:
        if self._store is None or self._pending is None:
            await trio.lowlevel.checkpoint()
            return
        await self._store._complete(self._pending, self._sync)


_NOTHING: Final = _Commit(None, None, False)


@final
@dataclass(frozen=True, slots=True)
class _TerminalRows:
    key: bytes
    retained: bool
    cohort: tuple[Any, ...]  # the cohorts row without terminal_at


_UPSERT_WATERMARKS: Final = (
    "INSERT OR REPLACE INTO watermarks (group_id, latest_attempt, prompt_digest, updated_at) "
    "VALUES "
)
_UPSERT_COHORTS: Final = (
    "INSERT OR REPLACE INTO cohorts (key, group_id, group_attempt, legacy, prompt_digest, phase, "
    "failure, failure_kind, members, terminal_at) VALUES "
)
_DELETE_COHORTS: Final = "DELETE FROM cohorts WHERE key IN "
_ROWS_PER_STATEMENT: Final = 128


@cache
def _rows_sql(head: str, width: int, count: int) -> str:
    if head == _DELETE_COHORTS:  # "key IN (?, ?, …)"
        return head + "(" + ", ".join("?" * count) + ")"
    row = "(" + ", ".join("?" * width) + ")"
    return head + ", ".join([row] * count)


def _write_rows(cur: sqlite3.Cursor, head: str, width: int, rows: list[tuple[Any, ...]]) -> None:
    """``rows`` in as few statements as possible. A chunk is padded to a power of two by
    repeating its last row (a no-op: the same row again), so few distinct statements exist."""
    for start in range(0, len(rows), _ROWS_PER_STATEMENT):
        chunk = rows[start : start + _ROWS_PER_STATEMENT]
        padded = chunk + [chunk[-1]] * ((1 << (len(chunk) - 1).bit_length()) - len(chunk))
        cur.execute(_rows_sql(head, width, len(padded)), [value for row in padded for value in row])


@final
class _Staged:
    """The rows one transaction writes: the last write per key wins (``None`` deletes)."""

    __slots__ = ("cohorts", "marks")

    def __init__(self) -> None:
        self.cohorts: dict[bytes, tuple[Any, ...] | None] = {}
        self.marks: dict[bytes, tuple[Any, ...]] = {}


@final
class _Pending:
    __slots__ = ("apply", "done", "error", "seq")

    def __init__(self, apply: Callable[[sqlite3.Cursor, float], None]) -> None:
        self.apply = apply
        self.seq = 0  # the committed transaction that holds it
        self.done = False
        self.error: BaseException | None = None


@final
class SqliteStore(CommitsBySubmit):
    """The engine's durable :class:`~genrm_trio.store.protocol.CohortStore` (SQLite, WAL).

    Create it with :func:`open_store`. It is a
    :class:`~genrm_trio.store.protocol.QueuedCohortStore`: ``submit_*`` queues a commit at once
    (FIFO) and returns a handle whose ``wait()`` returns once its transaction is committed; the
    ``commit_*`` hooks do both.
    """

    def __init__(
        self,
        path: str,
        settings: Settings,
        connection: sqlite3.Connection,
        lock_fd: int,
        clock: Callable[[], float],
        present: tuple[set[bytes], set[bytes]],
        synchronous: Synchronous,
    ) -> None:
        self.path = path
        self._settings = settings
        self._retention = Retention.of(settings)
        self._db = connection
        self._lock_fd = lock_fd
        self._clock = clock
        self._synchronous = synchronous
        self._wal_fd: int | None = None
        self._syncing = False
        self._synced = 0  # every transaction up to this sequence number is on disk
        self._fsyncs = 0
        self._sync_done = trio.Event()
        self._sync_error: StoreError | None = None
        self._writer = Worker("genrm-trio store writer")
        self._syncer = Worker("genrm-trio store fsync")
        # Mirrors of which keys hold a terminal record and which groups a watermark, kept by the
        # writer thread: counts for retention, and no SELECT before each write.
        self._terminal_keys, self._mark_ids = present
        self._staged = _Staged()  # rows of the transaction being applied (writer thread)
        self._queue: list[_Pending] = []
        self._flushing = False
        self._flushed = trio.Event()
        self._io = trio.Lock()  # exclusive use of the connection (one worker thread at a time)
        self._closed = False
        self._transactions = 0
        self._operations = 0
        self._last_ttl_prune = -math.inf
        # Records handed to the engine by load(): re-committing an identical one is a no-op, so
        # that restoring them keeps their stored timestamps (see genrm_trio.app.compose).
        self._adopted: dict[str, TerminalRecord] = {}
        self._adopted_marks: dict[str, WatermarkRecord] = {}

    def start(self) -> None:
        """Start the worker threads (from trio, once the connection is open)."""
        self._writer.start()
        self._syncer.start()

    def __repr__(self) -> str:
        return f"<SqliteStore path={self.path!r} closed={self._closed}>"

    @property
    def closed(self) -> bool:
        return self._closed

    def statistics(self) -> StoreStatistics:
        return StoreStatistics(
            path=self.path,
            closed=self._closed,
            transactions=self._transactions,
            operations=self._operations,
            fsyncs=self._fsyncs,
            terminal_records=len(self._terminal_keys),
            watermarks=len(self._mark_ids),
            queued=len(self._queue),
        )

    # --- CohortStore hooks (docs/architecture.md, "Durable-state commit points") ---------------

    def submit_watermark(self, record: WatermarkRecord) -> _Commit:
        """Commit point 1: a group's watermark was created or advanced (queued at once)."""
        if self._adopted_marks.pop(record.group_id, None) == record:
            return _NOTHING
        return self._enqueue(lambda cur, now: self._put_watermark(record, now))

    def submit_open(self, record: OpenRecord) -> _Commit:
        """Commit point 2: a cohort was created (it replaces any record under its key)."""
        self._adopted.pop(record.key, None)
        return self._enqueue(lambda cur, now: self._put_open(record))

    def submit_terminal(self, record: TerminalRecord) -> _Commit:
        """Commit point 3: the terminal record replaces the ``open`` one in one transaction.

        A record the engine does not retain (a completed legacy cohort without masked members)
        deletes the ``open`` record and keeps nothing. A cohort failed by a graceful shutdown
        keeps its ``open`` record, so the next start fences it as interrupted. A
        record that cannot be stored raises :class:`StoreError` here, before anything is queued.
        """
        if self._adopted.pop(record.key, None) == record:
            return _NOTHING
        if record.phase == "failed" and record.failure == _SHUTTING_DOWN:
            return _NOTHING
        rows = self._terminal_rows(record)
        return self._enqueue(lambda cur, now: self._put_terminal(rows, now), sync=True)

    async def commit_many(
        self, records: Sequence[TerminalRecord], watermarks: Sequence[WatermarkRecord] = ()
    ) -> None:
        """Terminal records and watermarks in one transaction (a checkpoint restore)."""
        todo = [self._terminal_rows(r) for r in records if self._adopted.pop(r.key, None) != r]
        marks = [m for m in watermarks if self._adopted_marks.pop(m.group_id, None) != m]
        if not todo and not marks:
            return

        def apply(cur: sqlite3.Cursor, now: float) -> None:
            for rows in todo:
                self._put_terminal(rows, now)
            for mark in marks:
                self._put_watermark(mark, now)

        await self._enqueue(apply, sync=True).wait()

    # --- loading (docs/durable-state.md, "What happens at start") ------------------------------

    async def load(self) -> LoadedState:
        """Apply the start-up rules in one transaction and return what the engine restores.

        Terminal records and watermarks older than ``cohort_result_ttl_s`` are deleted; an
        ``open`` record of an explicit group becomes a failed cohort-kind fence (persisted); an
        ``open`` legacy record is dropped; then only the newest ``max_terminal_cohorts`` records
        and watermarks are kept. A row that cannot be decoded is a :class:`StoreError`.
        """
        async with self._io:
            self._check_open()
            with trio.CancelScope(shield=True):
                state = await self._writer.run(self._load_sync)
        self._adopted = {r.key: r for r in state.records}
        self._adopted_marks = {m.group_id: m for m in state.watermarks}
        return state

    def end_adoption(self) -> None:
        """Forget the records of the last :meth:`load`: later commits of them write again."""
        self._adopted.clear()
        self._adopted_marks.clear()

    # --- closing ---------------------------------------------------------------------------

    async def aclose(self) -> None:
        """Wait for queued commits, then close the connection and release the file lock."""
        if self._closed:
            return
        with trio.CancelScope(shield=True):
            while self._queue or self._flushing:
                if self._flushing:
                    await self._flushed.wait()
                else:  # commits queued but not (yet) waited for
                    await self._flush()
            while self._syncing:
                await self._sync_done.wait()
            self._closed = True
            async with self._io:
                await self._writer.run(self._close_sync)
            await self._writer.stop()
            await self._syncer.stop()

    def _close_sync(self) -> None:
        try:
            self._db.close()
        finally:
            if self._wal_fd is not None:
                os.close(self._wal_fd)
            os.close(self._lock_fd)

    # --- group commit ----------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError(self.path, "the store is closed")

    def _enqueue(
        self, apply: Callable[[sqlite3.Cursor, float], None], *, sync: bool = False
    ) -> _Commit:
        """Queue one operation now (FIFO: it is applied in the same transaction as, or a later
        one than, everything queued before it); the returned commit's ``wait()`` returns once a
        committed transaction holds it (with ``sync`` under FULL: once that is on disk)."""
        self._check_open()
        pending = _Pending(apply)
        self._queue.append(pending)
        return _Commit(self, pending, sync and self._synchronous == "FULL")

    async def _submit(
        self, apply: Callable[[sqlite3.Cursor, float], None], *, sync: bool = False
    ) -> None:
        """Queue one operation and wait for it."""
        await self._enqueue(apply, sync=sync).wait()

    async def _complete(self, pending: _Pending, sync: bool) -> None:
        """Wait for ``pending``: whoever finds no transaction in flight runs one for everything
        queued; the others wait for it and retry. Shielded: an operation, once queued, is always
        applied or failed."""
        with trio.CancelScope(shield=True):
            while not pending.done:
                if self._flushing:
                    await self._flushed.wait()
                    continue
                await self._flush()
            if pending.error is None and sync:
                await self._sync_through(pending.seq)
        if pending.error is not None:
            raise StoreError(
                self.path, f"commit failed: {type(pending.error).__name__}: {pending.error}"
            ) from pending.error

    async def _flush(self) -> None:
        self._flushing = True
        batch, self._queue = self._queue, []
        error: BaseException | None = None
        try:
            async with self._io:
                try:
                    await self._writer.run(partial(self._apply_sync, batch))
                except Exception:
                    if len(batch) == 1:
                        raise
                    # One operation must not fail the others: retry each on its own.
                    for pending in batch:
                        try:
                            await self._writer.run(partial(self._apply_sync, [pending]))
                        except Exception as exc:
                            pending.error = exc
                            log.error("durable state %s: a commit failed", self.path, exc_info=exc)
                        pending.seq = self._transactions
                        pending.done = True
        except Exception as exc:
            error = exc
            log.error("durable state %s: a transaction failed", self.path, exc_info=exc)
        finally:
            for pending in batch:
                if not pending.done:
                    pending.error = error
                    pending.seq = self._transactions
                    pending.done = True
            self._flushing = False
            flushed, self._flushed = self._flushed, trio.Event()
            flushed.set()

    def _apply_sync(self, batch: list[_Pending]) -> None:
        """One write transaction for ``batch`` plus retention (worker thread)."""
        cur = self._db.cursor()
        try:
            cur.execute("BEGIN IMMEDIATE")
            now = self._clock()
            for pending in batch:
                pending.apply(cur, now)
            self._write_staged(cur)
            due = now - self._last_ttl_prune >= _TTL_PRUNE_INTERVAL_S or now < self._last_ttl_prune
            self._prune(cur, now, ttl=due)
            cur.execute("COMMIT")
            if due:
                self._last_ttl_prune = now
        except BaseException:
            self._rollback(cur)
            raise
        finally:
            cur.close()
        self._transactions += 1
        self._operations += len(batch)

    def _rollback(self, cur: sqlite3.Cursor) -> None:
        """Roll back the open transaction and read the mirrors back from the file (rare)."""
        self._staged = _Staged()
        with suppress(sqlite3.Error):
            if self._db.in_transaction:
                cur.execute("ROLLBACK")
            self._terminal_keys, self._mark_ids = present_schema(cur)

    # --- group fsync -----------------------------------------------------------------------

    async def _sync_through(self, seq: int) -> None:
        """Return once transaction ``seq`` is on disk: one fsync of the WAL covers every
        transaction committed before it started, and runs beside new transactions (it does
        not hold the connection), so commits that need no sync never wait for one."""
        while self._synced < seq:
            if self._sync_error is not None:
                raise self._sync_error
            if self._syncing:
                await self._sync_done.wait()
                continue
            self._syncing = True
            target = self._transactions
            try:
                await self._syncer.run(self._fsync_wal)
                self._synced = max(self._synced, target)
            except OSError as exc:
                # After a failed fsync the page cache may have dropped the data: never retry.
                self._sync_error = StoreError(self.path, f"fsync failed: {exc}")
                log.error("durable state %s: fsync failed", self.path, exc_info=exc)
            finally:
                self._syncing = False
                done, self._sync_done = self._sync_done, trio.Event()
                done.set()

    def _fsync_wal(self) -> None:
        """fsync the WAL (worker thread). SQLite in WAL mode writes every commit there first; a
        checkpoint (NORMAL mode) syncs the WAL before and the database file after copying."""
        if self._wal_fd is None:
            self._wal_fd = os.open(self.path + "-wal", os.O_RDONLY | os.O_CLOEXEC)
            _fsync_directory(self.path)  # the -wal file's directory entry, once
        os.fsync(self._wal_fd)
        self._fsyncs += 1

    # --- row writers (worker thread, inside a transaction) ---------------------------------
    #
    # Every write replaces a whole row, so the hooks only stage rows (the last one per key wins)
    # and _write_staged writes them with one multi-row statement per table. On this machine each
    # statement costs the writer thread a trip through the GIL, which the busy event loop hands
    # over only after a forced switch: 0.5–1.5 ms per statement measured, so rows per statement
    # is what keeps a durable store cheap (benchmarks/state_overhead.py).

    def _put_watermark(self, record: WatermarkRecord, now: float) -> None:
        gid = text_column(record.group_id)
        row = (gid, int_column(record.latest_attempt), record.prompt_digest, now)
        self._staged.marks[gid] = row

    def _put_open(self, record: OpenRecord) -> None:
        key = text_column(record.key)
        self._staged.cohorts[key] = (
            key,
            optional_text_column(record.group_id),
            int_column(record.group_attempt),
            int(record.legacy),
            record.prompt_digest,
            "open",
            None,
            None,
            None,
            None,
        )

    def _terminal_rows(self, record: TerminalRecord) -> _TerminalRows:
        """A terminal record encoded for SQLite, before it is queued: a record that cannot be
        stored (say a NaN in a result) fails its own commit and never a shared transaction."""
        try:
            key = text_column(record.key)
            cohort = (
                key,
                optional_text_column(record.group_id),
                int_column(record.group_attempt),
                int(record.legacy),
                record.prompt_digest,
                record.phase,
                optional_text_column(record.failure),
                record.failure_kind,
                members_json(record.members),
            )
        except (TypeError, ValueError) as exc:
            raise StoreError(
                self.path,
                f"cannot store the record of key {record.key[:_KEY_LOG_LIMIT]!r}: "
                f"{type(exc).__name__}: {exc}",
            ) from exc
        return _TerminalRows(key, record.retained, cohort)

    def _put_terminal(self, rows: _TerminalRows, now: float) -> None:
        self._staged.cohorts[rows.key] = (*rows.cohort, now) if rows.retained else None

    def _write_staged(self, cur: sqlite3.Cursor) -> None:
        """Write the staged rows (a few statements) and update the mirrors."""
        staged, self._staged = self._staged, _Staged()
        if staged.marks:
            _write_rows(cur, _UPSERT_WATERMARKS, 4, list(staged.marks.values()))
            self._mark_ids.update(staged.marks)
        upserts = [row for row in staged.cohorts.values() if row is not None]
        if upserts:
            _write_rows(cur, _UPSERT_COHORTS, 10, upserts)
        gone = [(key,) for key, row in staged.cohorts.items() if row is None]
        if gone:
            _write_rows(cur, _DELETE_COHORTS, 1, gone)
        for key, row in staged.cohorts.items():
            if row is None or row[5] == "open":
                self._terminal_keys.discard(key)
            else:
                self._terminal_keys.add(key)

    # --- retention (docs/durable-state.md, "Retention", on wall-clock times) ----------------

    def _delete_cohorts(self, cur: sqlite3.Cursor, keys: Sequence[tuple[bytes]]) -> None:
        _write_rows(cur, _DELETE_COHORTS, 1, [(bytes(key),) for (key,) in keys])
        self._terminal_keys.difference_update(bytes(key) for (key,) in keys)

    def _prune(
        self, cur: sqlite3.Cursor, now: float, *, ttl: bool = True, cap: bool = True
    ) -> tuple[int, int]:
        """The TTL, then the count cap (oldest first), each unless switched off. Index range
        scans only: it touches only what it drops. Watermarks of groups with an ``open`` cohort
        are never dropped. Returns (expired, evicted)."""
        rule = self._retention
        horizon = rule.horizon(now) if ttl else None
        expired = evicted = 0
        if horizon is not None:
            keys = cur.execute(
                "SELECT key FROM cohorts WHERE terminal_at IS NOT NULL AND terminal_at <= ?",
                (horizon,),
            ).fetchall()
            if keys:
                self._delete_cohorts(cur, keys)
            gone = cur.execute(
                "DELETE FROM watermarks WHERE updated_at <= ? AND group_id NOT IN "
                "(SELECT group_id FROM cohorts WHERE phase = 'open' AND group_id IS NOT NULL) "
                "RETURNING group_id",
                (horizon,),
            ).fetchall()
            self._mark_ids.difference_update(bytes(gid) for (gid,) in gone)
            expired = len(keys) + len(gone)
        if cap and rule.excess(len(self._terminal_keys)):
            # The oldest records in one row (one statement, see _write_staged), then deleted.
            oldest = (
                "SELECT key FROM cohorts WHERE terminal_at IS NOT NULL "
                "ORDER BY terminal_at, key LIMIT ?"
            )
            over = (rule.excess(len(self._terminal_keys)),)
            (listed,) = cur.execute(
                f"SELECT group_concat(hex(key)) FROM ({oldest})", over
            ).fetchone()
            cur.execute(f"DELETE FROM cohorts WHERE key IN ({oldest})", over)
            keys = [bytes.fromhex(h) for h in str(listed).split(",")] if listed else []
            self._terminal_keys.difference_update(keys)
            evicted += len(keys)
        if cap and rule.excess(len(self._mark_ids)):
            gone = cur.execute(
                "DELETE FROM watermarks WHERE group_id IN (SELECT group_id FROM watermarks "
                "WHERE group_id NOT IN (SELECT group_id FROM cohorts WHERE phase = 'open' "
                "AND group_id IS NOT NULL) ORDER BY updated_at, group_id LIMIT ?) "
                "RETURNING group_id",
                (rule.excess(len(self._mark_ids)),),
            ).fetchall()
            self._mark_ids.difference_update(bytes(gid) for (gid,) in gone)
            evicted += len(gone)
        return expired, evicted

    # --- load (worker thread) --------------------------------------------------------------

    def _load_sync(self) -> LoadedState:
        cur = self._db.cursor()
        try:
            cur.execute("BEGIN IMMEDIATE")
            now = self._clock()
            expired, evicted = self._prune(cur, now, cap=False)
            dropped = cur.execute(
                "DELETE FROM cohorts WHERE phase = 'open' AND legacy = 1"
            ).rowcount
            opened = cur.execute(
                "SELECT key FROM cohorts WHERE phase = 'open' ORDER BY key"
            ).fetchall()
            cur.executemany(
                "UPDATE cohorts SET phase = 'failed', failure = ?, failure_kind = 'cohort', "
                "terminal_at = ? WHERE key = ?",
                [
                    (text_column(INTERRUPTED_TEMPLATE.format(key=column_text(k))), now, k)
                    for (k,) in opened
                ],
            )
            self._terminal_keys.update(bytes(key) for (key,) in opened)
            more_expired, more_evicted = self._prune(cur, now, ttl=False)
            records, ages = self._read_records(cur, now)
            marks, mark_ages = self._read_watermarks(cur, now)
            cur.execute("COMMIT")
            if self._synchronous == "FULL":  # the fences it wrote are terminal records
                self._fsync_wal()
        except BaseException as exc:
            self._rollback(cur)
            if isinstance(exc, sqlite3.Error | ValueError | TypeError | KeyError):
                raise StoreError(self.path, f"cannot load: {type(exc).__name__}: {exc}") from exc
            raise
        finally:
            cur.close()
        self._transactions += 1
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

    def _read_records(
        self, cur: sqlite3.Cursor, now: float
    ) -> tuple[list[TerminalRecord], dict[str, float]]:
        records: list[TerminalRecord] = []
        ages: dict[str, float] = {}
        for row in cur.execute(
            "SELECT key, group_id, group_attempt, legacy, prompt_digest, phase, failure, "
            "failure_kind, terminal_at, members FROM cohorts ORDER BY terminal_at, key"
        ):
            key_blob, gid, attempt, legacy, digest, phase, failure, kind, terminal_at, packed = row
            key = column_text(key_blob)
            if phase not in ("completed", "failed") or terminal_at is None:
                raise ValueError(f"key {key!r}: unexpected phase {phase!r}")
            if (phase == "failed") != (kind in ("judge", "cohort")):
                raise ValueError(f"key {key!r}: failure_kind {kind!r} with phase {phase!r}")
            if not math.isfinite(terminal_at):
                raise ValueError(f"key {key!r}: terminal_at {terminal_at!r}")
            try:
                members = column_members(packed)
            except (ValueError, TypeError) as exc:
                raise ValueError(f"key {key!r}: members: {exc}") from None
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
        self, cur: sqlite3.Cursor, now: float
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


# --- opening -----------------------------------------------------------------------------------


def _fsync_directory(path: str) -> None:
    fd = os.open(Path(path).absolute().parent, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _open_sync(
    path: str, settings: Settings, clock: Callable[[], float], synchronous: Synchronous
) -> SqliteStore:
    """Open or create the state file (worker thread); every failure is a StoreError."""
    parent = Path(path).expanduser().absolute().parent
    if not parent.is_dir():
        raise StoreError(path, f"directory {str(parent)!r} does not exist")
    try:
        lock_fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise StoreError(path, f"cannot open: {exc.strerror or exc}") from exc
    db: sqlite3.Connection | None = None
    try:
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise StoreError(path, in_use_message(path)) from None
        db = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=5.0)
        present = prepare_schema(db, path)
        return SqliteStore(path, settings, db, lock_fd, clock, present, synchronous)
    except BaseException as exc:
        if db is not None:
            db.close()
        os.close(lock_fd)
        if isinstance(exc, sqlite3.Error):
            raise StoreError(path, f"not a usable SQLite database ({exc})") from exc
        raise


@asynccontextmanager
async def open_store(
    path: str | os.PathLike[str],
    settings: Settings,
    *,
    clock: Callable[[], float] = time.time,
    synchronous: Synchronous = "FULL",
) -> AsyncIterator[SqliteStore]:
    """Open (creating if absent) the SQLite state file at ``path`` and close it on exit.

    The directory must exist. An unreadable, corrupt or foreign file, a schema version this
    build does not read, or a file another process holds is a :class:`StoreError` naming the
    path. ``clock`` is the wall clock (injectable for tests).

    Durability: every commit survives a crash or kill of the process (WAL, ``PRAGMA
    synchronous=NORMAL``). With ``synchronous="FULL"`` (default) a terminal record is also on
    disk before :meth:`SqliteStore.commit_terminal` returns (so before any waiter is released),
    and every answered request survives a power loss or OS crash too. The fsync is grouped and
    runs beside new transactions: the WAL being sequential, one fsync covers every transaction
    before it, including the cohort's earlier ``open`` and watermark commits, which are not
    synced on their own (a power cut can lose only records of unanswered groups). ``"NORMAL"``
    syncs nothing per commit.
    """
    name = os.fspath(path)
    store = await trio.to_thread.run_sync(_open_sync, name, settings, clock, synchronous)
    store.start()
    try:
        yield store
    finally:
        await store.aclose()
