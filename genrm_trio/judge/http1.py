"""One HTTP/1.1 connection to the judge, for `KeepAlivePool`: the request written here, the
response parsed by httptools (llhttp, the C parser under uvicorn and Node.js).

llhttp does the protocol of the response: the status line, headers, Content-Length and chunked
bodies (chunk extensions, trailers), interim 1xx responses, 204/304 without a body, keep-alive
(`Connection: close`, HTTP/1.0) and the validation of everything a server sends. This module
writes the request (one POST or GET with a Content-Length body; its headers are checked as h11
would), does the I/O on a trio stream, ends a close-delimited body at the end of the stream
(httptools has no call for that), applies the judge client's limits (the response head, the body
cap, bytes nobody asked for) and maps failures to the httpx exceptions the rest of the client
speaks (docs/differences.md, D14): WriteError / ReadError for a broken socket,
RemoteProtocolError for a connection closed before a complete response or a response that is
not HTTP/1.x.

Why llhttp and not h11: h11's events, validation and state machine were the most expensive part
of a judge call on this client's hot path, and llhttp does the same parsing in a few microseconds
(the figures: docs/benchmarks.md, "Session 6").
"""

from __future__ import annotations

import contextlib
import re
from typing import Final, final

import httptools
import httpx
import trio

from genrm_trio.judge.network import readiness

__all__ = [
    "INCOMPLETE",
    "MAX_HEAD_BYTES",
    "NO_RESPONSE",
    "Http1Connection",
    "OutgoingRequest",
    "ReplyBudget",
    "ResponseTooLarge",
    "reply_budget",
]

RECV_BYTES: Final = 65536
MAX_HEAD_BYTES: Final = 64 * 1024  # status line and headers of one response (h11's default)
NO_RESPONSE: Final = "Server disconnected without sending a response."
INCOMPLETE: Final = "peer closed connection without sending complete message body"

WATCHED_SEND_BYTES: Final = 256 * 1024
"""Requests larger than this are written while the socket is watched for an early answer."""

OutgoingRequest = tuple[bytes, bytes, list[tuple[bytes, bytes]], bytes]
"""(method, target, headers, body) of one request; headers include Host (and Content-Length,
which is added when missing)."""

# What RFC 9110 allows in a header name (a token) and value (no CR, LF or NUL; no whitespace at
# either end): the checks h11 applied to the requests it wrote.
_TOKEN: Final = re.compile(rb"[-!#$%&'*+.^_`|~0-9a-zA-Z]+")
_VALUE: Final = re.compile(rb"(?:[^\x00\r\n\t ](?:[^\x00\r\n]*[^\x00\r\n\t ])?)?")
_TARGET: Final = re.compile(rb"[\x21-\x7e]+")


class ResponseTooLarge(httpx.DecodingError):
    """A response body over `judge.max_response_bytes` (as sent or decompressed). Not retried:
    the same request would get the same answer."""


def too_large(limit: int, what: str) -> str:
    return f"judge response exceeds judge.max_response_bytes ({limit} bytes): {what}"


def cause(exc: BaseException) -> str:
    """The message of a trio stream error, with the OS or TLS error under it when there is one
    (trio's own text, `BrokenResourceError`, says nothing about why)."""
    text = str(exc) or type(exc).__name__
    under = exc.__cause__ or exc.__context__
    if under is not None and str(under) and str(under) not in text:
        text = f"{text}: {type(under).__name__}: {under}"
    return text


def request_bytes(
    method: bytes, target: bytes, headers: list[tuple[bytes, bytes]], body: bytes
) -> bytes:
    """The request as sent: `Content-Length` framing only (added when missing), every header
    checked. Raises httpx.LocalProtocolError for a header that could split the request: a
    client bug, never retried."""
    if not _TOKEN.fullmatch(method) or not _TARGET.fullmatch(target):
        raise httpx.LocalProtocolError(f"illegal request line: {method!r} {target!r}")
    length = b"%d" % len(body)
    lines = [b"%s %s HTTP/1.1" % (method, target)]
    framed = False
    for name, value in headers:
        if not _TOKEN.fullmatch(name):
            raise httpx.LocalProtocolError(f"Illegal header name {name!r}")
        if not _VALUE.fullmatch(value):
            raise httpx.LocalProtocolError(f"Illegal header value {value!r}")
        lowered = name.lower()
        if lowered == b"content-length":
            if value.strip() != length:
                raise httpx.LocalProtocolError(
                    f"Content-Length {value!r} does not match a body of {len(body)} bytes"
                )
            framed = True
        elif lowered == b"transfer-encoding":
            raise httpx.LocalProtocolError("only Content-Length request bodies are sent")
        lines.append(name + b": " + value)
    if not framed and (body or method not in (b"GET", b"HEAD")):
        lines.append(b"content-length: " + length)
    lines.append(b"")
    lines.append(body)
    return b"\r\n".join(lines)


@final
class _Response:
    """The llhttp callbacks of one exchange: what the parser found, read after each feed (a
    callback never raises, so an error is always the parser's own)."""

    __slots__ = (
        "after_final",
        "counted",
        "done",
        "head_done",
        "headers",
        "interim",
        "keep_alive",
        "parser",
        "parts",
        "saw_status",
        "status",
        "total",
    )

    def __init__(self) -> None:
        # parser -> self -> parser is a cycle: `_read_response` breaks it when it is done.
        self.parser: httptools.HttpResponseParser | None = httptools.HttpResponseParser(self)
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.parts: list[bytes] = []
        self.total = 0  # body bytes so far
        self.counted = 0  # of those, the ones added to the connection's ReplyBudget
        self.saw_status = False
        self.head_done = False  # the final (non-1xx) response's head is complete
        self.interim = False  # inside a 1xx response
        self.keep_alive = False
        self.done = False
        self.after_final = False  # another message began after the response: unsolicited bytes

    def complete(self) -> bool:
        """Whether the response is complete. (A call, not the attribute: the parser's callbacks
        set it during `feed_data`, which a type checker's narrowing does not see.)"""
        return self.done

    def on_message_begin(self) -> None:
        if self.done:
            self.after_final = True

    def on_status(self, status: bytes) -> None:
        self.saw_status = True

    def on_header(self, name: bytes, value: bytes) -> None:
        if not self.head_done:  # after the head: a chunked body's trailers, not headers
            self.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        parser = self.parser
        assert parser is not None
        status = parser.get_status_code()
        if 100 <= status < 200 and status != 101:  # 100 Continue, 103 Early Hints: skipped
            self.interim = True
            return
        self.status = status
        self.head_done = True
        self.keep_alive = parser.should_keep_alive()  # right only before the body is read

    def on_body(self, data: bytes) -> None:
        if self.done:  # a second response in the same read: not ours (after_final is set)
            return
        self.parts.append(data)
        self.total += len(data)

    def on_message_complete(self) -> None:
        if self.interim:
            self.interim = False
            self.headers = []
            self.saw_status = False
            return
        self.done = True


@final
class ReplyBudget:
    """The body bytes of judge replies being read at once, in all
    (`judge.max_response_bytes_total`): `judge.max_response_bytes` bounds one reply, this bounds
    their sum, which `judge.max_concurrency` replies at the cap would make 8 GiB."""

    __slots__ = ("limit", "used")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0


_BUDGETS: Final[dict[int, ReplyBudget]] = {}


def reply_budget(limit: int) -> ReplyBudget:
    """The process's budget of `limit` bytes: one per value, shared by every pool (each replica
    of a fleet, the start-up probe), since the bytes are this process's memory."""
    budget = _BUDGETS.get(limit)
    if budget is None:
        budget = _BUDGETS[limit] = ReplyBudget(limit)
    return budget


@final
class Http1Connection:
    """A keep-alive HTTP/1.1 client connection: one request at a time, llhttp parsing replies."""

    __slots__ = ("budget", "max_body", "received", "stream")

    def __init__(
        self, stream: trio.abc.Stream, max_body: int, budget: ReplyBudget | None = None
    ) -> None:
        self.stream = stream
        self.max_body = max_body  # a longer response body ends the exchange (ResponseTooLarge)
        self.budget = budget  # shared with every connection reading a reply at the same time
        self.received = False  # whether any byte of the current response arrived

    async def exchange(
        self, request: OutgoingRequest | list[OutgoingRequest]
    ) -> tuple[int, list[tuple[bytes, bytes]], bytes, bool]:
        """Send `request` and read its response: (status, headers with lower-case names, body,
        reusable). A request in a one-item list is taken out of it, so no frame keeps it while
        the reply is awaited.

        A server may answer before it has read the whole request (a 413 for a body too large)
        and close the connection, which breaks the write: the answer is read and returned all
        the same (as httpcore does), and only when there is none is it a WriteError."""
        method, target, headers, body = request.pop() if isinstance(request, list) else request
        data = request_bytes(method, target, headers, body)
        del body, request
        self.received = False
        try:
            answered_early = await self._send(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            # The write broke (a reset, a close): whatever the server said before is still
            # readable (a 413 sent before the reset); without it, this is a WriteError.
            del data
            try:
                status, response_headers, reply, _ = await self._read_response(method)
            except httpx.TransportError:
                raise httpx.WriteError(cause(exc)) from exc
            return status, response_headers, reply, False
        del data
        status, response_headers, reply, reusable = await self._read_response(method)
        return status, response_headers, reply, reusable and not answered_early

    async def _send(self, data: bytes) -> bool:
        """Write `data`; True when the server answered (or closed) before it was all written.
        A broken write raises trio.BrokenResourceError or ClosedResourceError, never a group.

        A large body is written while the stream is watched: a server that answers early (413)
        and then stops reading without closing would otherwise leave the write blocked until
        the attempt's deadline. The rest of the body is then not sent, and the connection is
        not reused."""
        stream = self.stream
        wait_readable = readiness(stream) if len(data) > WATCHED_SEND_BYTES else None
        if wait_readable is None:
            await stream.send_all(data)
            return False
        answered = False
        broken: trio.BrokenResourceError | trio.ClosedResourceError | None = None
        async with trio.open_nursery() as nursery:

            async def watch() -> None:
                nonlocal answered
                # A watch that fails cannot watch: stop writing and read what the server says.
                with contextlib.suppress(Exception):
                    await wait_readable()
                answered = True
                nursery.cancel_scope.cancel()

            nursery.start_soon(watch)
            # Caught here, inside the nursery, so that it leaves as itself: an exception out of
            # a nursery comes wrapped in an ExceptionGroup, which no caller would recognise.
            try:
                await stream.send_all(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                broken = exc
            nursery.cancel_scope.cancel()
        if broken is not None:
            raise broken
        return answered

    async def _read_response(
        self, method: bytes
    ) -> tuple[int, list[tuple[bytes, bytes]], bytes, bool]:
        response = _Response()
        try:
            return await self._read(response, method)
        finally:
            response.parser = None
            if self.budget is not None:
                self.budget.used -= response.counted

    async def _read(
        self, response: _Response, method: bytes
    ) -> tuple[int, list[tuple[bytes, bytes]], bytes, bool]:
        assert response.parser is not None
        feed = response.parser.feed_data
        limit = self.max_body
        head_bytes = 0
        checked = False
        while not response.complete():
            data = await self._fill()
            if not data:  # the server closed its side
                if response.head_done and _close_delimited(response.headers, response.status):
                    break  # a body that runs until the end of the stream (HTTP/1.0 style)
                raise httpx.RemoteProtocolError(self._cut_off(response))
            self.received = True
            if not response.head_done:
                head_bytes += len(data)
            try:
                feed(data)
            except httptools.HttpParserUpgrade:
                raise httpx.RemoteProtocolError(
                    f"unexpected protocol switch ({response.status or 101} response)"
                ) from None
            except httptools.HttpParserError as exc:
                if not response.complete():
                    raise httpx.RemoteProtocolError(_illegal(response, exc)) from None
                response.after_final = True  # bytes after the response that are no response
            if not response.head_done:
                if head_bytes > MAX_HEAD_BYTES:
                    raise httpx.RemoteProtocolError(
                        f"response head exceeds {MAX_HEAD_BYTES} bytes (no end of headers)"
                    )
                continue
            if not checked:
                checked = True
                _check_framing(response.headers, limit)
                if method == b"HEAD":  # no body follows whatever the headers say
                    return response.status, response.headers, b"", False
            if response.total > limit:
                raise ResponseTooLarge(too_large(limit, "the body"))
            budget = self.budget
            if budget is not None and response.total > response.counted:
                budget.used += response.total - response.counted
                response.counted = response.total
                if budget.used > budget.limit:
                    raise ResponseTooLarge(
                        f"judge replies being read exceed judge.max_response_bytes_total "
                        f"({budget.limit} bytes) in all"
                    )
        reusable = response.complete() and response.keep_alive and not response.after_final
        return response.status, response.headers, b"".join(response.parts), reusable

    async def _fill(self) -> bytes:
        """The next bytes of the response; b"" when the server closed its side."""
        try:
            data = await self.stream.receive_some(RECV_BYTES)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            raise httpx.ReadError(cause(exc)) from exc
        return data if isinstance(data, bytes) else bytes(data)  # a TLS stream gives bytearray

    def _cut_off(self, response: _Response) -> str:
        """The message of a response the server's close cut short, in httpcore's words."""
        if not self.received:
            return NO_RESPONSE
        if not response.head_done:
            return f"{INCOMPLETE}: the connection closed inside the response head"
        for name, value in response.headers:
            if name == b"transfer-encoding":
                return f"{INCOMPLETE}: incomplete chunked read"
            if name == b"content-length":
                expected = int(value)
                return f"{INCOMPLETE}: received {response.total} bytes, expected {expected}"
        return f"{INCOMPLETE}: received {response.total} body bytes"  # pragma: no cover


def _close_delimited(headers: list[tuple[bytes, bytes]], status: int) -> bool:
    """Whether a response's body runs until the connection closes: no Content-Length, no
    Transfer-Encoding, and a status that has a body."""
    if status in (204, 304):
        return False  # pragma: no cover - llhttp completes these at the end of the head
    return not any(name in (b"content-length", b"transfer-encoding") for name, _ in headers)


def _check_framing(headers: list[tuple[bytes, bytes]], limit: int) -> None:
    """The judge client's rules for a response head llhttp accepted: only the chunked transfer
    coding (as h11), and a declared length within `judge.max_response_bytes`."""
    for name, value in headers:
        if name == b"transfer-encoding" and value.strip().lower() != b"chunked":
            raise httpx.RemoteProtocolError(
                f"unsupported Transfer-Encoding {value.decode('latin-1')!r}"
            )
        if name == b"content-length" and int(value) > limit:
            raise ResponseTooLarge(too_large(limit, f"Content-Length {int(value)}"))


def _illegal(response: _Response, exc: httptools.HttpParserError) -> str:
    """A parse error, named by where in the response it is (llhttp's words after the colon)."""
    if not response.saw_status:
        return f"illegal status line: {exc}"
    if not response.head_done:
        return f"illegal header line: {exc}"
    return f"illegal response body: {exc}"
