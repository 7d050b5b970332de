"""EXPERIMENT ONLY — not a way to run the service: `genrm-trio serve` with the same app served by
the simulated judge's minimal HTTP/1.1 server (`genrm_trio/testing/server.py`) instead of hypercorn.

It sizes hypercorn's share of the server's CPU, of G=1 latency and of the G=64 memory peak
(docs/benchmarks.md, "Session 3"). That server is a benchmark tool: no TLS, no chunked request
bodies, no `Expect: 100-continue`, no graceful drain of requests in flight; production serving
is hypercorn's.

    python benchmarks/lean_serve.py serve --config CONFIG --judge-url URL [serve flags...]
    python benchmarks/run_suite.py --lean-server --only a:verify-G1-lat200ms
"""

from __future__ import annotations

import socket
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import trio

import genrm_trio.app.serve as serve_module
from genrm_trio.app.cli import main
from genrm_trio.testing.server import serve_h1


async def serve_app_on_h1(
    app: Any,
    sock: socket.socket,
    *,
    shutdown_trigger: Callable[[], Awaitable[None]],
    grace_s: float = 5.0,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """`serve.serve_app`'s contract on h1: the port the service bound, until the trigger."""
    host, port = sock.getsockname()[:2]
    sock.close()  # h1 binds its own listener on the same address
    async with trio.open_nursery() as nursery:

        async def run(task_status: trio.TaskStatus[int]) -> None:
            await serve_h1(app, host=host, port=port, task_status=task_status)

        await nursery.start(run)
        task_status.started(port)
        await shutdown_trigger()
        nursery.cancel_scope.cancel()


if __name__ == "__main__":
    serve_module.serve_app = serve_app_on_h1  # type: ignore[assignment]
    sys.exit(main(sys.argv[1:]))
