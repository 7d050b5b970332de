"""A minimal HTTP/1.1 server for the simulated judge's ASGI app, on plain trio sockets.

Why not hypercorn here: the simulated judge shares a core with the load generator in every
benchmark, and hypercorn's per-request work (h11 events, a task and an idle timer per request,
three socket writes per response) made it slow enough to spread a group's replies out, which a
real judge (its own GPU box) does not do and which stretched the measured group latency
(docs/benchmarks.md, "Our server vs the reference", session 2, has the figures). This server does
only what the judge's clients need, at a fraction of that cost: keep-alive HTTP/1.1,
`Content-Length` request bodies, one write per response, and `http.disconnect` when the client
goes away while the app is still working (the judge's latency sleep watches for it).

It is a test and benchmark tool: no TLS, no chunked request bodies (411), no pipelining beyond
buffering what arrives early, no `Expect: 100-continue`. Production serving is hypercorn's.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, MutableMapping
from contextlib import suppress
from typing import Any, Final

import trio

__all__ = ["serve_connection", "serve_h1"]

log = logging.getLogger("genrm_trio.sim_judge.h1")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
App = Callable[
    [Scope, Callable[[], Awaitable[Message]], Callable[[Message], Awaitable[None]]],
    Awaitable[None],
]

MAX_HEAD_BYTES: Final = 64 * 1024
MAX_BODY_BYTES: Final = 64 * 1024 * 1024
_REASONS: Final = {
    200: b"OK",
    400: b"Bad Request",
    401: b"Unauthorized",
    404: b"Not Found",
    405: b"Method Not Allowed",
    408: b"Request Timeout",
    411: b"Length Required",
    413: b"Content Too Large",
    429: b"Too Many Requests",
    431: b"Request Header Fields Too Large",
    500: b"Internal Server Error",
    502: b"Bad Gateway",
    503: b"Service Unavailable",
}


class _Reject(Exception):
    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status


def _has_length(headers: list[tuple[bytes, bytes]]) -> bool:
    return any(name.lower() == b"content-length" for name, _ in headers)


def _head(
    status: int, headers: list[tuple[bytes, bytes]], length: int | None, close: bool
) -> bytes:
    """The status line and headers; ``content-length: length`` unless the app set one (or
    ``length`` is None: a body that ends when the connection closes)."""
    lines = [b"HTTP/1.1 %d %s" % (status, _REASONS.get(status, b"Status"))]
    lines.extend(name + b": " + value for name, value in headers)
    if length is not None and not _has_length(headers):
        lines.append(b"content-length: %d" % length)
    if close:
        lines.append(b"connection: close")
    return b"\r\n".join(lines) + b"\r\n\r\n"


class _Connection:
    """One client connection: requests in turn, each handed to the app as an ASGI scope."""

    def __init__(self, stream: trio.abc.Stream, app: App, server: tuple[str, int]) -> None:
        self.stream = stream
        self.app = app
        self.server = server
        self.buffer = bytearray()
        self.eof = False
        self.client: tuple[str, int] | None = None
        if isinstance(stream, trio.SocketStream):  # else an in-memory one (testing.network)
            with suppress(OSError):
                peer = stream.socket.getpeername()
                self.client = (str(peer[0]), int(peer[1]))

    async def _fill(self) -> bool:
        """Read more into the buffer; False at end of stream."""
        if self.eof:
            return False
        data = await self.stream.receive_some(65536)
        if not data:
            self.eof = True
            return False
        self.buffer += data
        return True

    async def serve(self) -> None:
        try:
            while await self._one():
                pass
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            await self.stream.aclose()

    async def _one(self) -> bool:
        """Serve one request; False when the connection is done."""
        while (end := self.buffer.find(b"\r\n\r\n")) < 0:
            if len(self.buffer) > MAX_HEAD_BYTES:
                await self._reject(431)
                return False
            if not await self._fill():
                return False
        head = bytes(self.buffer[:end])
        del self.buffer[: end + 4]
        try:
            method, target, version, headers, length, close = _parse_head(head)
        except _Reject as reject:
            await self._reject(reject.status)
            return False
        while len(self.buffer) < length:
            if not await self._fill():
                return False
        body = bytes(self.buffer[:length])
        del self.buffer[:length]
        path, _, query = target.partition(b"?")
        scope: Scope = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": version,
            "method": method,
            "scheme": "http",
            "path": path.decode("latin-1"),
            "raw_path": path,
            "query_string": query,
            "root_path": "",
            "headers": headers,
            "client": self.client,
            "server": self.server,
        }
        return await self._run(scope, body, close)

    async def _run(self, scope: Scope, body: bytes, close: bool) -> bool:
        delivered = False
        status = 0
        response_headers: list[tuple[bytes, bytes]] = []
        chunks: list[bytes] = []
        started = False  # bytes of this response are on the wire
        finished = False

        async def receive() -> Message:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            # Nothing more to read for this request: wait for the client to go away. Data that
            # arrives meanwhile (a pipelined request) stays in the buffer for the next turn.
            while await self._fill():
                pass
            return {"type": "http.disconnect"}

        async def send(message: Message) -> None:
            nonlocal status, response_headers, started, finished, close
            kind = message["type"]
            if kind == "http.response.start":
                status = int(message["status"])
                response_headers = [(bytes(k), bytes(v)) for k, v in message.get("headers", [])]
            elif kind == "http.response.body":
                chunks.append(bytes(message.get("body", b"")))
                if message.get("more_body", False):
                    # A streamed body: what there is goes out now (the judge's `drop` fault
                    # sends half a body, then fails).
                    data = b"".join(chunks)
                    chunks.clear()
                    if not started:
                        if not _has_length(response_headers):
                            close = True  # no length given: the body ends with the connection
                        data = _head(status, response_headers, None, close) + data
                        started = True
                    await self.stream.send_all(data)
                    return
                data = b"".join(chunks)
                if not started:
                    head = _head(status, response_headers, len(data), close)
                    data = head if scope["method"] == "HEAD" else head + data
                    started = True
                finished = True
                await self.stream.send_all(data)

        try:
            await self.app(scope, receive, send)
        except Exception as exc:
            log.debug("simulated judge app raised %s: %s", type(exc).__name__, exc)
            if not started:
                await self._reject(500)
            return False  # a response cut short: closing tells the client
        if not finished:
            if started:
                return False
            await self._reject(500)
            return False
        return not close and not self.eof

    async def _reject(self, status: int) -> None:
        body = b'{"error": "%s"}' % _REASONS.get(status, b"error").lower()
        head = _head(status, [(b"content-type", b"application/json")], len(body), True)
        with suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            await self.stream.send_all(head + body)


def _keeps_alive(connection: bytes, default: bool) -> bool:
    """Whether a request's `Connection` header value keeps the connection open (else
    ``default``, which is HTTP/1.1's yes and HTTP/1.0's no)."""
    tokens = {token.strip() for token in connection.lower().split(b",")}
    if b"close" in tokens:
        return False
    return True if b"keep-alive" in tokens else default


def _parse_head(
    head: bytes,
) -> tuple[str, bytes, str, list[tuple[bytes, bytes]], int, bool]:
    """(method, target, http version, lower-cased headers, body length, close after)."""
    lines = head.split(b"\r\n")
    parts = lines[0].split(b" ")
    if len(parts) != 3 or not parts[2].startswith(b"HTTP/1."):
        raise _Reject(400)
    method, target, protocol = parts
    headers: list[tuple[bytes, bytes]] = []
    length = 0
    close = protocol == b"HTTP/1.0"
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep or not name or name != name.strip():
            raise _Reject(400)
        name = name.lower()
        value = value.strip()
        headers.append((name, value))
        if name == b"content-length":
            if not value.isdigit():
                raise _Reject(400)
            length = int(value)
            if length > MAX_BODY_BYTES:
                raise _Reject(413)
        elif name == b"transfer-encoding":
            raise _Reject(411)
        elif name == b"connection":
            close = not _keeps_alive(value, not close)
    return method.decode("ascii"), target, protocol[5:].decode("ascii"), headers, length, close


async def serve_connection(app: App, stream: trio.abc.Stream, server: tuple[str, int]) -> None:
    """Serve ``app`` on one connection until the client closes it (the server as `server`, its
    ``(host, port)``, in the ASGI scope)."""
    await _Connection(stream, app, server).serve()


async def serve_h1(
    app: App,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    backlog: int = 4096,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``app`` on ``host:port`` until cancelled; ``task_status.started(bound port)``."""
    listeners = await trio.open_tcp_listeners(port, host=host, backlog=backlog)
    bound = int(listeners[0].socket.getsockname()[1])
    server = (host, bound)

    async def handler(stream: trio.SocketStream) -> None:
        try:
            await _Connection(stream, app, server).serve()
        except Exception as exc:  # one connection's trouble never stops the server
            log.debug("connection failed: %s: %s", type(exc).__name__, exc)

    async with trio.open_nursery() as nursery:
        await nursery.start(trio.serve_listeners, handler, listeners)
        task_status.started(bound)
