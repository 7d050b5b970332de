"""An in-memory network for the judge client (a test tool): `MemoryNetwork`, a
`judge.network.NetworkBackend` whose connections are pairs of `MemoryStream`s, each served by a
script of the test's, so tests script bytes through the production pool and connection, in
virtual time.

A `MemoryStream` behaves as a TCP socket does where the judge client can tell: bounded buffers
(a server that stops reading blocks the writer), a close that the peer reads as the end of the
stream after what was sent, a reset (or a close with bytes unread, as Linux does) after which
the peer still reads what had arrived and then fails, and writes to a reset peer that fail.
Failures are raised as trio's `SocketStream` raises them, with the same words.

On top of it, `serve_requests` turns a handler of parsed requests into a connection script, and
`serve_asgi` serves an ASGI app (the simulated judge) with `testing.server`'s HTTP/1.1.

Server scripts run as trio system tasks, so a network needs no nursery of the test's: each ends
with its connection, or with the test's trio run. A script that raises resets its connection
and is kept in `MemoryNetwork.errors`.
"""

from __future__ import annotations

import errno
import json
import os
import ssl
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal, final

import trio

__all__ = [
    "CAPACITY",
    "Connect",
    "MemoryNetwork",
    "MemoryStream",
    "Request",
    "read_request",
    "reset",
    "response_bytes",
    "serve_asgi",
    "serve_requests",
]

CAPACITY: Final = 256 * 1024
"""Bytes one direction of a connection buffers before a writer waits: about a socket's."""

Connect = Literal["accept", "refuse", "reset"]
"""What `MemoryNetwork.connect_tcp` does: open a connection, refuse it (ConnectionRefusedError),
or open one the server has already reset (the first write fails)."""

Serve = Callable[[trio.abc.Stream], Awaitable[None]]


def _broken(code: int) -> trio.BrokenResourceError:
    """The error trio's SocketStream raises for a socket that failed with errno `code`."""
    cause = OSError(code, os.strerror(code))
    error = trio.BrokenResourceError(f"socket connection broken: {cause}")
    error.__cause__ = cause
    return error


@final
class _Direction:
    """The bytes on their way from one end to the other."""

    __slots__ = ("buffer", "eof", "lot", "reset")

    def __init__(self) -> None:
        self.buffer = bytearray()
        self.eof = False  # the writer closed its side: the end of the stream after the buffer
        self.reset = False  # the connection was reset: the reader fails after the buffer
        self.lot = trio.lowlevel.ParkingLot()  # readers waiting for bytes, writers for room


@final
class MemoryStream(trio.abc.HalfCloseableStream):
    """One end of an in-memory TCP connection (see the module docstring)."""

    def __init__(self, incoming: _Direction, outgoing: _Direction, capacity: int) -> None:
        self._in = incoming
        self._out = outgoing
        self._capacity = capacity
        self._closed = False
        self.peer: MemoryStream | None = None

    @staticmethod
    def pair(capacity: int = CAPACITY) -> tuple[MemoryStream, MemoryStream]:
        """(client end, server end) of a new connection."""
        up, down = _Direction(), _Direction()
        client, server = MemoryStream(down, up, capacity), MemoryStream(up, down, capacity)
        client.peer, server.peer = server, client
        return client, server

    # --- writing ---------------------------------------------------------------------------

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await trio.lowlevel.checkpoint()
        view = memoryview(data)
        while view:
            self._check_send()
            room = self._capacity - len(self._out.buffer)
            if room <= 0:
                await self._out.lot.park()
                continue
            self._out.buffer += view[:room]
            view = view[room:]
            self._out.lot.unpark_all()

    def _check_send(self) -> None:
        if self._closed:
            raise trio.ClosedResourceError("this stream was closed")
        if self._out.reset:
            raise _broken(errno.ECONNRESET)
        if self._out.eof:
            raise trio.ClosedResourceError("this stream's sending side was closed")

    async def wait_send_all_might_not_block(self) -> None:
        await trio.lowlevel.checkpoint()

    async def send_eof(self) -> None:
        await trio.lowlevel.checkpoint()
        if not self._closed and not self._out.reset:
            self._out.eof = True
            self._out.lot.unpark_all()

    # --- reading ---------------------------------------------------------------------------

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        await trio.lowlevel.checkpoint()
        while True:
            if self._closed:
                raise trio.ClosedResourceError("this stream was closed")
            incoming = self._in
            if incoming.buffer:
                size = len(incoming.buffer) if max_bytes is None else max_bytes
                data = bytes(incoming.buffer[:size])
                del incoming.buffer[:size]
                incoming.lot.unpark_all()  # room for the writer
                return data
            if incoming.reset:
                raise _broken(errno.ECONNRESET)
            if incoming.eof:
                return b""
            await incoming.lot.park()

    def is_readable(self) -> bool:
        """Whether a read would return at once (judge.network.Watchable)."""
        incoming = self._in
        return bool(incoming.buffer) or incoming.eof or incoming.reset or self._closed

    async def wait_readable(self) -> None:
        while not self.is_readable():
            await self._in.lot.park()

    async def wait_peer_gone(self) -> None:
        """Return once the peer has closed or reset the connection."""
        while not (self._in.eof or self._in.reset or self._closed):
            await self._in.lot.park()

    # --- closing ---------------------------------------------------------------------------

    def reset(self) -> None:
        """Reset the connection (RST): the peer reads what had arrived, then fails; its writes
        fail at once; this end is closed."""
        if self._closed:
            return
        self._closed = True
        self._out.reset = True
        self._in.reset = True
        self._in.buffer.clear()
        self._out.lot.unpark_all()
        self._in.lot.unpark_all()

    async def aclose(self) -> None:
        """Close: the peer reads the end of the stream after what was sent; were bytes left
        unread here, a reset instead (as the kernel does)."""
        if not self._closed:
            if self._in.buffer:
                self.reset()
            else:
                self._closed = True
                self._out.eof = True
                self._in.reset = True  # the peer's later writes fail
                self._out.lot.unpark_all()
                self._in.lot.unpark_all()
        await trio.lowlevel.checkpoint()


def _memory(stream: trio.abc.Stream) -> MemoryStream:
    """The in-memory connection under `stream` (itself, or the one a TLS stream runs over)."""
    while isinstance(stream, trio.SSLStream):
        stream = stream.transport_stream
    assert isinstance(stream, MemoryStream), stream
    return stream


def reset(stream: trio.abc.Stream) -> None:
    """Reset the in-memory connection under `stream` (see `MemoryStream.reset`)."""
    _memory(stream).reset()


@final
class MemoryNetwork:
    """A `judge.network.NetworkBackend` of in-memory connections: `connect_tcp` asks `connect`
    (when given) what to do, then starts `serve(server end)` (over TLS with the server context
    `tls`, when given) and returns the client end."""

    def __init__(
        self,
        serve: Serve,
        *,
        connect: Callable[[str, int], Connect] | None = None,
        tls: ssl.SSLContext | None = None,
        capacity: int = CAPACITY,
    ) -> None:
        self._serve = serve
        self._connect = connect
        self._tls = tls
        self._capacity = capacity
        self.connections = 0  # connections opened
        self.open = 0  # server scripts still running
        self.refused = 0
        self.hosts: list[tuple[str, int]] = []  # every connection asked for, in order
        self.errors: list[BaseException] = []  # what server scripts raised
        self.all_closed = trio.Event()

    async def connect_tcp(self, host: str, port: int) -> trio.abc.Stream:
        await trio.lowlevel.checkpoint()
        self.hosts.append((host, port))
        what = self._connect(host, port) if self._connect is not None else "accept"
        if what == "refuse":
            self.refused += 1
            raise ConnectionRefusedError(
                errno.ECONNREFUSED, f"Error connecting to {(host, port)!r}: Connection refused"
            )
        client, server = MemoryStream.pair(self._capacity)
        self.connections += 1
        if what == "reset":
            server.reset()
            return client
        self.open += 1
        self.all_closed = trio.Event()
        trio.lowlevel.spawn_system_task(self._run, server, name=f"memory judge {host}:{port}")
        return client

    async def _run(self, raw: MemoryStream) -> None:
        stream: trio.abc.Stream = raw
        if self._tls is not None:
            stream = trio.SSLStream(raw, self._tls, server_side=True)
        try:
            await self._serve(stream)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the client went away
        except Exception as exc:  # a script's bug: the client sees a reset, the test the error
            self.errors.append(exc)
            raw.reset()
        finally:
            await trio.aclose_forcefully(stream)
            self.open -= 1
            if self.open == 0:
                self.all_closed.set()


# --- HTTP/1.1 on it -------------------------------------------------------------------------------


@final
@dataclass(frozen=True, slots=True)
class Request:
    """One request as the server read it."""

    method: str
    target: str
    headers: dict[str, str]  # lower-case names; the last value of a repeated header
    body: bytes
    raw: bytes  # the request's bytes as sent
    at: float  # trio.current_time() when it was read

    def json(self) -> Any:
        return json.loads(self.body)


async def read_request(
    stream: trio.abc.ReceiveStream, buffer: bytes
) -> tuple[Request, bytes] | None:
    """One request with a Content-Length body (or none): (the request, what came after it), or
    None when the peer closed first. `buffer` holds bytes already received."""
    while b"\r\n\r\n" not in buffer:
        data = await stream.receive_some()
        if not data:
            return None
        buffer += data
    head, _, rest = buffer.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    method, target, _ = lines[0].split(" ", 2)
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "0"))
    while len(rest) < length:
        data = await stream.receive_some()
        if not data:
            return None
        rest += data
    raw = head + b"\r\n\r\n" + rest[:length]
    request = Request(method, target, headers, rest[:length], raw, trio.current_time())
    return request, rest[length:]


def response_bytes(status: int, body: bytes = b"", headers: Sequence[str] = ()) -> bytes:
    """An HTTP/1.1 response with a Content-Length."""
    lines = [f"HTTP/1.1 {status} X", f"content-length: {len(body)}", *headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


Handler = Callable[[Request, trio.abc.Stream], Awaitable[bool]]


def serve_requests(handler: Handler) -> Serve:
    """A connection script: every request read is handed to `handler(request, stream)`, which
    answers on `stream` and returns whether the connection stays open for the next one. A
    client that closes the connection meanwhile cancels the handler (as a server notices a
    client gone while it works)."""

    async def serve(stream: trio.abc.Stream) -> None:
        buffer = b""
        raw = _memory(stream)
        while True:
            got = await read_request(stream, buffer)
            if got is None:
                return
            request, buffer = got
            keep = False
            async with trio.open_nursery() as nursery:

                async def hang_up_with_the_client() -> None:
                    await raw.wait_peer_gone()
                    nursery.cancel_scope.cancel()

                nursery.start_soon(hang_up_with_the_client)
                try:
                    keep = await handler(request, stream)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    keep = False  # the client went away while it was answered
                nursery.cancel_scope.cancel()
            if not keep:
                return

    return serve


def serve_asgi(app: Any) -> Serve:
    """A connection script serving the ASGI `app` (the simulated judge's, `testing.asgi`) as
    `testing.server` serves it on a socket."""
    from genrm_trio.testing.server import serve_connection

    async def serve(stream: trio.abc.Stream) -> None:
        await serve_connection(app, stream, ("judge.test", 8000))

    return serve
