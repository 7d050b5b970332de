"""Group commit without SQL: operations queued in order, applied by the store's own tasks.

:class:`GroupCommit` owns two worker threads (:class:`~genrm_trio.store.worker.Worker`) and two
tasks that run in the store's nursery:

- the **flusher** takes everything queued so far and applies it in one transaction in the
  writer thread (``transact``); what is queued meanwhile goes into the next one. A transaction
  that fails is retried one operation at a time, so one bad operation fails only its own commit;
- the **syncer** runs ``fsync`` in the second thread whenever a waiter needs a transaction on
  disk; one fsync covers every transaction committed before it started, and it runs beside new
  transactions, so commits that need no sync never wait for one.

Waiting is cancel-safe: :meth:`GroupCommitHandle.wait` only waits for events the tasks set, so a
cancelled wait abandons the wait, never the commit (it is applied, in order, all the same). How
long a caller waits is the caller's choice (the engine bounds it by ``state_commit_timeout_s``);
:meth:`GroupCommit.stall_deadline` tells the store's close how long it may still wait. What an
operation is, and how it is written, is the store's (``transact`` receives the operations).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import suppress
from functools import partial
from typing import Generic, TypeVar, final

import trio

from genrm_trio.store.errors import StoreError
from genrm_trio.store.worker import Worker

__all__ = ["GroupCommit", "GroupCommitHandle"]

log = logging.getLogger("genrm_trio.store")

_CLOSED = "the store closed before this commit was confirmed"

Op = TypeVar("Op")


@final
class _Pending(Generic[Op]):
    __slots__ = ("batch", "error", "op", "seq")

    def __init__(self, op: Op, batch: _Batch[Op]) -> None:
        self.op = op
        self.batch = batch
        self.seq = 0  # the committed transaction that holds it
        self.error: BaseException | None = None


@final
class _Batch(Generic[Op]):
    """Operations the flusher takes together; ``done`` is set once each is applied or failed."""

    __slots__ = ("done", "pending")

    def __init__(self) -> None:
        self.pending: list[_Pending[Op]] = []
        self.done = trio.Event()


@final
class GroupCommitHandle(Generic[Op]):
    """A queued operation (the store protocol's ``Commit``); ``None`` pending: nothing to write."""

    __slots__ = ("_commits", "_pending", "_sync")

    def __init__(
        self, commits: GroupCommit[Op] | None, pending: _Pending[Op] | None, sync: bool
    ) -> None:
        self._commits = commits
        self._pending = pending
        self._sync = sync

    async def wait(self) -> None:
        """Return once a committed transaction holds the operation (with ``sync``, once that
        transaction is on disk); raise :class:`StoreError` if it failed. Cancel-safe."""
        pending = self._pending
        if self._commits is None or pending is None:
            await trio.lowlevel.checkpoint()
            return
        await pending.batch.done.wait()
        if pending.error is not None:
            raise StoreError(
                self._commits.path,
                f"commit failed: {type(pending.error).__name__}: {pending.error}",
            ) from pending.error
        if self._sync:
            await self._commits.synced_through(pending.seq)


@final
class GroupCommit(Generic[Op]):
    """The queue, the flusher and the syncer of one store (see the module docstring)."""

    def __init__(
        self,
        path: str,
        name: str,
        transact: Callable[[list[Op]], None],
        fsync: Callable[[], None],
        writer: Worker,
    ) -> None:
        self.path = path
        self._transact = transact
        self._fsync = fsync
        self.writer = writer  # started already: the store opened its connection in it
        self._syncer = Worker(f"{name} fsync")
        self._next: _Batch[Op] = _Batch()
        self._in_flight: _Batch[Op] | None = None
        self._work = trio.Event()
        self._scope = trio.CancelScope()
        self.transactions = 0  # committed write transactions (count_transaction for the others)
        self.operations = 0
        self._synced = 0  # every transaction up to this sequence number is on disk
        self._sync_wanted = 0
        self._sync_wake = trio.Event()
        self._sync_changed = trio.Event()
        self._sync_error: StoreError | None = None

    @property
    def queued(self) -> int:
        """Operations waiting for the next transaction."""
        return len(self._next.pending)

    def start(self, nursery: trio.Nursery) -> None:
        """Start the fsync thread, and the flusher and syncer in ``nursery`` (the store's)."""
        self._syncer.start()
        nursery.start_soon(self._tasks, name=f"{self.path} group commit")

    async def _tasks(self) -> None:
        with self._scope:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._flusher)
                nursery.start_soon(self._sync_loop)

    def count_transaction(self) -> None:
        """A transaction the store ran outside the queue (the load) was committed."""
        self.transactions += 1

    # --- queueing and flushing ---------------------------------------------------------------

    def enqueue(self, op: Op, *, sync: bool) -> GroupCommitHandle[Op]:
        """Queue ``op`` now (FIFO: it is applied in the same transaction as, or a later one
        than, everything queued before it)."""
        batch = self._next
        pending = _Pending(op, batch)
        batch.pending.append(pending)
        self._work.set()
        return GroupCommitHandle(self, pending, sync)

    async def _flusher(self) -> None:
        while True:
            while not self._next.pending:
                await self._work.wait()
                self._work = trio.Event()
            batch, self._next = self._next, _Batch()
            self._in_flight = batch
            try:
                await self._apply(batch.pending)
            finally:
                self._in_flight = None
                self._settle(batch, _CLOSED)

    async def _apply(self, batch: list[_Pending[Op]]) -> None:
        try:
            await self.writer.run(partial(self._transact, [p.op for p in batch]))
        except Exception as exc:
            if len(batch) == 1:
                log.error("durable state %s: a transaction failed", self.path, exc_info=exc)
                batch[0].error = exc
            else:  # one operation must not fail the others: retry each on its own
                for pending in batch:
                    try:
                        await self.writer.run(partial(self._transact, [pending.op]))
                    except Exception as one:
                        pending.error = one
                        log.error("durable state %s: a commit failed", self.path, exc_info=one)
                    else:
                        self.transactions += 1
                        self.operations += 1
                    pending.seq = self.transactions
            return
        self.transactions += 1
        self.operations += len(batch)
        for pending in batch:
            pending.seq = self.transactions

    def _settle(self, batch: _Batch[Op], reason: str) -> None:
        """Wake the batch's waiters; an operation still unapplied (the flusher was cancelled at
        close) fails with ``reason``."""
        for pending in batch.pending:
            if pending.seq == 0 and pending.error is None:
                pending.error = StoreError(self.path, reason)
        batch.done.set()

    # --- group fsync -------------------------------------------------------------------------

    async def synced_through(self, seq: int) -> None:
        """Return once transaction ``seq`` is on disk (raise the fsync failure, if any)."""
        while self._synced < seq:
            if self._sync_error is not None:
                raise self._sync_error
            if self._sync_wanted < seq:
                self._sync_wanted = seq
                self._sync_wake.set()
            await self._sync_changed.wait()

    async def _sync_loop(self) -> None:
        while True:
            while self._sync_error is not None or self._sync_wanted <= self._synced:
                await self._sync_wake.wait()
                self._sync_wake = trio.Event()
            target = self.transactions
            try:
                await self._syncer.run(self._fsync)
                self._synced = max(self._synced, target)
            except Exception as exc:
                # After a failed fsync the page cache may have dropped the data: never retry.
                self._sync_error = StoreError(self.path, f"fsync failed: {exc}")
                log.error("durable state %s: fsync failed", self.path, exc_info=exc)
            changed, self._sync_changed = self._sync_changed, trio.Event()
            changed.set()

    # --- closing -----------------------------------------------------------------------------

    def stall_deadline(self, timeout_s: float) -> float:
        """``timeout_s`` after the oldest call a thread has not finished yet (or from now): the
        latest a close may wait, so that a stalled thread never holds it longer."""
        started = [
            t for t in (self.writer.busy_since(), self._syncer.busy_since()) if t is not None
        ]
        return min(started, default=trio.current_time()) + timeout_s

    async def drained(self) -> None:
        """Return once nothing is queued or in flight and every requested fsync is done (or
        failed)."""
        while True:
            batch = self._next if self._next.pending else self._in_flight
            if batch is not None:
                await batch.done.wait()
            elif self._sync_error is None and self._sync_wanted > self._synced:
                with suppress(StoreError):
                    await self.synced_through(self._sync_wanted)
            else:
                return

    def stop_soon(self) -> None:
        """Stop the tasks (an operation not yet confirmed fails) and let the threads end after
        the calls queued so far (idempotent)."""
        self._scope.cancel()
        for batch in (self._in_flight, self._next):
            if batch is not None:
                self._settle(batch, _CLOSED)
        self.writer.stop_soon()
        self._syncer.stop_soon()

    async def join(self) -> None:
        """Wait for both threads to end (after :meth:`stop_soon`)."""
        await self.writer.stop()
        await self._syncer.stop()
