"""The judge client against what real servers do: a keep-alive close crossing a request on a
reused connection, an answer sent (and the connection closed) before the request body is in,
compressed bodies nobody asked for, oversized replies, certificates, and one-line error logs.
Scripted servers on 127.0.0.1 speak exact bytes; every exchange is bounded by `fail_after`."""

from __future__ import annotations

import gzip
import json
import logging
import socket
import struct
import zlib
from typing import Any

import httpx
import pytest
import trio
import trio.testing
from test_judge_http import (
    CALL,
    TinyServer,
    real_judge,
    response_bytes,
    responses_reply,
)

from genrm_trio.judge.base import (
    JudgeCall,
    JudgeHTTPError,
    JudgeTransportError,
    ReplyStatus,
    one_line,
)
from genrm_trio.judge.http import KeepAlivePool, StaleConnectionError
from genrm_trio.model import Scored

BODY = json.dumps(responses_reply()).encode()


def _reset(stream: trio.SocketStream) -> None:
    """Make the coming close a reset (RST), as a server does that drops a connection hard."""
    stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


# --- a reused connection the server closed as the request went out ------------------------------


@pytest.mark.parametrize("how", ["close", "reset"])
async def test_reused_connection_closed_before_any_reply_byte_is_sent_again(how: str) -> None:
    async def script(n: int, request: bytes, stream: trio.SocketStream) -> bool:
        if n == 1:  # the second request, on the reused connection: closed unanswered
            if how == "reset":
                _reset(stream)
            return False
        await stream.send_all(response_bytes(200, BODY))
        return True

    server = TinyServer(script)
    async with trio.open_nursery() as nursery:
        await server.start(nursery)
        judge = real_judge(server.port)
        with trio.fail_after(5):
            assert (await judge.attempt(CALL)).status is ReplyStatus.COMPLETED
            # Succeeds: the request went out once more on a new connection, inside the attempt.
            assert (await judge.attempt(CALL)).status is ReplyStatus.COMPLETED
        assert (len(server.requests), server.connections) == (3, 2)
        assert server.requests[1] == server.requests[2]
        assert judge._pool is not None and judge._pool.stale_retries == 1
        await judge.aclose()
        nursery.cancel_scope.cancel()


async def test_pool_resends_a_bytes_request_itself_and_a_list_request_asks_the_caller() -> None:
    async def script(n: int, request: bytes, stream: trio.SocketStream) -> bool:
        if n in (1, 3):
            return False
        await stream.send_all(response_bytes(200, b"{}"))
        return True

    server = TinyServer(script)
    request = b"POST /v1/responses HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\n{}"
    async with trio.open_nursery() as nursery:
        await server.start(nursery)
        pool = KeepAlivePool(httpx.URL(f"http://127.0.0.1:{server.port}"))
        with trio.fail_after(5):
            assert (await pool.exchange(request))[0] == 200
            assert (await pool.exchange(request))[0] == 200  # n=1 closed, n=2 answered
            with pytest.raises(StaleConnectionError):
                await pool.exchange([request])  # n=3 closed: the bytes are gone
            assert (await pool.exchange([request], fresh=True))[0] == 200
        assert (len(server.requests), server.connections, pool.stale_retries) == (5, 3, 2)
        await pool.aclose()
        nursery.cancel_scope.cancel()


async def test_a_fresh_connection_closed_unanswered_is_one_failed_attempt() -> None:
    async def script(n: int, request: bytes, stream: trio.SocketStream) -> bool:
        return False

    server = TinyServer(script)
    async with trio.open_nursery() as nursery:
        await server.start(nursery)
        judge = real_judge(server.port)
        with trio.fail_after(5), pytest.raises(JudgeTransportError) as info:
            await judge.attempt(CALL)
        assert info.value.type_name == "RemoteProtocolError"
        assert info.value.retryable
        assert len(server.requests) == 1  # not sent again: nothing says it was not processed
        await judge.aclose()
        nursery.cancel_scope.cancel()


async def test_a_reused_connection_closed_mid_reply_is_not_sent_again() -> None:
    async def script(n: int, request: bytes, stream: trio.SocketStream) -> bool:
        if n == 1:
            await stream.send_all(response_bytes(200, BODY)[:20])
            return False
        await stream.send_all(response_bytes(200, BODY))
        return True

    server = TinyServer(script)
    async with trio.open_nursery() as nursery:
        await server.start(nursery)
        judge = real_judge(server.port)
        with trio.fail_after(5):
            await judge.attempt(CALL)
            with pytest.raises(JudgeTransportError) as info:
                await judge.attempt(CALL)
        assert info.value.type_name == "RemoteProtocolError"
        assert len(server.requests) == 2
        await judge.aclose()
        nursery.cancel_scope.cancel()


# --- an answer before the request body is in ----------------------------------------------------


async def test_413_sent_while_the_body_is_still_going_out_is_read_and_reported() -> None:
    heads: list[bytes] = []

    async def handle(stream: trio.SocketStream) -> None:
        buffer = b""
        while b"\r\n\r\n" not in buffer:
            buffer += await stream.receive_some()
        heads.append(buffer.split(b"\r\n\r\n")[0])
        await stream.send_all(
            response_bytes(413, b"<html>\r\n<h1>413 Request Entity Too Large</h1>\r\n</html>")
        )
        await trio.aclose_forcefully(stream)  # unread body: the kernel resets the connection

    big = JudgeCall(CALL.history, "x" * (16 * 1024 * 1024), "y", None)
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(trio.serve_tcp, handle, 0)
        judge = real_judge(listeners[0].socket.getsockname()[1])
        with trio.fail_after(10), pytest.raises(JudgeHTTPError) as info:
            await judge.attempt(big)
        assert info.value.status == 413
        assert not info.value.retryable  # a 4xx: not a transport error, not retried
        assert b"413 Request Entity Too Large" in info.value.body
        assert len(heads) == 1
        await judge.aclose()
        nursery.cancel_scope.cancel()


# --- compression nobody asked for ---------------------------------------------------------------


def _gzip(data: bytes) -> bytes:
    return gzip.compress(data)


def _zlib(data: bytes) -> bytes:
    return zlib.compress(data)


def _raw_deflate(data: bytes) -> bytes:
    compressor = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    return compressor.compress(data) + compressor.flush()


@pytest.mark.parametrize(
    ("coding", "encode"),
    [("gzip", _gzip), ("x-gzip", _gzip), ("deflate", _zlib), ("deflate", _raw_deflate)],
)
async def test_compressed_bodies_are_decoded(coding: str, encode: Any) -> None:
    payload = encode(BODY)
    error_page = encode(b"<html>\r\nbad gateway\r\n</html>")

    async def script(n: int, request: bytes, stream: trio.SocketStream) -> bool:
        if n == 0:
            await stream.send_all(response_bytes(200, payload, f"content-encoding: {coding}"))
        else:
            await stream.send_all(response_bytes(502, error_page, f"content-encoding: {coding}"))
        return True

    server = TinyServer(script)
    async with trio.open_nursery() as nursery:
        await server.start(nursery)
        judge = real_judge(server.port)
        with trio.fail_after(5):
            assert (await judge.attempt(CALL)).status is ReplyStatus.COMPLETED
            with pytest.raises(JudgeHTTPError) as info:
                await judge.attempt(CALL)
        assert info.value.body == b"<html>\r\nbad gateway\r\n</html>"
        assert b"\r\naccept-encoding: identity\r\n" in server.requests[0]
        assert server.connections == 1  # the decoded reply left the connection reusable
        await judge.aclose()
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize(
    ("headers", "payload", "message"),
    [
        (["content-encoding: br"], BODY, "unsupported Content-Encoding 'br'"),
        (["content-encoding: gzip"], b"not gzip at all", "gzip body does not decode"),
    ],
)
async def test_undecodable_bodies_are_one_clear_non_retryable_error(
    headers: list[str], payload: bytes, message: str
) -> None:
    async def script(n: int, request: bytes, stream: trio.SocketStream) -> bool:
        await stream.send_all(response_bytes(200, payload, *headers))
        return True

    server = TinyServer(script)
    async with trio.open_nursery() as nursery:
        await server.start(nursery)
        judge = real_judge(server.port)
        with trio.fail_after(5), pytest.raises(JudgeTransportError) as info:
            await judge.attempt(CALL)
        assert info.value.type_name == "DecodingError"
        assert message in str(info.value)
        assert not info.value.retryable
        await judge.aclose()
        nursery.cancel_scope.cancel()


# --- the response size cap ----------------------------------------------------------------------

_CAP = 4096


def _framed(kind: str, body: bytes) -> tuple[bytes, bool]:
    if kind == "length":
        return response_bytes(200, body), True
    if kind == "chunked":
        parts = [body[i : i + 1000] for i in range(0, len(body), 1000)]
        chunks = b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in parts)
        head = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
        return head + chunks + b"0\r\n\r\n", True
    if kind == "close":
        return b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\n" + body, False
    return response_bytes(200, gzip.compress(body), "content-encoding: gzip"), True


@pytest.mark.parametrize("kind", ["length", "chunked", "close", "gzip"])
async def test_a_reply_over_max_response_bytes_ends_the_attempt(kind: str) -> None:
    big = json.dumps(responses_reply("x" * (2 * _CAP))).encode()
    raw, keep = _framed(kind, big)

    async def script(n: int, request: bytes, stream: trio.SocketStream) -> bool:
        await stream.send_all(raw)
        return keep

    server = TinyServer(script)
    async with trio.open_nursery() as nursery:
        await server.start(nursery)
        judge = real_judge(server.port, max_response_bytes=_CAP)
        with trio.fail_after(5), pytest.raises(JudgeTransportError) as info:
            await judge.attempt(CALL)
        assert info.value.type_name == "ResponseTooLarge"
        assert not info.value.retryable
        assert "judge response exceeds judge.max_response_bytes (4096 bytes)" in str(info.value)
        # A connection left mid-body is closed; a compressed body was read whole first.
        assert judge.open_connections == (1 if kind == "gzip" else 0)
        # Just under the cap is fine.
        small = json.dumps(responses_reply("x" * (_CAP // 2))).encode()
        raw, keep = _framed(kind, small)
        with trio.fail_after(5):
            assert (await judge.attempt(CALL)).status is ReplyStatus.COMPLETED
        await judge.aclose()
        nursery.cancel_scope.cancel()


# --- error bodies in log lines ------------------------------------------------------------------


def test_one_line_collapses_whitespace_and_bounds_the_text() -> None:
    page = "<html>\r\n  <head><title>502</title></head>\r\n\t<body>bad</body>\r\n</html>\r\n"
    assert one_line(page) == "<html> <head><title>502</title></head> <body>bad</body> </html>"
    assert one_line("x" * 50, 10) == "x" * 9 + "…"
    assert len(one_line("a b " * 1000, 100)) == 100


async def test_html_error_bodies_log_as_one_bounded_line(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    from judges import ScriptedJudge, gather, http_error, member, running, settings

    page = b"<html>\r\n<body>\r\n" + b"upstream sick\r\n" * 200 + b"</body>\r\n</html>"
    judge = ScriptedJudge(script=lambda r1, r2, n: http_error(502, page))
    caplog.set_level(logging.DEBUG, logger="genrm_trio")
    async with running(settings(genrm_parse_retries=1), judge) as engine:
        replies = await gather(engine, [member(0), member(1)])
    assert not [r for r in replies if isinstance(r, Scored)]
    lines = [r.getMessage() for r in caplog.records if "upstream sick" in r.getMessage()]
    assert len(lines) >= 2  # the retry (debug) and the dropped comparison (warning)
    for line in lines:
        assert "\r" not in line and "\n" not in line
        assert len(line) <= 2100
