"""A scripted HTTP/1.1 judge on real sockets (127.0.0.1, the real clock), a real judge client
for it, and the judge call and reply the judge tests send: shared by tests/test_judge_http.py
and tests/test_judge_interop.py."""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import trio

from genrm_trio.config import Settings, settings_from_mapping
from genrm_trio.judge.base import JudgeCall
from genrm_trio.judge.client import HttpJudge, make_http_judge
from genrm_trio.testing.network import read_request, response_bytes

HISTORY = [{"role": "system", "content": "Be fair."}, {"role": "user", "content": "What is 2+2?"}]
CALL = JudgeCall(HISTORY, "four", "4", None)
VERDICT_TEXT = '{"score_1": 4, "score_2": 2, "ranking": 2}'


def settings(**judge: Any) -> Settings:
    """Settings whose `judge` section is `judge` over a base URL of judge.test:8000."""
    data: dict[str, Any] = {"judge": {"base_url": "http://judge.test:8000/v1", **judge}}
    return settings_from_mapping(data)


def responses_reply(
    text: str | None = VERDICT_TEXT, *, status: str | None = "completed", **extra: Any
) -> dict[str, Any]:
    """A Responses API reply whose one message says `text`."""
    reply: dict[str, Any] = {
        "status": status,
        "output": [{"type": "message", "content": [{"type": "output_text", "text": text}]}],
    }
    reply.update(extra)
    return reply


# --- the server ---------------------------------------------------------------------------------


async def answer_requests(
    stream: trio.abc.Stream, answer: Callable[[bytes], Awaitable[bool]]
) -> None:
    """Hands each request read on `stream` (its raw bytes), one after another, to `answer`,
    which answers it and returns whether to keep the connection open; until the client closes."""
    buffer = b""
    while True:
        got = await read_request(stream, buffer)
        if got is None:
            return
        request, buffer = got[0].raw, got[1]
        if not await answer(request):
            return


Script = Callable[[int, bytes, trio.SocketStream], Awaitable[bool]]
"""How a TinyServer answers: `script(n, request, stream)` answers request n and returns whether
to keep the connection open."""


class TinyServer:
    """A scripted HTTP/1.1 server on 127.0.0.1: `script(n, request, stream)` answers request n
    (0-based, across connections) and returns whether to keep the connection open."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.requests: list[bytes] = []
        self.connections = 0
        self.open = 0
        self.got_request = trio.Event()
        self._new_request = trio.Event()
        self.all_closed = trio.Event()
        self.port = 0

    async def handle(self, stream: trio.SocketStream) -> None:
        self.connections += 1
        self.open += 1
        self.all_closed = trio.Event()

        async def answer(request: bytes) -> bool:
            n = len(self.requests)
            self.requests.append(request)
            self.got_request.set()
            self._new_request.set()
            self._new_request = trio.Event()
            return await self.script(n, request, stream)

        try:
            await answer_requests(stream, answer)
        except trio.BrokenResourceError:
            return
        finally:
            self.open -= 1
            if self.open == 0:
                self.all_closed.set()
            await stream.aclose()

    async def wait_requests(self, count: int) -> None:
        while len(self.requests) < count:
            await self._new_request.wait()

    async def start(self, nursery: trio.Nursery) -> None:
        listeners = await nursery.start(trio.serve_tcp, self.handle, 0)
        self.port = listeners[0].socket.getsockname()[1]


async def serve_tls(
    stream: trio.SocketStream, context: ssl.SSLContext, reply: Callable[[bytes], bytes]
) -> None:
    """A keep-alive judge over TLS on one connection: each request answered 200 with
    `reply(request)`, until the client closes."""
    tls = trio.SSLStream(stream, context, server_side=True)

    async def answer(request: bytes) -> bool:
        await tls.send_all(response_bytes(200, reply(request)))
        return True

    try:
        await answer_requests(tls, answer)
    except trio.BrokenResourceError:
        return
    finally:
        await trio.aclose_forcefully(tls)


def real_judge(port: int, **judge: Any) -> HttpJudge:
    """A real judge (`judge.*` keys as in `settings`) of the server at 127.0.0.1:`port`."""
    return make_http_judge(settings(base_url=f"http://127.0.0.1:{port}/v1", **judge))


@asynccontextmanager
async def tiny_server(script: Script) -> AsyncIterator[TinyServer]:
    """A started TinyServer, for tests that make their own client or judge: its nursery is
    cancelled on the way out, even when the body fails, so no listener outlives the test."""
    server = TinyServer(script)
    async with trio.open_nursery() as nursery:
        await server.start(nursery)
        try:
            yield server
        finally:
            nursery.cancel_scope.cancel()


@asynccontextmanager
async def scripted_judge(
    script: Script, **judge_settings: Any
) -> AsyncIterator[tuple[TinyServer, HttpJudge]]:
    """A real judge (`judge_settings` as in `real_judge`) over a started TinyServer. On the way
    out, even when the body fails, the judge is closed and then the server stopped. aclose is
    idempotent, so a test that checks what closing does (or bounds it) closes the judge itself."""
    async with tiny_server(script) as server:
        judge = real_judge(server.port, **judge_settings)
        try:
            yield server, judge
        finally:
            await judge.aclose()
