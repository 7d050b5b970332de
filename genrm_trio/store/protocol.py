"""What the engine needs of a store: the commit hooks and the commit gate.

:class:`CohortStore` is the simple form (three async hooks, one per commit point);
:class:`QueuedCohortStore` is the engine's fast path (commits queued without awaiting, applied in
submission order). :func:`queued` gives the engine the second form of any store, serializing a
plain one through :class:`SerialCommits`. The records committed are plain data
(:mod:`genrm_trio.domain.records`); this module holds the trio part, apart from them, so that
the domain does no I/O.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from contextlib import suppress
from functools import partial
from typing import Protocol, final, runtime_checkable

import trio

from genrm_trio.domain.records import OpenRecord, TerminalRecord, WatermarkRecord
from genrm_trio.store.errors import CommitTimeout

__all__ = [
    "CohortStore",
    "Commit",
    "CommitsBySubmit",
    "QueuedCohortStore",
    "SerialCommits",
    "queued",
]


class CohortStore(Protocol):
    """Durable state hooks, one per commit point (docs/architecture.md; the simple form).

    Each hook returns once its record is committed. A store with only these hooks is driven
    through :class:`SerialCommits`, which runs them one at a time in submission order; a store
    that can queue commits itself implements :class:`QueuedCohortStore` as well.
    ``commit_terminal`` replaces the cohort's ``open`` record in one transaction. An exception
    from a hook is a bug (it reaches the request that hit it; a terminal commit failure is
    logged and the waiters are still released so that no request hangs). A hook call that takes
    longer than ``state_commit_timeout_s`` is cancelled and fails with ``CommitTimeout``.
    """

    async def commit_watermark(self, record: WatermarkRecord) -> None: ...

    async def commit_open(self, record: OpenRecord) -> None: ...

    async def commit_terminal(self, record: TerminalRecord) -> None: ...


class Commit(Protocol):
    """A queued commit. ``wait()`` returns once it is committed (raising what it failed with);
    any number of tasks may wait, any number of times. ``wait()`` is cancel-safe: a cancelled
    wait abandons the wait, never the commit, which is still applied in order. How long to wait
    is the caller's to bound (the engine: ``state_commit_timeout_s``, shielded)."""

    async def wait(self) -> None: ...


@runtime_checkable
class QueuedCohortStore(CohortStore, Protocol):
    """A store that queues commits synchronously: the engine's fast path.

    Contract of the ``submit_*`` methods: they never await; the commit is queued when the call
    returns, and the store applies queued commits **in submission order** (later ones may share
    a transaction with earlier ones, never precede them). The engine submits the watermark and
    ``open`` records while it holds its registry lock, so the store sees them in registry order,
    then releases the lock and waits for the returned :class:`Commit` before it attaches the
    request; a cohort's terminal record is submitted after its ``open`` record, so FIFO order
    makes every prefix of the store's history consistent. The engine waits for every commit it
    submits (a store may rely on a waiter to drive its queue). A ``submit_*`` call may raise
    (say, the store is closed): that is the request's error, like a failed commit.
    ``commit_many`` applies terminal records and watermarks in one transaction (a checkpoint
    restore), in order after everything submitted before it.
    """

    def submit_watermark(self, record: WatermarkRecord) -> Commit: ...

    def submit_open(self, record: OpenRecord) -> Commit: ...

    def submit_terminal(self, record: TerminalRecord) -> Commit: ...

    async def commit_many(
        self, records: Sequence[TerminalRecord], watermarks: Sequence[WatermarkRecord] = ()
    ) -> None: ...


@final
class _SerialCommit:
    """One hook call of :class:`SerialCommits`: runs once, after its predecessor finished."""

    __slots__ = ("_call", "_done", "_error", "_previous", "_started", "_timeout_s")

    def __init__(
        self,
        call: Callable[[], Awaitable[None]],
        previous: _SerialCommit | None,
        timeout_s: float,
    ) -> None:
        self._call: Callable[[], Awaitable[None]] | None = call
        self._previous = previous
        self._timeout_s = timeout_s
        self._started = False
        self._done = trio.Event()
        self._error: Exception | None = None

    async def wait(self) -> None:
        if self._started:
            await self._done.wait()
        else:
            self._started = True
            # Shielded: the hook runs in the first waiter's task, and a waiter cancelled
            # mid-hook must not abandon the commit. Bounded by the commit timeout: the hook is
            # the store's code, and one that never returns must not hold a request or a
            # shutdown (its predecessor's wait counts against the same bound).
            deadline = trio.current_time() + self._timeout_s
            try:
                with trio.CancelScope(shield=True, deadline=deadline) as bound:
                    previous, self._previous = self._previous, None
                    if previous is not None:
                        await previous._finished()
                    call, self._call = self._call, None
                    assert call is not None
                    try:
                        await call()
                    except Exception as exc:
                        self._error = exc
                if bound.cancelled_caught and self._error is None:
                    self._error = CommitTimeout("the store's commit hook", self._timeout_s)
            finally:
                self._done.set()
        if self._error is not None:
            raise self._error

    async def _finished(self) -> None:
        """Run it if nobody has yet (a predecessor nobody waits for), then wait for it."""
        if not self._started:
            with suppress(Exception):
                await self.wait()
        await self._done.wait()


class CommitsBySubmit:
    """The plain :class:`CohortStore` hooks of a :class:`QueuedCohortStore`: submit, then wait."""

    def submit_watermark(self, record: WatermarkRecord) -> Commit:
        raise NotImplementedError

    def submit_open(self, record: OpenRecord) -> Commit:
        raise NotImplementedError

    def submit_terminal(self, record: TerminalRecord) -> Commit:
        raise NotImplementedError

    async def commit_watermark(self, record: WatermarkRecord) -> None:
        await self.submit_watermark(record).wait()

    async def commit_open(self, record: OpenRecord) -> None:
        await self.submit_open(record).wait()

    async def commit_terminal(self, record: TerminalRecord) -> None:
        await self.submit_terminal(record).wait()


@final
class SerialCommits(CommitsBySubmit):
    """A :class:`QueuedCohortStore` over the plain async hooks of a :class:`CohortStore`.

    ``submit_*`` chains the hook call after the previous one; it runs when first waited for, so
    hooks run one at a time, in submission order. Meant for simple and test stores; it has no
    group commit and no ``commit_many`` of its own (it delegates when the inner store has one).
    A hook call that takes longer than ``timeout_s`` is cancelled and fails with
    :class:`~genrm_trio.store.errors.CommitTimeout`.
    """

    def __init__(self, inner: CohortStore, *, timeout_s: float) -> None:
        self.inner = inner
        self._timeout_s = timeout_s
        self._last: _SerialCommit | None = None

    def _chain(self, call: Callable[[], Awaitable[None]]) -> Commit:
        self._last = commit = _SerialCommit(call, self._last, self._timeout_s)
        return commit

    def submit_watermark(self, record: WatermarkRecord) -> Commit:
        return self._chain(partial(self.inner.commit_watermark, record))

    def submit_open(self, record: OpenRecord) -> Commit:
        return self._chain(partial(self.inner.commit_open, record))

    def submit_terminal(self, record: TerminalRecord) -> Commit:
        return self._chain(partial(self.inner.commit_terminal, record))

    async def commit_many(
        self, records: Sequence[TerminalRecord], watermarks: Sequence[WatermarkRecord] = ()
    ) -> None:
        many = getattr(self.inner, "commit_many", None)
        if many is not None:
            await self._chain(partial(many, records, watermarks)).wait()
            return
        for record in records:
            await self.commit_terminal(record)
        for mark in watermarks:
            await self.commit_watermark(mark)


def queued(store: CohortStore, *, timeout_s: float) -> QueuedCohortStore:
    """``store`` itself when it queues commits, else :class:`SerialCommits` around it (each hook
    call bounded by ``timeout_s``)."""
    if isinstance(store, QueuedCohortStore):
        return store
    return SerialCommits(store, timeout_s=timeout_s)
