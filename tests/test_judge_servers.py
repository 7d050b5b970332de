"""The judge client and the fleet against real third-party servers on 127.0.0.1: uvicorn (what
vLLM serves with) with its h11 and httptools parsers, and hypercorn. The keep-alive expiry race
(a server closing an idle connection as the client reuses it) is made deterministic by waiting
until the server's close has arrived and then letting the client miss it, as it does when the
close lands just after its check. Every test is bounded by `fail_after`."""

from __future__ import annotations

import json
import signal
import socket
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import hypercorn.trio
import pytest
import trio
import uvicorn
from hypercorn.config import Config as HypercornConfig
from hypercorn.config import Sockets
from judges import verdict_text

import genrm_trio.judge.pool as pool_module
from genrm_trio.config import Settings, settings_from_mapping
from genrm_trio.domain.model import Scored, VerifyInput
from genrm_trio.engine.engine import open_engine
from genrm_trio.judge.base import JudgeCall, JudgeError, ReplyStatus
from genrm_trio.judge.client import HttpJudge, make_http_judge
from genrm_trio.judge.factory import make_judge
from genrm_trio.judge.fleet import JudgeFleet

pytestmark = pytest.mark.slow

CALL = JudgeCall([{"role": "user", "content": "q"}], "a1", "a2", None)
Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


class JudgeApp:
    """A judge as an ASGI app (no async library of its own, so it runs on asyncio and trio):
    chat completions with a verdict, `GET /v1/models`, or 500 to every call when `sick`."""

    def __init__(self) -> None:
        self.sick = False
        self.calls = 0  # POSTs received

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                kind = message["type"].rsplit(".", 1)[-1]
                await send({"type": f"lifespan.{kind}.complete"})
                if kind == "shutdown":
                    return
        if scope["type"] != "http":
            return
        more = True
        while more:
            message = await receive()
            more = bool(message.get("more_body"))
        status, body = 200, b'{"object": "list", "data": []}'
        if scope["method"] == "POST":
            self.calls += 1
            if self.sick:
                status, body = 500, b"<html>\r\n<body>Internal Server Error</body>\r\n</html>"
            else:
                text = verdict_text(4, 2, 2)
                reply = {
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": text},
                            "finish_reason": "stop",
                        }
                    ],
                    "usage": {"prompt_tokens": 10, "completion_tokens": 5},
                }
                body = json.dumps(reply).encode()
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(b"content-type", b"application/json")],
            }
        )
        await send({"type": "http.response.body", "body": body})


def listening_socket(port: int = 0) -> socket.socket:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(128)
    return sock


class Served:
    """One real server for `app` on 127.0.0.1, started and stopped at will: uvicorn (asyncio)
    in a thread of its own, or hypercorn's trio worker in this process."""

    def __init__(self, kind: str, app: JudgeApp, *, keep_alive_s: int = 5) -> None:
        self.kind = kind
        self.app = app
        self.keep_alive_s = keep_alive_s
        self.port = 0
        self._stop: Callable[[], Awaitable[None]] | None = None

    async def start(self, nursery: trio.Nursery) -> int:
        sock = listening_socket(self.port)
        self.port = sock.getsockname()[1]
        if self.kind == "hypercorn":
            await self._start_hypercorn(nursery, sock)
        else:
            await self._start_uvicorn(sock)
        return self.port

    async def _start_uvicorn(self, sock: socket.socket) -> None:
        config = uvicorn.Config(
            self.app,
            http=self.kind.split("-")[1],
            timeout_keep_alive=self.keep_alive_s,
            lifespan="off",
            log_level="warning",
            access_log=False,
        )
        server = uvicorn.Server(config)
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
        thread.start()
        with trio.fail_after(10):
            while not server.started:  # noqa: ASYNC110 - a flag of uvicorn's thread
                await trio.sleep(0.01)

        async def stop() -> None:
            server.should_exit = True
            await trio.to_thread.run_sync(thread.join, 10.0)
            sock.close()

        self._stop = stop

    async def _start_hypercorn(self, nursery: trio.Nursery, sock: socket.socket) -> None:
        sock.setblocking(False)
        port = self.port

        class Prebound(HypercornConfig):
            def create_sockets(self) -> Sockets:
                return Sockets(secure_sockets=[], insecure_sockets=[sock], quic_sockets=[])

        config = Prebound()
        config.keep_alive_timeout = self.keep_alive_s
        config.accesslog = None
        config.bind = [f"127.0.0.1:{port}"]
        shutdown = trio.Event()
        done = trio.Event()

        async def run(task_status: trio.TaskStatus[None]) -> None:
            try:
                await hypercorn.trio.serve(
                    self.app,  # type: ignore[arg-type]
                    config,
                    shutdown_trigger=shutdown.wait,
                    task_status=task_status,
                )
            finally:
                sock.close()
                done.set()

        await nursery.start(run)

        async def stop() -> None:
            shutdown.set()
            await done.wait()

        self._stop = stop

    async def stop(self) -> None:
        if self._stop is not None:
            stop, self._stop = self._stop, None
            with trio.CancelScope(shield=True), trio.fail_after(15):
                await stop()


@asynccontextmanager
async def serving(kind: str, app: JudgeApp, *, keep_alive_s: int = 5) -> AsyncIterator[int]:
    async with trio.open_nursery() as nursery:
        served = Served(kind, app, keep_alive_s=keep_alive_s)
        try:
            yield await served.start(nursery)
        finally:
            await served.stop()


SERVERS = ["uvicorn-h11", "uvicorn-httptools", "hypercorn"]
STALL_S = 1.0


def chat_settings(base_url: str | list[str], **extra: Any) -> Settings:
    judge = {"base_url": base_url, "api": "chat_completions", **extra.pop("judge", {})}
    return settings_from_mapping({"judge": judge, **extra})


def pool_of(judge: HttpJudge) -> pool_module.KeepAlivePool:
    assert judge._pool is not None
    return judge._pool


# --- the pool -----------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", SERVERS)
async def test_pool_keeps_connections_alive_against_real_servers(kind: str) -> None:
    app = JudgeApp()
    async with serving(kind, app) as port:
        judge = make_http_judge(chat_settings(f"http://127.0.0.1:{port}/v1"))
        with trio.fail_after(20):
            for _ in range(5):
                assert (await judge.attempt(CALL)).status is ReplyStatus.COMPLETED
            assert judge.open_connections == 1
            async with trio.open_nursery() as nursery:
                for _ in range(16):
                    nursery.start_soon(judge.attempt, CALL)
        assert app.calls == 21
        assert 1 <= judge.open_connections <= 16
        assert pool_of(judge).stale_retries == 0
        await judge.aclose()


async def _call_then_wait_for_the_servers_idle_close(
    judge: HttpJudge, pool: pool_module.KeepAlivePool
) -> None:
    """One call, then wait until the server's keep-alive close of the idle connection it left
    has arrived (a socket state: nothing to wait on but polling)."""
    await judge.attempt(CALL)
    ((_, idle),) = list(pool._idle)
    while not pool_module.is_readable(idle.stream):  # noqa: ASYNC110
        await trio.sleep(0.05)


@pytest.mark.parametrize("kind", SERVERS)
async def test_keepalive_expiry_race_resends_on_a_new_connection(
    kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server's keep-alive (1 s) is shorter than the client's (30 s): the server closes the
    idle connection; the client reuses it as the close arrives. No attempt is lost."""
    app = JudgeApp()
    async with serving(kind, app, keep_alive_s=1) as port:
        judge = make_http_judge(
            chat_settings(f"http://127.0.0.1:{port}/v1", judge={"keepalive_expiry_s": 30.0})
        )
        pool = pool_of(judge)
        with trio.fail_after(20):
            await _call_then_wait_for_the_servers_idle_close(judge, pool)
            # The client checks an idle connection before it reuses it; the race is a close that
            # lands just after that check, which is what this makes happen every time.
            monkeypatch.setattr(pool_module, "is_readable", lambda stream: False)
            reply = await judge.attempt(CALL)
        assert reply.status is ReplyStatus.COMPLETED
        assert pool.stale_retries == 1
        assert app.calls == 2
        await judge.aclose()


@pytest.mark.parametrize("kind", ["uvicorn-h11", "hypercorn"])
async def test_an_idle_connection_the_server_closed_is_replaced_before_use(kind: str) -> None:
    app = JudgeApp()
    async with serving(kind, app, keep_alive_s=1) as port:
        judge = make_http_judge(
            chat_settings(f"http://127.0.0.1:{port}/v1", judge={"keepalive_expiry_s": 30.0})
        )
        pool = pool_of(judge)
        with trio.fail_after(20):
            await _call_then_wait_for_the_servers_idle_close(judge, pool)
            await judge.attempt(CALL)
        assert (app.calls, pool.stale_retries, judge.open_connections) == (2, 0, 1)
        await judge.aclose()


# --- the fleet ----------------------------------------------------------------------------------


def members(g: int, n: int) -> list[VerifyInput]:
    from judges import member

    return [member(i, group=f"g{g}") for i in range(n)]


async def test_fleet_of_real_servers_one_killed_one_500_one_back_masks_nothing() -> None:
    """Three replicas (uvicorn/h11, uvicorn/httptools, hypercorn): the second answers 500 to
    everything; the first is stopped (its port refuses connections), then started again on
    the same port. No rollout is masked, and every count the fleet keeps matches the servers'."""
    apps = [JudgeApp(), JudgeApp(), JudgeApp()]
    apps[1].sick = True
    n = 4
    replies: list[Any] = []
    async with trio.open_nursery() as nursery:
        servers = [Served(kind, app) for kind, app in zip(SERVERS, apps, strict=True)]
        urls = [f"http://127.0.0.1:{await s.start(nursery)}/v1" for s in servers]
        config = chat_settings(
            urls,
            num_rollouts_per_prompt=n,
            genrm_parse_retries=3,
            genrm_parse_retry_sleep_s=0.05,
            judge_request_timeout_s=10.0,
            cohort_evaluation_timeout_s=30.0,
            # no answer probe: the servers' call counts are held to the fleet's, which counts
            # no probe (docs/operations.md)
            judge={"eject_backoff_s": 0.5, "probe": False},
        )
        judge = make_judge(config)
        assert isinstance(judge, JudgeFleet)
        group = 0

        def stats() -> dict[str, Any]:
            return {s.url: s for s in judge.replica_stats()}

        try:
            with trio.fail_after(60):
                async with open_engine(config, judge) as engine:

                    async def groups(count: int) -> None:
                        nonlocal group
                        for _ in range(count):
                            async with trio.open_nursery() as members_nursery:
                                for item in members(group, n):
                                    members_nursery.start_soon(_verify, engine, item, replies)
                            group += 1

                    await groups(3)
                    assert stats()[urls[1]].ejected  # 500 to everything: out after 3 attempts
                    await servers[0].stop()  # the first replica's port refuses from now on
                    await groups(3)
                    assert stats()[urls[0]].ejected
                    await servers[0].start(nursery)  # back, on the same port
                    while stats()[urls[0]].ejected:  # its trial call brings it back
                        await groups(1)
                    before = apps[0].calls
                    await groups(3)
                    assert apps[0].calls > before  # in service again, taking calls
        finally:
            await judge.aclose()
            for served in servers:
                await served.stop()
    assert len(replies) == group * n
    assert all(isinstance(r, Scored) for r in replies), [
        r for r in replies if not isinstance(r, Scored)
    ]
    final = {s.url: s for s in judge.replica_stats()}
    # The 500 replica saw every attempt it was given; the healthy one answered all of its;
    # the stopped one answered all but those refused while it was down.
    assert final[urls[1]].calls == final[urls[1]].failures == apps[1].calls
    assert (final[urls[2]].calls, final[urls[2]].failures) == (apps[2].calls, 0)
    assert final[urls[0]].calls - final[urls[0]].failures == apps[0].calls
    # out at its first refused connection (the call never reached it: no attempt spent, so
    # neither a call nor a failure of the replica: issue 36 item 9)
    assert (final[urls[0]].calls, final[urls[0]].failures) == (apps[0].calls, 0)
    assert final[urls[0]].ejections == 1


async def _verify(engine: Any, item: VerifyInput, replies: list[Any]) -> None:
    replies.append(await engine.verify(item))


async def test_a_sigstopped_replica_stalls_out_and_its_comparisons_are_answered_elsewhere(
    tmp_path: Path,
) -> None:
    """Two real `genrm-trio sim-judge` processes (50 ms a call) under steady load; one is
    SIGSTOPped: its calls in flight never answer, while the other's do. Within
    `judge.replica_stall_s` (1 s) of its last answer it is out, its calls are retried on the
    other replica, and no comparison fails. Real clock, 127.0.0.1; the stopped process is
    continued and killed whatever happens."""
    from procs import start_judge

    from genrm_trio.judge.attempts import Comparator
    from genrm_trio.metrics import Metrics

    judges = [
        await trio.to_thread.run_sync(
            partial(start_judge, tmp_path, "--latency-ms", "50", name=f"judge{i}")
        )
        for i in range(2)
    ]
    stopped = False
    try:
        config = Settings.model_validate(
            {
                "judge_request_timeout_s": 30.0,
                "genrm_parse_retries": 3,
                "genrm_parse_retry_sleep_s": 0.05,
                "judge": {
                    "api": "genrm_model",
                    "base_url": [f"{judge.url}/v1" for judge in judges],
                    "replica_stall_s": STALL_S,
                    "eject_backoff_s": 60.0,  # no trial while the test runs
                },
            }
        )
        fleet = make_judge(config)
        assert isinstance(fleet, JudgeFleet)
        metrics = Metrics()
        comparator = Comparator(fleet, config, metrics)
        done, failed = 0, []
        running = True
        waiting: list[tuple[int, trio.Event]] = []

        async def until(count: int) -> None:
            """Wait until `count` comparisons are done."""
            event = trio.Event()
            waiting.append((count, event))
            await event.wait()

        async def worker(number: int) -> None:
            nonlocal done
            while running:
                call = JudgeCall([{"role": "user", "content": "q"}], f"a{number}-{done}", "b", None)
                try:
                    await comparator.compare(call, pair=(0, 1), judge_pass=0)
                except JudgeError as error:
                    failed.append(error.message)
                done += 1
                for count, event in waiting:
                    if done >= count:
                        event.set()

        try:
            with trio.fail_after(30):
                async with trio.open_nursery() as nursery:
                    for number in range(8):
                        nursery.start_soon(worker, number)
                    await until(40)  # warm: both replicas answering
                    judges[0].signal(signal.SIGSTOP)
                    stopped = True
                    stopped_at = trio.current_time()
                    while not fleet.replica_stats()[0].stalls:  # noqa: ASYNC110 - counters
                        await trio.sleep(0.02)
                    stalled_after = trio.current_time() - stopped_at
                    await until(done + 40)  # and the load goes on, on the other one
                    running = False
        finally:
            await fleet.aclose()
        first, second = fleet.replica_stats()
        print(f"replica stalled out {stalled_after:.2f}s after its SIGSTOP")  # pytest -s
        assert stalled_after <= STALL_S + 1.5, stalled_after  # ~1 s, scheduling aside
        assert failed == []  # every comparison answered, those on the stopped replica elsewhere
        assert (first.stalls, first.ejected, first.in_flight) == (1, True, 0)
        assert (second.stalls, second.ejected, second.failures) == (0, False, 0)
        stall_retries = metrics.registry.get_sample_value(
            "genrm_trio_judge_retries_total", {"cause": "stall"}
        )
        assert stall_retries is not None and stall_retries >= 1
        assert first.failures == stall_retries  # each cancelled call: a failure, retried
    finally:
        for judge in judges:
            if stopped:
                judge.signal(signal.SIGCONT)
            await trio.to_thread.run_sync(judge.close)
