"""The judge's keep-alive connection pool: `KeepAlivePool`, HTTP/1.1 connections to one origin
with O(1) work per request, `judge_pool`, the pool one judge (replica) is configured to have, and
the decoding of a compressed reply.

It replaces httpx's default pool, whose bookkeeping grows quadratically with connections
(measured in benchmarks/judge_client.py, docs/architecture.md). Each connection is one
`judge.http1.Http1Connection` (responses parsed by llhttp) without httpcore's layers over it
(traces, locks, a timeout scope per read), opened through a `judge.network.NetworkBackend` (the
seam tests script bytes through); its failures are the httpx exceptions httpcore raised. The
pool knows nothing of judge APIs: it sends (method, target, headers, body) and returns (status,
headers, body), so the start-up probe and `genrm-trio bench` use it too. It is no httpx
transport: no httpx client sits on the judge path. Concurrency is bounded by its callers.
"""

from __future__ import annotations

import logging
import ssl
import zlib
from collections import deque
from typing import Final, final

import httpx
import trio

from genrm_trio.config import KEEPALIVE_EXPIRY_S, MAX_RESPONSE_BYTES, JudgeSettings
from genrm_trio.domain.exceptions import leaves
from genrm_trio.judge.http1 import (
    Http1Connection,
    OutgoingRequest,
    ReplyBudget,
    ResponseTooLarge,
    cause,
    reply_budget,
    too_large,
)
from genrm_trio.judge.network import NetworkBackend, TcpBackend, is_readable
from genrm_trio.judge.tls import judge_ssl_context

# The judge client's logger: the pool's lines were logged there before it had a module of its own.
log = logging.getLogger("genrm_trio.judge")

__all__ = [
    "KEEPALIVE_EXPIRY_S",
    "MAX_RESPONSE_BYTES",
    "CertificateError",
    "KeepAlivePool",
    "StaleConnectionError",
    "UnreachableError",
    "decode_content",
    "judge_pool",
]


def decode_content(headers: list[tuple[bytes, bytes]], body: bytes, limit: int) -> bytes:
    """`body` with its `Content-Encoding` (gzip, x-gzip, deflate; identity) undone, at most
    `limit` bytes. A server may compress although the request said `Accept-Encoding: identity`.
    Raises httpx.DecodingError for an unknown coding or a body that does not decode, and
    ResponseTooLarge past the limit."""
    codings: list[bytes] = []
    for name, value in headers:
        if name == b"content-encoding":
            codings.extend(c.strip().lower() for c in value.split(b",") if c.strip())
    for coding in reversed(codings):  # the last coding applied is undone first
        if coding == b"identity":
            continue
        if coding in (b"gzip", b"x-gzip"):
            decoders = [zlib.decompressobj(zlib.MAX_WBITS | 16)]
        elif coding == b"deflate":  # zlib-wrapped as RFC 9110 says, or raw as some servers send
            decoders = [zlib.decompressobj(), zlib.decompressobj(-zlib.MAX_WBITS)]
        else:
            raise httpx.DecodingError(f"unsupported Content-Encoding {coding.decode('latin-1')!r}")
        for number, decoder in enumerate(decoders):
            try:
                out = decoder.decompress(body, limit + 1)
            except zlib.error as exc:
                if number + 1 < len(decoders):
                    continue
                raise httpx.DecodingError(
                    f"{coding.decode('latin-1')} body does not decode: {exc}"
                ) from None
            if len(out) > limit:
                raise ResponseTooLarge(too_large(limit, f"{coding.decode()} body decompressed"))
            body = out
            break
    return body


def connect_failure(exc: OSError) -> str:
    """The text of a connection that could not be made, with the reason of each address tried:
    trio says only "all attempts to connect to host:port failed" and keeps the reasons
    ("Connection refused") in the exception group under it."""
    text = str(exc) or type(exc).__name__
    under = exc.__cause__
    if isinstance(under, BaseExceptionGroup):
        reasons = dict.fromkeys(str(leaf) or type(leaf).__name__ for leaf in leaves(under))
        text = f"{text}: {'; '.join(reasons)}"
    return text


def _certificate_rejected(exc: BaseException) -> bool:
    """Whether a failed TLS handshake failed on the server's certificate (anywhere under it)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, ssl.SSLCertVerificationError):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


class StaleConnectionError(httpx.RemoteProtocolError):
    """A reused connection closed before any byte of the response: send the request again on a
    new connection (`KeepAlivePool.exchange(..., fresh=True)`); nothing was answered."""


class UnreachableError(httpx.ConnectError):
    """The TCP connection could not be opened (refused, reset or unreachable while connecting, a
    name that does not resolve): the request never reached a server."""


class CertificateError(httpx.ConnectError):
    """The TLS handshake failed on the server's certificate (`CERTIFICATE_VERIFY_FAILED`): the
    same judge would fail the same way again, so it is not retried."""


# What a reused connection the server closed meanwhile fails with: the write breaks (reset), or
# the read finds the end of the stream or a reset before any response byte.
_STALE: Final = (httpx.WriteError, httpx.ReadError, httpx.RemoteProtocolError)
_ENCODING_HEADERS: Final = frozenset({b"content-encoding", b"content-length"})


@final
class KeepAlivePool:
    """HTTP/1.1 keep-alive connections to one origin, O(1) work per request.

    httpcore's own pool re-examines every queued request against every connection on each
    request start and end (quadratic in the number of connections), and its HTTP/1.1 layer (h11
    events, traces, locks, per-read timeout scopes) was a large share of the server's CPU even
    driven one connection at a time (docs/benchmarks.md, "Judge client"). Here a request takes
    the most recently used idle connection or opens a new one, and `Http1Connection` sends the
    request and reads the response (llhttp); it goes back when the response is read. A
    connection whose exchange did not finish (error, cancellation) is closed at once, shielded,
    so nothing leaks; an idle one the server closed meanwhile is noticed before use (it is
    readable) and replaced, and one idle for `keepalive_expiry` seconds (on trio's clock) is
    closed. Concurrency is bounded by the caller (`judge.max_concurrency`), not here, and a
    refused connection is one failure, never retried inside (docs/differences.md, D15).
    """

    def __init__(
        self,
        origin: httpx.URL,
        *,
        ssl_context: ssl.SSLContext | None = None,
        keepalive_expiry: float = KEEPALIVE_EXPIRY_S,
        max_response_bytes: int = MAX_RESPONSE_BYTES,
        budget: ReplyBudget | None = None,
        backend: NetworkBackend | None = None,
    ) -> None:
        self._host = origin.raw_host.decode("ascii")
        self._max_body = max_response_bytes
        self._budget = budget  # the replies being read, in all (judge.max_response_bytes_total)
        self._server_name = origin.host
        self._port = origin.port or (443 if origin.scheme == "https" else 80)
        self._ssl_context = ssl_context
        if ssl_context is not None:
            ssl_context.set_alpn_protocols(["http/1.1"])
        self._keepalive_expiry = keepalive_expiry
        self._backend: Final = backend if backend is not None else TcpBackend()
        self._idle: deque[tuple[float, Http1Connection]] = deque()
        self._active: set[Http1Connection] = set()
        self._closed = False
        self.stale_retries = 0  # requests sent again after a reused connection turned out closed

    @property
    def connections(self) -> int:
        """Open connections: idle ones plus those carrying a request now."""
        return len(self._idle) + len(self._active)

    @property
    def active(self) -> int:
        """Connections carrying a request now."""
        return len(self._active)

    async def _connect(self) -> Http1Connection:
        try:
            stream = await self._backend.connect_tcp(self._host, self._port)
        except OSError as exc:
            raise UnreachableError(connect_failure(exc)) from exc
        if self._ssl_context is None:
            return Http1Connection(stream, self._max_body, self._budget)
        tls = trio.SSLStream(
            stream, self._ssl_context, server_hostname=self._server_name, https_compatible=True
        )
        try:
            await tls.do_handshake()
        except BaseException as exc:
            # bounded: a forceful close does not wait for the peer; one second caps it anyway
            with trio.CancelScope(shield=True, deadline=trio.current_time() + 1.0):
                await trio.aclose_forcefully(tls)
            if isinstance(exc, (trio.BrokenResourceError, trio.ClosedResourceError)):
                # trio's error says only "BrokenResourceError"; the ssl error under it says
                # why (CERTIFICATE_VERIFY_FAILED ... unable to get local issuer certificate).
                message = f"TLS handshake failed: {cause(exc)}"
                if _certificate_rejected(exc):
                    raise CertificateError(message) from exc
                raise httpx.ConnectError(message) from exc
            raise
        return Http1Connection(tls, self._max_body, self._budget)

    async def _checkout(self, fresh: bool) -> tuple[Http1Connection, bool]:
        """(a connection, whether it is a reused one)."""
        if not fresh:
            now = trio.current_time()
            while self._idle:
                since, connection = self._idle.pop()
                if since + self._keepalive_expiry >= now and not is_readable(connection.stream):
                    return connection, True
                await self._discard(connection)
        return await self._connect(), False

    async def _discard(self, connection: Http1Connection) -> None:
        # bounded: a forceful close does not wait for the peer; one second caps it anyway
        with trio.CancelScope(shield=True, deadline=trio.current_time() + 1.0):
            try:
                await trio.aclose_forcefully(connection.stream)
            except Exception:  # closing a broken socket may fail; it is gone either way
                log.debug("error closing a judge connection", exc_info=True)

    async def _checkin(self, connection: Http1Connection) -> None:
        now = trio.current_time()
        # Idle connections nobody took for keepalive_expiry sit at the left: close them.
        while self._idle and self._idle[0][0] + self._keepalive_expiry < now:
            await self._discard(self._idle.popleft()[1])
        if self._closed:
            await self._discard(connection)
        else:
            self._idle.append((now, connection))

    async def exchange(
        self, request: OutgoingRequest | list[OutgoingRequest], *, fresh: bool = False
    ) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        """Send one request, (method, target, headers, body), and read the whole reply:
        (status, headers with lower-case names, body). Raises httpx.ConnectError, WriteError,
        ReadError or RemoteProtocolError. A request in a one-item list is dropped once sent.

        A request on a reused connection that fails before any byte of a response arrived
        (the server closed the idle connection as the request went out: its keep-alive expiry
        crossing ours) was not answered: a request given as a tuple is sent once more on a new
        connection; one given in a list is gone, and `StaleConnectionError` asks the caller to
        send it again with `fresh=True`. Either way this is not a failed attempt."""
        if self._closed:
            raise RuntimeError("the judge connection pool is closed")
        connection, reused = await self._checkout(fresh)
        self._active.add(connection)
        try:
            status, headers, body, reusable = await connection.exchange(request)
        except BaseException as exc:
            # Error or cancellation mid-exchange: the connection's state is unknown, close it.
            self._active.discard(connection)
            await self._discard(connection)
            if reused and not connection.received and isinstance(exc, _STALE):
                self.stale_retries += 1
                log.debug("judge connection closed by the server as it was reused (%s)", exc)
                if isinstance(request, tuple):
                    return await self.exchange(request, fresh=True)
                raise StaleConnectionError(str(exc)) from exc
            raise
        self._active.discard(connection)
        if reusable:
            await self._checkin(connection)
        else:
            await self._discard(connection)
        if any(name == b"content-encoding" for name, _ in headers):
            body = decode_content(headers, body, self._max_body)
            headers = [(n, v) for n, v in headers if n not in _ENCODING_HEADERS]
            headers.append((b"content-length", b"%d" % len(body)))
        return status, headers, body

    async def aclose(self) -> None:
        """Close every connection. Idempotent."""
        self._closed = True
        connections = [connection for _, connection in self._idle] + list(self._active)
        self._idle.clear()
        self._active.clear()
        for connection in connections:
            await self._discard(connection)


def judge_pool(
    base_url: str, judge: JudgeSettings, *, backend: NetworkBackend | None = None
) -> KeepAlivePool:
    """The connection pool of the judge (or fleet replica) at `base_url`, as `judge` configures
    it (TLS trust, keep-alive expiry, reply cap, the process's budget of replies in all). Judge
    calls and the start-up probe both take theirs from here, so a `judge.*` key reaches both
    without being re-defaulted on the way."""
    origin = httpx.URL(base_url)
    https = origin.scheme == "https"
    return KeepAlivePool(
        origin,
        ssl_context=judge_ssl_context(judge.ca_file) if https else None,
        keepalive_expiry=judge.keepalive_expiry_s,
        max_response_bytes=judge.max_response_bytes,
        budget=reply_budget(judge.max_response_bytes_total),
        backend=backend,
    )
