"""Running the service: start-up checks, hypercorn's trio worker, signals and graceful shutdown.

`serve()` is what `genrm-trio serve` runs (docs/operations.md, "Start-up"): it logs the start-up
warnings (D12, D37), reads the secrets, probes the judge once, opens the engine, and serves the app
with hypercorn on a socket it binds itself, so a busy port is one clear error and never a leaked
socket. SIGINT/SIGTERM stop it gracefully (D28): stop accepting, fail the active cohorts so their
waiters get 503 `GenRM server is shutting down`, give those replies up to
`server.shutdown_grace_s` to be delivered, then stop at once: idle keep-alive connections do not
hold the shutdown, and a stalled durable store holds it at most `state_commit_timeout_s` longer.
A second signal exits the process at once (`exit_at_once`), unless it is the first one delivered
twice (`REPEAT_SIGNAL_WINDOW_S`).
"""

from __future__ import annotations

import errno
import gc
import ipaddress
import logging
import os
import signal
import socket
import sys
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager, suppress
from functools import partial
from typing import Any, Final, NoReturn, final

import hypercorn.trio
import trio
from hypercorn.config import Config, Sockets

from genrm_trio.app.fd_headroom import check_fd_headroom, with_admission
from genrm_trio.config import Settings, read_secret
from genrm_trio.judge.base import Judge
from genrm_trio.store.lock import check_not_in_use

log = logging.getLogger("genrm_trio.serve")

SIM_WARNING: Final = (
    "judge: simulated (--judge sim): rewards are simulated and say nothing about answer quality"
)


class ListenError(Exception):
    """The service could not bind its address (busy port, address not on this host, …)."""

    def __init__(self, host: str, port: int, reason: str) -> None:
        super().__init__(f"cannot listen on {host}:{port}: {reason}")
        self.host = host
        self.port = port
        self.reason = reason


LISTEN_BACKLOG: Final = 4096
"""The listening socket's accept queue (hypercorn's default is 100; uvicorn's 2048)."""

GC_THRESHOLDS: Final = (50_000, 20, 20)
"""Collector thresholds of a serving process (CPython's default is (700, 10, 10))."""


@contextmanager
def tuned_gc() -> Iterator[None]:
    """Make the cyclic garbage collector cheap while a long-running server runs inside.

    Every request allocates hundreds of containers (parsed JSON, hypercorn/h11/quart objects,
    trio tasks) that mostly die by reference counting, but at 700 allocations per young
    collection the collector ran every request or two and promoted in-flight request state to
    the older generations, whose full scans are long (the figures: docs/benchmarks.md, "What
    was changed, and what each change bought"). Freezing what start-up loaded (modules,
    settings) keeps it out of every later scan; larger thresholds make collections rarer.
    Cyclic garbage (trio exceptions and tracebacks) is still collected, in bigger batches. Enter
    it after importing what the process will run; the previous settings come back on exit.
    """
    previous = gc.get_threshold()
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
    try:
        yield
    finally:
        gc.set_threshold(*previous)
        gc.unfreeze()


def bind_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to `host:port` (port 0 picks a free port), not yet listening.

    A host name is resolved once, here. Binding here instead of inside hypercorn turns a busy
    port into one `ListenError` and closes the socket, where hypercorn would raise a doubly
    nested OSError and leak it.
    """
    try:
        ipaddress.ip_address(host)
        flags = socket.AI_NUMERICHOST | socket.AI_PASSIVE
    except ValueError:
        flags = socket.AI_PASSIVE
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=flags
        )[0]
    except (OSError, UnicodeError) as exc:
        raise ListenError(host, port, f"cannot resolve the host ({exc})") from None
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.setblocking(False)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            reason = "address already in use"
        else:
            reason = (exc.strerror or str(exc)).lower()
        raise ListenError(host, port, reason) from None
    return sock


def url_host(host: str) -> str:
    """`host` as it appears in a URL (IPv6 in brackets)."""
    return f"[{host}]" if ":" in host else host


@final
class _PreboundConfig(Config):
    """A hypercorn Config serving one socket bound by `bind_socket`."""

    def __init__(self, sock: socket.socket) -> None:
        super().__init__()
        self._sock = sock

    def create_sockets(self) -> Sockets:
        return Sockets(secure_sockets=[], insecure_sockets=[self._sock], quic_sockets=[])


def hypercorn_config(sock: socket.socket, *, grace_s: float) -> Config:
    """hypercorn settings for the service: no access log (hot path), errors to `genrm_trio.*`."""
    config = _PreboundConfig(sock)
    host, port = sock.getsockname()[:2]
    config.bind = [f"{url_host(host)}:{port}"]
    config.accesslog = None
    config.errorlog = logging.getLogger("genrm_trio.http.server")
    config.graceful_timeout = grace_s
    config.include_server_header = False
    # A trainer opens N connections per group, G groups at once: hypercorn's default accept
    # queue of 100 overflows at G >= 8 and the kernel drops the extra handshakes, which clients
    # retry after 1 s, 3 s, 7 s... (p99 of 20 s at G=64 in benchmarks/run_suite.py). The
    # kernel caps this at net.core.somaxconn.
    config.backlog = LISTEN_BACKLOG
    return config


@final
class RequestTracker:
    """An ASGI wrapper that counts the HTTP requests its app is still handling.

    A shutdown waits for these, not for connections: an idle keep-alive connection has nothing
    to deliver, yet hypercorn (0.18, with quart-trio's handlers and with the `/verify` fast
    path) would hold it open until `graceful_timeout`, because the handler's disconnect watcher
    cancels the task that was re-arming the connection's idle timer. NeMo Gym kills a server
    one second after SIGINT, so idle connections must not hold the shutdown.
    """

    def __init__(self, app: Any) -> None:
        self._app = app
        self._running = 0
        self._idle = trio.Event()
        self._idle.set()

    @property
    def running(self) -> int:
        """HTTP requests whose handler has not returned yet."""
        return self._running

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        if self._running == 0:
            self._idle = trio.Event()
        self._running += 1
        try:
            await self._app(scope, receive, send)
        finally:
            self._running -= 1
            if self._running == 0:
                self._idle.set()

    async def drained(self) -> None:
        """Return once no HTTP request is being handled."""
        while self._running:
            await self._idle.wait()


def open_bind_warning(sock: socket.socket, settings: Settings) -> str | None:
    """The start-up WARNING for a socket bound beyond loopback with no bearer token
    (`server.api_key_env`): anyone who can reach the address may submit work that costs judge
    calls and read every result (docs/reliability.md, "Security"). None otherwise."""
    if settings.server.api_key_env:
        return None
    host = sock.getsockname()[0]
    try:
        if ipaddress.ip_address(host).is_loopback:
            return None
    except ValueError:  # not an address (a Unix socket path): not reachable from the network
        return None
    return (
        f"listening on {host} without authentication: anyone who can reach this address can "
        "submit work that costs judge calls and read every result; set server.api_key_env "
        "or bind 127.0.0.1"
    )


async def serve_app(
    app: Any,
    sock: socket.socket,
    *,
    shutdown_trigger: Callable[[], Awaitable[None]],
    grace_s: float = 5.0,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve an ASGI app on a socket from `bind_socket` until `shutdown_trigger` returns.

    Reports the bound port through `task_status` once hypercorn listens. After the trigger, new
    connections are refused and the requests being handled get up to `grace_s` seconds to
    finish; then every connection closes, idle keep-alive ones at once. Takes ownership of
    `sock` (closed on return).
    """
    try:
        config = hypercorn_config(sock, grace_s=grace_s)
        port: int = sock.getsockname()[1]
        tracker = RequestTracker(app)
        stopping = trio.Event()

        async def trigger() -> None:
            await shutdown_trigger()
            stopping.set()

        async with trio.open_nursery() as nursery:
            await nursery.start(
                partial(hypercorn.trio.serve, tracker, config, shutdown_trigger=trigger)
            )
            task_status.started(port)
            await stopping.wait()
            with trio.move_on_after(grace_s):
                await tracker.drained()
            # Every reply has been written: what is left is idle connections (and requests
            # past the grace period). Cancelling closes them without waiting for their timers.
            nursery.cancel_scope.cancel()
    finally:
        sock.close()


JUDGE_CLOSE_S: Final = 1.0
"""How long a shutdown waits for the judge client to close its connections."""

REPEAT_SIGNAL_WINDOW_S: Final = 1.0
"""A stop signal this soon after the first is the same stop delivered twice, not a second one.

A Ctrl-C in a terminal reaches the whole foreground process group, and a launcher in it (NeMo
Gym's `gym env start`) forwards its own SIGINT to every server as well: genrm-trio then gets
two SIGINTs a few milliseconds apart, and taking the second as "stop without waiting" would cut
off the waiting requests that the graceful stop answers with 503. A signal after the window
(a person pressing Ctrl-C again) still stops at once."""


def is_repeat_delivery(first_at: float, now: float) -> bool:
    """Whether a stop signal at `now` repeats the one received at `first_at` (trio clock)."""
    return now - first_at < REPEAT_SIGNAL_WINDOW_S


def exit_at_once(code: int) -> NoReturn:
    """End the process now, without unwinding (a second SIGINT/SIGTERM, docs/operations.md
    "Graceful shutdown"): nothing it waits for, a stalled store's thread included, can hold it.
    The durable state stays as consistent as after a kill (SQLite WAL); log lines written so far
    are flushed first. Exit code 128 + the signal number, as a shell reports a signal."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with suppress(Exception):
            stream.flush()
    os._exit(code)


def _sim_judge() -> Judge:
    from genrm_trio.testing import SimConfig, SimJudge

    judge: Judge = SimJudge(SimConfig())
    return judge


async def serve(
    settings: Settings,
    *,
    judge: Judge | None = None,
    sim: bool = False,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run the service until SIGINT or SIGTERM, then shut down gracefully (docs/operations.md,
    "Graceful shutdown"; D28).

    `judge`: the judge to use; None → the HTTP judge of `settings.judge` (or, with `sim`, the
    in-process simulated judge with zero latency and no faults). Reports the bound port through
    `task_status` right after `listening on http://{host}:{port}` was printed to stdout.

    Raises ConfigError (a missing secret or judge URL) or ListenError (the address) before
    listening; later start-up errors may arrive inside an ExceptionGroup. A second signal
    during the shutdown exits the process at once (`exit_at_once`), unless it comes within
    `REPEAT_SIGNAL_WINDOW_S` of the first (the same stop delivered twice). Must run in the main
    thread (signal handling).
    """
    server_secret = settings.server.api_key_env
    if server_secret:
        read_secret(server_secret, key="server.api_key_env")
    token: str | None = None
    if not sim and settings.judge.api_key_env:
        token = read_secret(settings.judge.api_key_env, key="judge.api_key_env")
    sock = bind_socket(settings.host, settings.port)
    try:
        if settings.state_path is not None:
            # a second server on the file stops here, before its start-up report and probes
            check_not_in_use(os.fspath(settings.state_path))
        for line in settings.startup_warnings():
            log.warning("%s", line)
        exposed = open_bind_warning(sock, settings)
        if exposed is not None:
            log.warning("%s", exposed)
        settings = with_admission(settings, check_fd_headroom(settings))
        if sim:
            log.warning("%s", SIM_WARNING)
        await _serve_on(settings, sock, judge=judge, sim=sim, token=token, task_status=task_status)
    finally:
        sock.close()


async def _serve_on(
    settings: Settings,
    sock: socket.socket,
    *,
    judge: Judge | None,
    sim: bool,
    token: str | None,
    task_status: trio.TaskStatus[int],
) -> None:
    # Imported here so that `bind_socket` and `serve_app` (used by sim-judge) stay light.
    from genrm_trio.app.compose import durable_engine
    from genrm_trio.http.app import create_app
    from genrm_trio.judge.factory import make_judge
    from genrm_trio.judge.probe import log_proxy_use, probe_judge, with_context_window

    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        stop = trio.Event()
        listening = False
        run_scope = trio.CancelScope()

        async def watch_signals() -> None:
            first_at: float | None = None
            async for signum in signals:
                name = signal.Signals(signum).name
                now = trio.current_time()
                if first_at is None:
                    first_at = now
                    log.info("received %s: shutting down", name)
                    stop.set()
                    if not listening:
                        run_scope.cancel()
                elif is_repeat_delivery(first_at, now):
                    log.info(
                        "received %s again %.0f ms later: already shutting down (the same stop, "
                        "delivered twice)",
                        name,
                        (now - first_at) * 1000,
                    )
                else:
                    log.warning("received %s again: exiting at once", name)
                    exit_at_once(128 + signum)

        async def run() -> None:
            nonlocal listening
            the_judge = judge
            # with judge.context_tokens learned from the probe (`max_model_len`) when unset
            used = settings
            try:
                down: tuple[str, ...] = ()
                if not sim:
                    log_proxy_use()
                    report = await probe_judge(settings, token)
                    down = report.unreachable
                    used = with_context_window(settings, report.windows)
                if the_judge is None and sim:
                    the_judge = _sim_judge()
                elif the_judge is None:
                    fleet = make_judge(used)
                    if down:  # an outage from the first second: /readyz 503, probes running
                        fleet.down_from_start(down, "its start-up probe could not connect")
                    the_judge = fleet
                # the durable store (state_path) loads before the socket listens
                async with durable_engine(used, the_judge) as engine:
                    app = create_app(engine, used)
                    stop_accepting = trio.Event()
                    async with trio.open_nursery() as nursery:
                        port = await nursery.start(
                            partial(
                                serve_app,
                                app,
                                sock,
                                shutdown_trigger=stop_accepting.wait,
                                grace_s=settings.server.shutdown_grace_s,
                            )
                        )
                        print(f"listening on http://{url_host(settings.host)}:{port}", flush=True)
                        listening = True
                        task_status.started(port)
                        await stop.wait()
                        # D28: stop accepting, fail the active cohorts (their waiters answer
                        # 503), and let hypercorn deliver those replies within the grace period.
                        stop_accepting.set()
                        await engine.aclose()
            finally:
                if judge is None and the_judge is not None:
                    # bounded: closing drops idle judge connections; a TLS close to a judge
                    # that stopped reading must not hold the shutdown
                    deadline = trio.current_time() + JUDGE_CLOSE_S
                    with trio.CancelScope(shield=True, deadline=deadline):
                        await the_judge.aclose()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch_signals)
            with run_scope:
                await run()
            nursery.cancel_scope.cancel()
