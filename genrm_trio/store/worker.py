"""The store's worker thread: runs blocking calls (SQLite, fsync) for trio, one at a time."""

from __future__ import annotations

import collections
import queue
import threading
from collections.abc import Callable
from contextlib import suppress
from typing import Any, TypeVar, final

import trio

_T = TypeVar("_T")


@final
class Worker:
    """One long-lived thread that runs blocking calls for trio, one at a time, in order.

    Why not ``trio.to_thread.run_sync``: the store's calls must run in order, one at a time, on
    one ``sqlite3`` connection, and trio's pool gives neither without a limiter. The store opens
    its connection in this thread (``store/sqlite.py``, ``_open``), which then owns it, so
    ``sqlite3``'s ``check_same_thread`` stays on and would catch a call from any other thread.
    It is also cheaper per call than trio's pool (docs/benchmarks.md, "The store's worker
    thread").

    A call, once queued, always runs to completion. Cancelling :meth:`run` abandons the wait,
    never the call: it still runs, in order, and later calls queue behind it, so the caller
    owns what "abandoned" means (the store's flusher is cancelled only when the store closes).
    """

    def __init__(self, name: str) -> None:
        self._calls: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        # trio-side submission times of the calls not yet done, oldest first (calls end in order)
        self._outstanding: collections.deque[float] = collections.deque()
        self._stopping = False

    def start(self) -> None:
        self._thread.start()

    def busy_since(self) -> float | None:
        """When the oldest call not yet done was queued (``trio.current_time()``), or None."""
        return self._outstanding[0] if self._outstanding else None

    def _serve(self) -> None:
        while (call := self._calls.get()) is not None:
            try:
                call.result = call.fn()
            except BaseException as exc:
                call.error = exc
            # A call abandoned by a trio run that has ended has nobody to tell.
            with suppress(trio.RunFinishedError):
                call.token.run_sync_soon(self._finished, call)

    def _finished(self, call: _Call) -> None:
        self._outstanding.popleft()
        call.done.set()

    async def run(self, fn: Callable[[], _T]) -> _T:
        call = _Call(fn, trio.lowlevel.current_trio_token())
        self._outstanding.append(trio.current_time())
        self._calls.put(call)
        await call.done.wait()
        if call.error is not None:
            raise call.error
        return call.result  # type: ignore[no-any-return]

    def run_later(self, fn: Callable[[], object]) -> None:
        """Queue ``fn`` after the calls queued so far, without waiting for it."""
        self._outstanding.append(trio.current_time())
        self._calls.put(_Call(fn, trio.lowlevel.current_trio_token()))

    def stop_soon(self) -> None:
        """Let the thread end after the calls queued so far (idempotent)."""
        if not self._stopping:
            self._stopping = True
            self._calls.put(None)

    async def stop(self) -> None:
        """:meth:`stop_soon`, then wait for the thread (cancellable: it is a daemon thread, and
        one stuck in a call is left behind)."""
        self.stop_soon()
        if self._thread.is_alive():
            await trio.to_thread.run_sync(self._thread.join, abandon_on_cancel=True)


@final
class _Call:
    __slots__ = ("done", "error", "fn", "result", "token")

    def __init__(self, fn: Callable[[], Any], token: trio.lowlevel.TrioToken) -> None:
        self.fn = fn
        self.token = token
        self.done = trio.Event()
        self.result: Any = None
        self.error: BaseException | None = None
