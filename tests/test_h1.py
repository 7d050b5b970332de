"""The simulated judge's minimal HTTP/1.1 server (genrm_trio.testing.server), on real sockets."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
import trio

from genrm_trio.testing.server import serve_h1

pytestmark = pytest.mark.slow
LIMIT_S = 10


class EchoApp:
    """Echoes method, path, query and body; records scopes and what receive() said after."""

    def __init__(self) -> None:
        self.scopes: list[dict[str, Any]] = []
        self.after_body: list[str] = []
        self.wait_for_disconnect = False

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.scopes.append(scope)
        message = await receive()
        body = message["body"]
        if scope["path"] == "/boom":
            raise RuntimeError("boom")
        if scope["path"] == "/half":
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [(b"content-length", b"10")],
                }
            )
            await send({"type": "http.response.body", "body": b"12345", "more_body": True})
            raise RuntimeError("cut short")
        if scope["path"] == "/stream":  # no content-length: the body ends with the connection
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"ab", "more_body": True})
            await send({"type": "http.response.body", "body": b"cd"})
            return
        if scope["path"] == "/wait":
            self.after_body.append((await receive())["type"])
            return
        reply = b"%s %s %s %s" % (
            scope["method"].encode(),
            scope["raw_path"],
            scope["query_string"],
            body,
        )
        await send(
            {
                "type": "http.response.start",
                "status": 201,
                "headers": [(b"content-type", b"text/plain")],
            }
        )
        await send({"type": "http.response.body", "body": reply})


@asynccontextmanager
async def running(app: Any) -> AsyncIterator[int]:
    async with trio.open_nursery() as nursery:
        port = await nursery.start(serve_h1, app)
        yield port
        nursery.cancel_scope.cancel()


async def raw(port: int, data: bytes, *, read: bool = True) -> bytes:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(data)
        if not read:
            return b""
        out = b""
        while chunk := await stream.receive_some(65536):
            out += chunk
        return out


async def test_requests_share_a_keep_alive_connection() -> None:
    app = EchoApp()
    with trio.fail_after(LIMIT_S):
        async with running(app) as port, httpx.AsyncClient() as http:
            first = await http.post(f"http://127.0.0.1:{port}/a?x=1", content=b"hello")
            second = await http.post(f"http://127.0.0.1:{port}/b", content=b"")
            head = await http.head(f"http://127.0.0.1:{port}/c")
    assert (first.status_code, first.content) == (201, b"POST /a x=1 hello")
    assert first.headers["content-length"] == str(len(first.content))
    assert second.content == b"POST /b  "
    assert head.status_code == 201 and head.content == b""
    assert head.headers["content-length"] == str(len(b"HEAD /c  "))
    assert len({s["client"] for s in app.scopes}) == 1  # one connection for all three
    assert app.scopes[0]["headers"][0][0] == b"host"  # lower-cased names, in order


async def test_pipelined_requests_are_answered_in_order() -> None:
    with trio.fail_after(LIMIT_S):
        async with running(EchoApp()) as port:
            out = await raw(
                port,
                b"POST /1 HTTP/1.1\r\nContent-Length: 1\r\n\r\nA"
                b"POST /2 HTTP/1.1\r\nContent-Length: 1\r\nConnection: close\r\n\r\nB",
            )
    assert out.count(b"HTTP/1.1 201 ") == 2
    assert out.index(b"POST /1  A") < out.index(b"POST /2  B")
    assert out.rstrip().endswith(b"POST /2  B") and b"connection: close" in out


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        (b"GARBAGE\r\n\r\n", 400),
        (b"POST / HTTP/1.1\r\nContent-Length: x\r\n\r\n", 400),
        (b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 411),
        (b"POST / HTTP/1.1\r\nContent-Length: 999999999999\r\n\r\n", 413),
        (b"GET / HTTP/1.1\r\nX: " + b"y" * 70_000, 431),
        (b"GET /boom HTTP/1.1\r\n\r\n", 500),
    ],
)
async def test_bad_requests_get_a_status_and_the_connection_closes(
    request_bytes: bytes, status: int
) -> None:
    with trio.fail_after(LIMIT_S):
        async with running(EchoApp()) as port:
            out = await raw(port, request_bytes)
    assert out.startswith(b"HTTP/1.1 %d " % status)
    assert b"connection: close" in out


async def test_a_response_cut_short_closes_the_connection() -> None:
    with trio.fail_after(LIMIT_S):
        async with running(EchoApp()) as port, httpx.AsyncClient() as http:
            with pytest.raises(httpx.RemoteProtocolError):
                await http.get(f"http://127.0.0.1:{port}/half")
            again = await http.post(f"http://127.0.0.1:{port}/ok", content=b"x")
    assert again.status_code == 201  # the server goes on


async def test_a_streamed_body_without_a_length_ends_with_the_connection() -> None:
    with trio.fail_after(LIMIT_S):
        async with running(EchoApp()) as port, httpx.AsyncClient() as http:
            streamed = await http.get(f"http://127.0.0.1:{port}/stream")
    assert streamed.content == b"abcd"
    assert "content-length" not in streamed.headers
    assert streamed.headers["connection"] == "close"


async def test_the_app_sees_the_client_go_away() -> None:
    app = EchoApp()
    with trio.fail_after(LIMIT_S):
        async with running(app) as port:
            await raw(port, b"POST /wait HTTP/1.1\r\nContent-Length: 0\r\n\r\n", read=False)
            while not app.after_body:  # noqa: ASYNC110 (real sockets)
                await trio.sleep(0.01)
    assert app.after_body == ["http.disconnect"]
