"""Pure work off the event loop (docs/architecture.md, "Scoring off the loop"): a large group's
scoring, a large body's decoding, checkpoints, a long judge reply's verdict parsing. Below the
engine and the HTTP layer so that the judge's Comparator can use it too.

`score_off_loop` runs a pure function in a worker thread, one at a time per limiter,
with CPython's cyclic garbage collector paused while it runs. Why the pause: a large group's
scoring allocates 10⁵–10⁶ short-lived objects, enough to trigger collections whose traversals
hold the GIL for tens to hundreds of milliseconds at a time, and a collection pauses every
thread, the event loop's included (docs/benchmarks.md, "Scoring at scale", has the loop's gaps
with the collector running and paused). Those temporaries
are freed by reference counting as scoring proceeds (they form no cycles), so pausing the
collector skips its work rather than deferring it. The pause is process-wide, so it is
counted: the collector runs again when the last scoring thread ends, and only if it was enabled
when the first began.
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

import trio

__all__ = ["score_off_loop", "with_loop_turns"]

_T = TypeVar("_T")

_lock = threading.Lock()
_paused = 0  # scoring threads running with the collector paused
_resume = False  # whether the collector was enabled when the first of them began


def _without_collector(work: Callable[[], _T]) -> _T:
    global _paused, _resume
    with _lock:
        if _paused == 0:
            _resume = gc.isenabled()
            gc.disable()
        _paused += 1
    try:
        return work()
    finally:
        with _lock:
            _paused -= 1
            if _paused == 0 and _resume:
                gc.enable()


async def score_off_loop(
    work: Callable[[], _T], limiter: trio.CapacityLimiter, *, abandon_on_cancel: bool = False
) -> _T:
    """``work()`` in a worker thread under ``limiter``, the collector paused meanwhile. A
    cancellation waits for the thread: its result is still returned, and the cancellation
    reaches the caller at its next checkpoint (so a caller checks whether the result is still
    wanted, as `GroupRunner` does with the cohort's state). With ``abandon_on_cancel``, for work
    whose result nobody wants once cancelled, the caller is cancelled at once instead: the
    thread runs to its end unwatched and holds ``limiter`` until then."""
    return await trio.to_thread.run_sync(
        _without_collector, work, limiter=limiter, abandon_on_cancel=abandon_on_cancel
    )


_TURN_EVERY = 64
_TURN_S = 0.0001


def with_loop_turns(items: Iterable[_T]) -> Iterator[_T]:
    """`items`, with a 0.1 ms sleep after every 64, for a worker thread's loop whose steps
    release and retake the GIL (zlib, per record). A thread waiting for the GIL asks for it
    only when it has not changed hands for a whole switch interval, and each retake counts as
    a change: such a loop starved the event loop (80–108 ms of lateness while 2,000 records
    were unpacked for a checkpoint; 9 ms with these turns, docs/reliability.md, "Security")."""
    for position, item in enumerate(items, 1):
        yield item
        if position % _TURN_EVERY == 0:
            time.sleep(_TURN_S)
