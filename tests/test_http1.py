"""The judge connection's HTTP/1.1 framing (genrm_trio.judge.http1) on scripted bytes: the request
it writes, and how it reads what a server sends back (llhttp), in virtual time over an in-memory
stream pair."""

from __future__ import annotations

import httpx
import pytest
import trio
import trio.testing

from genrm_trio.config import ConfigError, settings_from_mapping
from genrm_trio.judge.http1 import (
    INCOMPLETE,
    MAX_HEAD_BYTES,
    Http1Connection,
    ReplyBudget,
    ResponseTooLarge,
    reply_budget,
    request_bytes,
)
from genrm_trio.judge.pool import judge_pool

POST = (b"POST", b"/v1/responses", [(b"host", b"judge:8000")], b'{"a":1}')


async def exchange(
    *chunks: bytes,
    close: bool = False,
    request: tuple[bytes, bytes, list[tuple[bytes, bytes]], bytes] = POST,
    limit: int = 1 << 20,
    every_s: float = 0.0,
    budget: ReplyBudget | None = None,
) -> tuple[tuple[int, list[tuple[bytes, bytes]], bytes, bool], bytes]:
    """(the exchange's result, the bytes the server received) for a server sending `chunks`,
    `every_s` apart, and closing its side after them when `close`."""
    client, server = trio.testing.memory_stream_pair()
    connection = Http1Connection(client, limit, budget)
    sent = bytearray()

    async def serve() -> None:
        sent.extend(await server.receive_some())
        for chunk in chunks:
            await trio.sleep(every_s)
            await server.send_all(chunk)
        if close:
            await server.send_stream.aclose()

    error: Exception | None = None
    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve)
        try:
            result = await connection.exchange(request)
        except Exception as exc:  # raised here, not as a group from the nursery
            error = exc
        nursery.cancel_scope.cancel()  # a server still sending after an error
    if error is not None:
        raise error
    return result, bytes(sent)


async def test_the_request_is_written_with_its_length(
    autojump_clock: trio.testing.MockClock,
) -> None:
    ok = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}"
    (status, headers, body, reusable), sent = await exchange(ok)
    assert sent == (
        b'POST /v1/responses HTTP/1.1\r\nhost: judge:8000\r\ncontent-length: 7\r\n\r\n{"a":1}'
    )
    assert (status, headers, body, reusable) == (200, [(b"content-length", b"2")], b"{}", True)


@pytest.mark.parametrize(
    ("headers", "body", "message"),
    [
        ([(b"x-a", b"one\r\nx-b: two")], b"", "Illegal header value"),
        ([(b"bad name", b"v")], b"", "Illegal header name"),
        ([(b"x-a", b" padded")], b"", "Illegal header value"),
        ([(b"content-length", b"3")], b"{}", "does not match a body of 2 bytes"),
        ([(b"transfer-encoding", b"chunked")], b"{}", "only Content-Length request bodies"),
    ],
)
def test_a_request_header_that_could_split_the_request_is_refused(
    headers: list[tuple[bytes, bytes]], body: bytes, message: str
) -> None:
    with pytest.raises(httpx.LocalProtocolError, match=message):
        request_bytes(b"POST", b"/v1/x", [(b"host", b"h"), *headers], body)


def test_a_get_without_a_body_has_no_length() -> None:
    assert request_bytes(b"GET", b"/v1/models", [(b"host", b"h")], b"") == (
        b"GET /v1/models HTTP/1.1\r\nhost: h\r\n\r\n"
    )


async def test_interim_responses_and_trailers_are_not_the_reply(
    autojump_clock: trio.testing.MockClock,
) -> None:
    reply = (
        b"HTTP/1.1 100 Continue\r\n\r\n"
        b"HTTP/1.1 103 Early Hints\r\nlink: </a>\r\n\r\n"
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nX-Reply: yes\r\n\r\n"
        b'3;ext=1\r\n{"a\r\n3\r\n":1\r\n1\r\n}\r\n0\r\nx-trailer: 1\r\n\r\n'
    )
    (status, headers, body, reusable), _ = await exchange(reply)
    assert (status, body, reusable) == (200, b'{"a":1}', True)
    assert headers == [(b"transfer-encoding", b"chunked"), (b"x-reply", b"yes")]


async def test_a_reply_a_byte_at_a_time_is_read_whole(
    autojump_clock: trio.testing.MockClock,
) -> None:
    reply = b'HTTP/1.1 201 Created\r\ncontent-length: 11\r\n\r\n{"ok":true}'
    start = trio.current_time()
    (status, _, body, reusable), _ = await exchange(
        *(reply[i : i + 1] for i in range(len(reply))), every_s=0.5
    )
    assert (status, body, reusable) == (201, b'{"ok":true}', True)
    assert trio.current_time() - start == pytest.approx(0.5 * len(reply))


@pytest.mark.parametrize(
    "after",
    [b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}", b"garbage"],
    ids=["a second response", "bytes that are no response"],
)
async def test_bytes_after_the_reply_make_the_connection_unusable(
    after: bytes, autojump_clock: trio.testing.MockClock
) -> None:
    reply = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}"
    (status, _, body, reusable), _ = await exchange(reply + after)
    assert (status, body, reusable) == (200, b"{}", False)


@pytest.mark.parametrize(
    ("reply", "reusable"),
    [
        (b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 2\r\n\r\n{}", False),
        (b"HTTP/1.0 200 OK\r\ncontent-length: 2\r\n\r\n{}", False),
        (b"HTTP/1.0 200 OK\r\nconnection: keep-alive\r\ncontent-length: 2\r\n\r\n{}", True),
        (b"HTTP/1.1 204 No Content\r\n\r\n", True),
    ],
)
async def test_keep_alive_follows_the_version_and_connection_header(
    reply: bytes, reusable: bool, autojump_clock: trio.testing.MockClock
) -> None:
    (_, _, _, kept), _ = await exchange(reply)
    assert kept is reusable


async def test_a_close_delimited_body_ends_with_the_stream(
    autojump_clock: trio.testing.MockClock,
) -> None:
    (status, _, body, reusable), _ = await exchange(
        b"HTTP/1.1 200 OK\r\n\r\nuntil ", b"the end", close=True
    )
    assert (status, body, reusable) == (200, b"until the end", False)


async def test_a_head_reply_has_no_body_whatever_its_length(
    autojump_clock: trio.testing.MockClock,
) -> None:
    head = (b"HEAD", b"/v1/models", [(b"host", b"h")], b"")
    (status, headers, body, reusable), _ = await exchange(
        b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n", request=head
    )
    assert (status, headers, body, reusable) == (200, [(b"content-length", b"100")], b"", False)


@pytest.mark.parametrize(
    ("reply", "error", "message"),
    [
        (
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: gzip\r\n\r\nabc",
            httpx.RemoteProtocolError,
            "unsupported Transfer-Encoding 'gzip'",
        ),
        (
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n",
            httpx.RemoteProtocolError,
            "illegal response body: ",
        ),
        (
            b"HTTP/1.1 101 Switching Protocols\r\nupgrade: h2c\r\nconnection: upgrade\r\n\r\n",
            httpx.RemoteProtocolError,
            "unexpected protocol switch",
        ),
        (b"HTTP/1.1 200 OK\r\ncontent-length: 65\r\n\r\n", ResponseTooLarge, "Content-Length 65"),
        (b"HTTP/1.1 200 OK\r\n\r\n" + b"x" * 65, ResponseTooLarge, "the body"),
    ],
)
async def test_replies_the_client_does_not_take(
    reply: bytes, error: type[Exception], message: str, autojump_clock: trio.testing.MockClock
) -> None:
    with pytest.raises(error, match=message):
        await exchange(reply, limit=64)


async def test_a_response_head_without_an_end_is_cut_off(
    autojump_clock: trio.testing.MockClock,
) -> None:
    endless = b"HTTP/1.1 200 OK\r\n" + b"x-pad: " + b"p" * (MAX_HEAD_BYTES + 1)
    with pytest.raises(httpx.RemoteProtocolError, match=f"exceeds {MAX_HEAD_BYTES} bytes"):
        await exchange(endless)


async def test_a_close_inside_the_head_is_an_incomplete_reply(
    autojump_clock: trio.testing.MockClock,
) -> None:
    with pytest.raises(httpx.RemoteProtocolError) as info:
        await exchange(b"HTTP/1.1 200 OK\r\ncontent-len", close=True)
    assert str(info.value).startswith(INCOMPLETE)


async def test_replies_being_read_are_bounded_in_all(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # (#40 item 2) max_response_bytes bounds one reply; 256 of them at once were 8 GiB
    budget = ReplyBudget(100_000)
    budget.used = 60_000  # other replies being read meanwhile
    body = b"x" * 30_000
    reply = b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(body) + body
    (status, _, got, _), _ = await exchange(reply, budget=budget)
    assert (status, got, budget.used) == (200, body, 60_000)  # counted while read, then given back
    body = b"x" * 50_000
    reply = b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(body) + body
    with pytest.raises(ResponseTooLarge) as info:
        await exchange(reply, budget=budget)
    assert str(info.value) == (
        "judge replies being read exceed judge.max_response_bytes_total (100000 bytes) in all"
    )
    assert budget.used == 60_000
    assert reply_budget(12_345) is reply_budget(12_345)  # one per value, shared by every pool
    assert reply_budget(12_345).limit == 12_345
    keys = {"max_response_bytes": 1024, "max_response_bytes_total": 54_321}
    judge = settings_from_mapping({"judge": keys}).judge
    assert judge_pool("http://judge:8000/v1", judge)._budget is reply_budget(54_321)


def test_the_total_must_hold_one_reply_at_the_cap() -> None:
    with pytest.raises(ConfigError) as info:
        settings_from_mapping(
            {"judge": {"max_response_bytes": 4096, "max_response_bytes_total": 2048}}
        )
    assert str(info.value).endswith(
        "judge.max_response_bytes_total: must be >= judge.max_response_bytes (4096): one reply at "
        "the cap would never fit"
    )
