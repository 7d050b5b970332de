"""How the judge's connections are opened and watched: the network backend, `KeepAlivePool`'s
seam.

The pool opens every connection through a `NetworkBackend`, as httpcore's pools do through
theirs: `TcpBackend` (trio's TCP) in production; tests pass an in-memory one
(`genrm_trio.testing.network.MemoryNetwork`) and so script bytes through the very exchange
production runs. A backend returns a plain `trio.abc.Stream`; the pool puts TLS over it.

Two things the connection asks of a stream without reading from it: whether an idle one has
something to read (`is_readable`: the server closed it, or sent bytes nobody asked for), and,
while a large body goes out, to be woken when the server answers early (`readiness`). A
`trio.SocketStream` answers from its socket; any other stream by being `Watchable`.
"""

from __future__ import annotations

import select
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Protocol, final, runtime_checkable

import trio

__all__ = ["NetworkBackend", "TcpBackend", "Watchable", "is_readable", "readiness"]


class NetworkBackend(Protocol):
    """Opens the judge's TCP connections. Raises OSError when a connection cannot be made (the
    pool reports it as a `ConnectError`)."""

    async def connect_tcp(self, host: str, port: int) -> trio.abc.Stream: ...


@final
class TcpBackend:
    """Real TCP (`trio.open_tcp_stream`): no timeout, no retry of its own (D15); the attempt's
    deadline bounds it."""

    async def connect_tcp(self, host: str, port: int) -> trio.abc.Stream:
        return await trio.open_tcp_stream(host, port)


@runtime_checkable
class Watchable(Protocol):
    """A stream that is not a socket but can say whether it has something to read."""

    def is_readable(self) -> bool:
        """Whether a read would return at once (bytes, the end of the stream, or an error)."""
        ...

    async def wait_readable(self) -> None:
        """Return once `is_readable()` is true."""
        ...


def is_readable(stream: trio.abc.Stream) -> bool:
    """Whether an idle connection has something to read: it cannot carry another request then.
    A stream that cannot tell counts as readable (it is never reused)."""
    while isinstance(stream, trio.SSLStream):
        stream = stream.transport_stream
    if isinstance(stream, trio.SocketStream):
        fd = stream.socket.fileno()
        if fd < 0:
            return True
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        return bool(poller.poll(0))
    if isinstance(stream, Watchable):
        return stream.is_readable()
    return True


def readiness(stream: trio.abc.Stream) -> Callable[[], Awaitable[None]] | None:
    """What to await to learn that the server has answered (or closed) while a request is still
    being written; None when `stream` cannot be watched. A TLS stream is not watched: its raw
    socket turns readable for TLS records (a session ticket) that are no answer."""
    if isinstance(stream, trio.SocketStream):
        return partial(trio.lowlevel.wait_readable, stream.socket)
    if isinstance(stream, Watchable):
        return stream.wait_readable
    return None
