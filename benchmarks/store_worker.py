"""The store's worker thread against trio's thread pool: wall and CPU time per blocking call.

`genrm_trio.store.worker.Worker` is one long-lived thread per store; `trio.to_thread.run_sync`
is the library's way to run blocking calls. Both are timed on a no-op call, so what is measured
is the handoff to the thread and back (the store makes three commits per group).

    python benchmarks/store_worker.py [--calls 20000]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Awaitable, Callable

import trio

from genrm_trio.store.worker import Worker


def _noop() -> int:
    return 1


async def _time(name: str, call: Callable[[], Awaitable[int]], calls: int) -> None:
    for _ in range(500):  # warm-up: threads started, caches filled
        await call()
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(calls):
        await call()
    wall_us = (time.perf_counter() - wall) / calls * 1e6
    cpu_us = (time.process_time() - cpu) / calls * 1e6
    print(f"{name:>26}: {wall_us:6.1f} us wall, {cpu_us:6.1f} us CPU per call")


async def main(calls: int) -> None:
    worker = Worker("store-worker-bench")
    worker.start()
    try:
        await _time("Worker.run", lambda: worker.run(_noop), calls)
        await _time("trio.to_thread.run_sync", lambda: trio.to_thread.run_sync(_noop), calls)
    finally:
        await worker.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--calls", type=int, default=20000)
    trio.run(main, parser.parse_args().calls)
