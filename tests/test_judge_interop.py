"""The judge client against what real servers do: a keep-alive close crossing a request on a
reused connection, an answer sent (and the connection closed) before the request body is in,
compressed bodies nobody asked for, oversized replies, certificates, and one-line error logs.
Scripted servers on 127.0.0.1 speak exact bytes; every exchange is bounded by `fail_after`."""

from __future__ import annotations

import json
import socket
import struct

import httpx
import pytest
import trio
from test_judge_http import (
    CALL,
    TinyServer,
    real_judge,
    response_bytes,
    responses_reply,
)

from genrm_trio.judge.base import JudgeCall, JudgeHTTPError, JudgeTransportError, ReplyStatus
from genrm_trio.judge.http import KeepAlivePool, StaleConnectionError

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
