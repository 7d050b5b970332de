"""Durable cohort state in SQLite (docs/durable-state.md): terminal records, fences, watermarks.

:class:`SqliteStore` implements the engine's
:class:`~genrm_trio.store.protocol.CohortStore` commit hooks on one stdlib ``sqlite3``
connection in WAL mode. The connection is opened and used only in one long-lived worker thread,
so the trio loop never blocks on disk I/O; WAL fsyncs run in a second thread, beside new
transactions. Commits that arrive while a transaction is in flight are grouped into the next
one, and fsyncs likewise (group commit, by the store's own flusher and syncer tasks):
concurrent cohorts share them.

What is stored is exactly what a replay reads: a terminal record is one ``cohorts`` row whose
members (digests, result mappings, masking) are one ``json.dumps`` text (repr floats round-trip
to the same IEEE doubles, lone surrogates survive as ``\\uXXXX`` escapes) and
texts that may hold lone surrogates (keys, group ids, failure messages) as UTF-8 BLOBs encoded
with ``surrogatepass``. Nothing is recomputed on load. Timestamps are wall-clock seconds; the
engine's clocks are monotonic, so :meth:`SqliteStore.load` reports each record's *age*.

This module is the store itself: the commit hooks, the rows they write, and opening and closing.
The group-commit pipeline (queue, flusher, syncer; no SQL) is
:mod:`genrm_trio.store.group_commit`, retention :mod:`genrm_trio.store.prune`, the start-up load
:mod:`genrm_trio.store.load`, multi-row statements :mod:`genrm_trio.store.rows`, the schema
:mod:`genrm_trio.store.schema`, the column encodings :mod:`genrm_trio.store.codec` and the worker
thread :mod:`genrm_trio.store.worker`.
"""

from __future__ import annotations

import fcntl
import logging
import math
import os
import sqlite3
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Final, Literal, assert_never, final

import trio

from genrm_trio.config import Settings
from genrm_trio.domain.model import SHUTTING_DOWN
from genrm_trio.domain.records import OpenRecord, TerminalRecord, WatermarkRecord, members_json
from genrm_trio.domain.retention import Retention
from genrm_trio.domain.text import ID_LOGGED_LIMIT, shown_id
from genrm_trio.store.codec import int_column, optional_text_column, text_column
from genrm_trio.store.errors import StoreError
from genrm_trio.store.group_commit import GroupCommit, GroupCommitHandle
from genrm_trio.store.load import INTERRUPTED_TEMPLATE, LoadedState, apply_start_rules
from genrm_trio.store.lock import in_use_message
from genrm_trio.store.protocol import CommitsBySubmit
from genrm_trio.store.prune import prune
from genrm_trio.store.rows import (
    DELETE_COHORTS,
    UPSERT_COHORTS,
    UPSERT_WATERMARKS,
    Mirrors,
    write_rows,
)
from genrm_trio.store.schema import prepare_schema
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

# A cohort failed by a graceful stop (SHUTTING_DOWN, docs/differences.md, D28) keeps its `open`
# record, so that the next start turns it into the interrupted fence (docs/durable-state.md,
# "What happens at start") instead of answering "shutting down" forever.
# The TTL pass runs at most this often (wall seconds); the count cap is checked on every commit.
_TTL_PRUNE_INTERVAL_S: Final = 1.0
Synchronous = Literal["NORMAL", "FULL"]
"""How a terminal record's commit waits: FULL (the default) also fsyncs the WAL before it
returns; NORMAL skips that fsync (process crashes are still covered; docs/durable-state.md)."""
# One queued operation: it stages its rows, in the writer thread, inside the transaction.
_Apply = Callable[[sqlite3.Cursor, float], None]


def _fsyncs_terminal_records(synchronous: Synchronous) -> bool:
    match synchronous:  # exhaustive: mypy fails here until a new level has its case
        case "FULL":
            return True
        case "NORMAL":
            return False
        case _:
            assert_never(synchronous)


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

_NOTHING: Final[GroupCommitHandle[_Apply]] = GroupCommitHandle(None, None, False)


@final
@dataclass(frozen=True, slots=True)
class _TerminalRows:
    key: bytes
    retained: bool
    cohort: tuple[Any, ...]  # the cohorts row without terminal_at


@final
class _Staged:
    """The rows one transaction writes: the last write per key wins (``None`` deletes)."""

    __slots__ = ("cohorts", "marks")

    def __init__(self) -> None:
        self.cohorts: dict[bytes, tuple[Any, ...] | None] = {}
        self.marks: dict[bytes, tuple[Any, ...]] = {}


@final
class SqliteStore(CommitsBySubmit):
    """The engine's durable :class:`~genrm_trio.store.protocol.CohortStore` (SQLite, WAL).

    Create it with :func:`open_store`. It is a
    :class:`~genrm_trio.store.protocol.QueuedCohortStore`: ``submit_*`` queues a commit at once
    (FIFO) and returns a handle whose ``wait()`` returns once its transaction is committed; the
    ``commit_*`` hooks do both. Waits are cancel-safe: a cancelled wait never loses its commit.
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
        writer: Worker,
    ) -> None:
        self.path = path
        self._settings = settings
        self._retention = Retention.of(settings)
        self._db = connection
        self._lock_fd = lock_fd
        self._clock = clock
        self._fsync_terminal = _fsyncs_terminal_records(synchronous)
        self._wal_fd: int | None = None
        self._fsyncs = 0
        self._commits: GroupCommit[_Apply] = GroupCommit(
            path, "genrm-trio store", self._apply_sync, self._fsync_wal, writer
        )
        self._mirrors = Mirrors(present)
        self._staged = _Staged()  # rows of the transaction being applied (writer thread)
        self._closed = False
        self._last_ttl_prune = -math.inf
        # Records handed to the engine by load(): re-committing an identical one is a no-op, so
        # that restoring them keeps their stored timestamps (see genrm_trio.app.compose).
        self._adopted: dict[str, TerminalRecord] = {}
        self._adopted_marks: dict[str, WatermarkRecord] = {}

    def __repr__(self) -> str:
        return f"<SqliteStore path={self.path!r} closed={self._closed}>"

    @property
    def closed(self) -> bool:
        return self._closed

    def statistics(self) -> StoreStatistics:
        commits = self._commits
        return StoreStatistics(
            path=self.path,
            closed=self._closed,
            transactions=commits.transactions,
            operations=commits.operations,
            fsyncs=self._fsyncs,
            terminal_records=len(self._mirrors.terminal),
            watermarks=len(self._mirrors.marks),
            queued=commits.queued,
        )

    # --- CohortStore hooks (docs/architecture.md, "Durable-state commit points") ---------------

    def submit_watermark(self, record: WatermarkRecord) -> GroupCommitHandle[_Apply]:
        """Commit point 1: a group's watermark was created or advanced (queued at once)."""
        if self._adopted_marks.pop(record.group_id, None) == record:
            return _NOTHING
        return self._enqueue(lambda cur, now: self._put_watermark(record, now))

    def submit_open(self, record: OpenRecord) -> GroupCommitHandle[_Apply]:
        """Commit point 2: a cohort was created (it replaces any record under its key)."""
        self._adopted.pop(record.key, None)
        return self._enqueue(lambda cur, now: self._put_open(record))

    def submit_terminal(self, record: TerminalRecord) -> GroupCommitHandle[_Apply]:
        """Commit point 3: the terminal record replaces the ``open`` one in one transaction.

        A record the engine does not retain (a completed legacy cohort without masked members)
        deletes the ``open`` record and keeps nothing. A cohort failed by a graceful shutdown
        keeps its ``open`` record, so the next start fences it as interrupted. A
        record that cannot be stored raises :class:`StoreError` here, before anything is queued.
        """
        if self._adopted.pop(record.key, None) == record:
            return _NOTHING
        if record.phase == "failed" and record.failure == SHUTTING_DOWN:
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
        """Apply the start-up rules in one transaction and return what the engine restores
        (:func:`genrm_trio.store.load.apply_start_rules`). A row that cannot be decoded is a
        :class:`StoreError`. Cancellable: the load then finishes in the writer thread unseen."""
        self._check_open()
        state = await self._commits.writer.run(self._load_sync)
        self._commits.count_transaction()
        self._adopted = {r.key: r for r in state.records}
        self._adopted_marks = {m.group_id: m for m in state.watermarks}
        return state

    def end_adoption(self) -> None:
        """Forget the records of the last :meth:`load`: later commits of them write again."""
        self._adopted.clear()
        self._adopted_marks.clear()

    def _load_sync(self) -> LoadedState:
        cur = self._db.cursor()
        try:
            cur.execute("BEGIN IMMEDIATE")
            state = apply_start_rules(cur, self._retention, self._mirrors, self._clock())
            cur.execute("COMMIT")
            if self._fsync_terminal:  # the fences it wrote are terminal records
                self._fsync_wal()
        except BaseException as exc:
            self._rollback(cur)
            if isinstance(exc, sqlite3.Error | ValueError | TypeError | KeyError):
                raise StoreError(self.path, f"cannot load: {type(exc).__name__}: {exc}") from exc
            raise
        finally:
            cur.close()
        return state

    # --- closing ---------------------------------------------------------------------------

    def start(self, nursery: trio.Nursery) -> None:
        """Start the flusher and syncer in ``nursery`` (the store's own, see :func:`open_store`)."""
        self._commits.start(nursery)

    async def aclose(self) -> None:
        """Wait for queued commits, then close the connection and release the file lock.

        Bounded: a healthy store drains and closes in milliseconds, so the wait ends
        ``state_commit_timeout_s`` after the oldest call its threads have not finished (or
        after the close began). A store stalled past that is left behind (its threads are
        daemons; what it committed is in the WAL, which the next start reads), so a stalled disk
        never holds a shutdown.
        """
        if self._closed:
            return
        timeout = self._settings.state_commit_timeout_s
        commits = self._commits
        with trio.CancelScope(shield=True, deadline=commits.stall_deadline(timeout)) as bound:
            await commits.drained()
            self._closed = True
            await commits.writer.run(self._close_sync)
            commits.stop_soon()
            await commits.join()
        self._closed = True
        if bound.cancelled_caught:
            log.error(
                "durable state %s: still busy %ss after its oldest call began; closed without "
                "waiting for it (commits not confirmed by then are the next start's to recover)",
                self.path,
                timeout,
            )
            # If the writer ever gets there: the connection and the lock (not the WAL's fd,
            # which a stuck fsync may still hold).
            commits.writer.run_later(partial(self._close_sync, wal=False))
            commits.stop_soon()

    def _close_sync(self, *, wal: bool = True) -> None:
        if self._lock_fd < 0:
            return
        try:
            self._db.close()
        finally:
            if wal and self._wal_fd is not None:
                os.close(self._wal_fd)
            os.close(self._lock_fd)
            self._lock_fd = -1

    # --- group commit ----------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError(self.path, "the store is closed")

    def _enqueue(self, apply: _Apply, *, sync: bool = False) -> GroupCommitHandle[_Apply]:
        """Queue one operation now (FIFO: it is applied in the same transaction as, or a later
        one than, everything queued before it); the returned commit's ``wait()`` returns once a
        committed transaction holds it (with ``sync`` under FULL: once that is on disk)."""
        self._check_open()
        return self._commits.enqueue(apply, sync=sync and self._fsync_terminal)

    def _apply_sync(self, batch: list[_Apply]) -> None:
        """One write transaction for ``batch`` plus retention (writer thread)."""
        cur = self._db.cursor()
        try:
            cur.execute("BEGIN IMMEDIATE")
            now = self._clock()
            for apply in batch:
                apply(cur, now)
            self._write_staged(cur)
            due = now - self._last_ttl_prune >= _TTL_PRUNE_INTERVAL_S or now < self._last_ttl_prune
            prune(cur, self._retention, self._mirrors, now, ttl=due)
            cur.execute("COMMIT")
            if due:
                self._last_ttl_prune = now
        except BaseException:
            self._rollback(cur)
            raise
        finally:
            cur.close()

    def _rollback(self, cur: sqlite3.Cursor) -> None:
        """Roll back the open transaction and read the mirrors back from the file (rare)."""
        self._staged = _Staged()
        with suppress(sqlite3.Error):
            if self._db.in_transaction:
                cur.execute("ROLLBACK")
            self._mirrors.reread(cur)

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
    # The hooks only stage rows (the last one per key wins) and _write_staged writes them with
    # one multi-row statement per table (store/rows.py says why).

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
                f"cannot store the record of key {shown_id(record.key, ID_LOGGED_LIMIT)}: "
                f"{type(exc).__name__}: {exc}",
            ) from exc
        return _TerminalRows(key, record.retained, cohort)

    def _put_terminal(self, rows: _TerminalRows, now: float) -> None:
        self._staged.cohorts[rows.key] = (*rows.cohort, now) if rows.retained else None

    def _write_staged(self, cur: sqlite3.Cursor) -> None:
        """Write the staged rows (a few statements) and update the mirrors."""
        staged, self._staged = self._staged, _Staged()
        mirrors = self._mirrors
        if staged.marks:
            write_rows(cur, UPSERT_WATERMARKS, 4, list(staged.marks.values()))
            mirrors.marks.update(staged.marks)
        upserts = [row for row in staged.cohorts.values() if row is not None]
        if upserts:
            write_rows(cur, UPSERT_COHORTS, 10, upserts)
        gone = [(key,) for key, row in staged.cohorts.items() if row is None]
        if gone:
            write_rows(cur, DELETE_COHORTS, 1, gone)
        for key, row in staged.cohorts.items():
            if row is None or row[5] == "open":
                mirrors.terminal.discard(key)
            else:
                mirrors.terminal.add(key)


# --- opening -----------------------------------------------------------------------------------


def _fsync_directory(path: str) -> None:
    fd = os.open(Path(path).absolute().parent, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _open_sync(
    path: str,
    settings: Settings,
    clock: Callable[[], float],
    synchronous: Synchronous,
    writer: Worker,
) -> SqliteStore:
    """Open or create the state file (in ``writer``'s thread, which then owns the connection:
    ``check_same_thread`` stays on); every failure is a StoreError."""
    parent = Path(path).expanduser().absolute().parent
    if not parent.is_dir():
        raise StoreError(path, f"directory {str(parent)!r} does not exist")
    try:
        # 0600: the file holds every client's answers and results; SQLite creates the -wal and
        # -shm files with the database file's permissions
        lock_fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise StoreError(path, f"cannot open: {exc.strerror or exc}") from exc
    db: sqlite3.Connection | None = None
    try:
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise StoreError(path, in_use_message(path)) from None
        db = sqlite3.connect(path, isolation_level=None, timeout=5.0)
        present = prepare_schema(db, path)
        return SqliteStore(path, settings, db, lock_fd, clock, present, synchronous, writer)
    except BaseException as exc:
        if db is not None:
            db.close()
        os.close(lock_fd)
        if isinstance(exc, sqlite3.Error):
            raise StoreError(path, f"not a usable SQLite database ({exc})") from exc
        raise


async def _open(
    path: str, settings: Settings, clock: Callable[[], float], synchronous: Synchronous
) -> SqliteStore:
    writer = Worker("genrm-trio store writer")
    writer.start()
    opened: list[SqliteStore] = []

    def open_here() -> SqliteStore:
        store = _open_sync(path, settings, clock, synchronous, writer)
        opened.append(store)
        return store

    try:
        return await writer.run(open_here)
    except BaseException:
        # Failed or cancelled: whatever the thread opens is closed there, after the open.
        def close_opened() -> None:
            for store in opened:
                store._close_sync()

        writer.run_later(close_opened)
        writer.stop_soon()
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
    path. ``clock`` is the wall clock (injectable for tests). The store's flusher and syncer run
    in a nursery this context owns.

    Durability: every commit survives a crash or kill of the process (WAL, ``PRAGMA
    synchronous=NORMAL``). With ``synchronous="FULL"`` (default) a terminal record is also on
    disk before :meth:`SqliteStore.commit_terminal` returns (so before any waiter is released),
    and every answered request survives a power loss or OS crash too. The fsync is grouped and
    runs beside new transactions: the WAL being sequential, one fsync covers every transaction
    before it, including the cohort's earlier ``open`` and watermark commits, which are not
    synced on their own (a power cut can lose only records of unanswered groups). ``"NORMAL"``
    syncs nothing per commit.
    """
    store = await _open(os.fspath(path), settings, clock, synchronous)
    async with trio.open_nursery() as nursery:
        store.start(nursery)
        try:
            yield store
        finally:
            await store.aclose()
