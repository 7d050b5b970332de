"""bench's HTTP client: POSTs to one server over the judge's keep-alive pool."""

from __future__ import annotations

import math
from typing import final

import httpx
import trio

from genrm_trio.judge.pool import KeepAlivePool

__all__ = ["HttpPool"]


@final
class HttpPool:
    """bench's POSTs to one server, over the judge's keep-alive pool (`judge.pool.KeepAlivePool`).

    A load generator has to cost much less than the server it measures, and it shares a core
    with the simulated judge, so not httpx (docs/benchmarks.md, "The load generator"). The
    judge's pool does O(1) work per request (responses parsed by llhttp): one connection per
    request in flight, idle ones
    reused most-recent first; a connection that fails or is cancelled mid-exchange is closed,
    and a request on a reused connection that the server closed meanwhile (keep-alive expiry)
    is sent once more on a new one.
    """

    def __init__(self, base_url: str, timeout_s: float, headers: dict[str, str]) -> None:
        url = httpx.URL(base_url)
        if url.scheme != "http":
            raise ValueError(f"bench speaks plain http only, got {base_url!r}")
        self._prefix = url.path.rstrip("/").encode("latin-1")
        self._headers = [
            (b"host", url.netloc),
            *((name.encode("latin-1"), value.encode("latin-1")) for name, value in headers.items()),
            (b"content-type", b"application/json"),
        ]
        self._timeout_s = timeout_s
        # No idle expiry: bench reuses an idle connection however long it waited, as before; one
        # the server closed meanwhile is noticed (readable) or, closed as the request went out,
        # the request is sent again on a new connection.
        self._pool = KeepAlivePool(url, keepalive_expiry=math.inf)

    async def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        """POST a JSON body; (status, response body). Raises httpx.RequestError (a connection
        refused or broken, a reply that is not HTTP/1.x) or trio.TooSlowError."""
        headers = [*self._headers, (b"content-length", b"%d" % len(body))]
        request = (b"POST", self._prefix + path.encode("latin-1"), headers, body)
        with trio.fail_after(self._timeout_s):
            status, _, reply = await self._pool.exchange(request)
        return status, reply

    async def aclose(self) -> None:
        await self._pool.aclose()
