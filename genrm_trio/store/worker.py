"""The store's worker thread: runs blocking calls (SQLite, fsync) for trio, one at a time."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar, final

import trio

_T = TypeVar("_T")


@final
class Worker:
    """One long-lived thread that runs blocking calls for trio, one at a time, in order.

    Why not ``trio.to_thread.run_sync``: an ``sqlite3`` connection belongs to the thread that
    opened it (``check_same_thread``), and the store's calls must run in order, one at a time;
    trio's pool gives neither without a limiter and a connection shared across threads. It is
    also a quarter to a third cheaper per call: 84-107 vs 113-150 us of CPU per no-op call
    (``python benchmarks/store_worker.py``), at three commits per group. A call, once queued,
    always runs to completion: the caller waits shielded.
    """

    def __init__(self, name: str) -> None:
        self._calls: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _serve(self) -> None:
        while (call := self._calls.get()) is not None:
            try:
                call.result = call.fn()
            except BaseException as exc:
                call.error = exc
            call.token.run_sync_soon(call.done.set)

    async def run(self, fn: Callable[[], _T]) -> _T:
        call = _Call(fn, trio.lowlevel.current_trio_token())
        self._calls.put(call)
        with trio.CancelScope(shield=True):
            await call.done.wait()
        if call.error is not None:
            raise call.error
        return call.result  # type: ignore[no-any-return]

    async def stop(self) -> None:
        if self._thread.is_alive():
            self._calls.put(None)
            await trio.to_thread.run_sync(self._thread.join)


@final
class _Call:
    __slots__ = ("done", "error", "fn", "result", "token")

    def __init__(self, fn: Callable[[], Any], token: trio.lowlevel.TrioToken) -> None:
        self.fn = fn
        self.token = token
        self.done = trio.Event()
        self.result: Any = None
        self.error: BaseException | None = None
