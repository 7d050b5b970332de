"""One HTTP/1.1 connection to the judge, framed by h11 (the sans-IO HTTP/1.1 library under
httpcore and hypercorn), for `KeepAlivePool`.

h11 does the protocol: the request's serialisation and body framing, the response's status
line, headers, Content-Length / chunked / close-delimited body, interim 1xx responses, HEAD and
204/304 bodies, keep-alive (`Connection: close`, HTTP/1.0), and the validation of everything a
server sends. This module does the I/O on a trio stream, the judge client's limits (a response
body cap, unsolicited bytes) and the mapping of failures to the httpx exceptions the rest of the
client speaks (docs/differences.md, D14): WriteError / ReadError for a broken socket,
RemoteProtocolError for a connection closed before a complete response or a response that is
not HTTP/1.x. h11 costs about 0.08 ms of CPU per exchange more than a hand-written parser did, on
calls that last seconds (docs/benchmarks.md).
"""

from __future__ import annotations

from typing import Final, final

import h11
import httpx
import trio

__all__ = [
    "INCOMPLETE",
    "MAX_HEAD_BYTES",
    "NO_RESPONSE",
    "H11Connection",
    "OutgoingRequest",
    "ResponseTooLarge",
]

RECV_BYTES: Final = 65536
MAX_HEAD_BYTES: Final = 64 * 1024  # status line and headers of one response (h11's default)
NO_RESPONSE: Final = "Server disconnected without sending a response."
INCOMPLETE: Final = "peer closed connection without sending complete message body"

WATCHED_SEND_BYTES: Final = 256 * 1024
"""Requests larger than this are written while the socket is watched for an early answer."""

OutgoingRequest = tuple[bytes, bytes, list[tuple[bytes, bytes]], bytes]
"""(method, target, headers, body) of one request; headers include Host and Content-Length."""


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


@final
class H11Connection:
    """A keep-alive HTTP/1.1 client connection: one request at a time, h11 doing the framing."""

    __slots__ = ("_h11", "max_body", "received", "stream")

    def __init__(self, stream: trio.abc.Stream, max_body: int) -> None:
        self.stream = stream
        self.max_body = max_body  # a longer response body ends the exchange (ResponseTooLarge)
        self.received = False  # whether any byte of the current response arrived
        self._h11 = h11.Connection(h11.CLIENT, max_incomplete_event_size=MAX_HEAD_BYTES)

    async def _fill(self) -> None:
        try:
            data = await self.stream.receive_some(RECV_BYTES)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            raise httpx.ReadError(cause(exc)) from exc
        if data:
            self.received = True
        # b"": the server closed its side. (Sockets give bytes; a TLS stream may give bytearray.)
        self._h11.receive_data(data if isinstance(data, bytes) else bytes(data))

    async def exchange(
        self, request: OutgoingRequest | list[OutgoingRequest]
    ) -> tuple[int, list[tuple[bytes, bytes]], bytes, bool]:
        """Send `request` and read its response: (status, headers with lower-case names, body,
        reusable). A request in a one-item list is taken out of it, so no frame keeps it while
        the reply is awaited.

        A server may answer before it has read the whole request (a 413 for a body too large)
        and close the connection, which breaks the write: the answer is read and returned all
        the same (as httpcore does), and only when there is none is it a WriteError."""
        conn = self._h11
        if conn.our_state is h11.DONE:
            conn.start_next_cycle()
        method, target, headers, body = request.pop() if isinstance(request, list) else request
        try:
            data = (
                (conn.send(h11.Request(method=method, target=target, headers=headers)) or b"")
                + (conn.send(h11.Data(data=body)) or b"")
                + (conn.send(h11.EndOfMessage()) or b"")
            )
        except h11.LocalProtocolError as exc:  # a bad header: a client bug, not retried
            raise httpx.LocalProtocolError(str(exc)) from exc
        del body, request
        self.received = False
        try:
            answered_early = await self._send(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            del data
            try:
                status, response_headers, reply, _ = await self._read_response()
            except httpx.TransportError:
                raise httpx.WriteError(cause(exc)) from exc
            return status, response_headers, reply, False
        del data
        status, response_headers, reply, reusable = await self._read_response()
        return status, response_headers, reply, reusable and not answered_early

    async def _send(self, data: bytes) -> bool:
        """Write `data`; True when the server answered (or closed) before it was all written.

        A large body is written while the socket is watched: a server that answers early (413)
        and then stops reading without closing would otherwise leave the write blocked until
        the attempt's deadline. The rest of the body is then not sent, and the connection is
        not reused."""
        stream = self.stream
        if len(data) <= WATCHED_SEND_BYTES or not isinstance(stream, trio.SocketStream):
            await stream.send_all(data)
            return False
        answered = False
        async with trio.open_nursery() as nursery:

            async def watch() -> None:
                nonlocal answered
                await trio.lowlevel.wait_readable(stream.socket)
                answered = True
                nursery.cancel_scope.cancel()

            nursery.start_soon(watch)
            await stream.send_all(data)
            nursery.cancel_scope.cancel()
        return answered

    async def _read_response(self) -> tuple[int, list[tuple[bytes, bytes]], bytes, bool]:
        conn = self._h11
        status = 0
        headers: list[tuple[bytes, bytes]] = []
        parts: list[bytes] = []
        total = 0
        limit = self.max_body
        try:
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    await self._fill()
                elif type(event) is h11.Data:
                    total += len(event.data)
                    if total > limit:
                        raise ResponseTooLarge(too_large(limit, "the body"))
                    parts.append(event.data)
                elif type(event) is h11.Response:
                    status = event.status_code
                    headers = list(event.headers)
                    for name, value in headers:
                        if name == b"content-length" and int(value) > limit:
                            raise ResponseTooLarge(too_large(limit, f"Content-Length {int(value)}"))
                elif type(event) is h11.EndOfMessage:
                    break
                elif type(event) is h11.ConnectionClosed:  # pragma: no cover - h11 raises first
                    raise httpx.RemoteProtocolError(NO_RESPONSE if not status else INCOMPLETE)
                # h11.InformationalResponse (100 Continue, 103 ...): skipped
        except h11.RemoteProtocolError as exc:
            raise httpx.RemoteProtocolError(self._describe(exc, status, total)) from exc
        reusable = (
            conn.our_state is h11.DONE
            and conn.their_state is h11.DONE
            and not conn.trailing_data[0]  # bytes nobody asked for: do not reuse
        )
        return status, headers, b"".join(parts), reusable

    def _describe(self, exc: h11.RemoteProtocolError, status: int, received: int) -> str:
        """The message of a broken response, in the words httpcore used for the same cases."""
        closed = self._h11.trailing_data[1]
        if closed and not status:
            return NO_RESPONSE if not self.received else f"{INCOMPLETE}: {exc} (no status line)"
        text = str(exc)
        if text.startswith(INCOMPLETE + " (") and text.endswith(")"):  # h11's words
            return f"{INCOMPLETE}: {text[len(INCOMPLETE) + 2 : -1]}"
        if closed:
            return f"{INCOMPLETE}: received {received} body bytes ({text})"
        return text
