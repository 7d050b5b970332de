"""The HTTP judge: `HttpJudge`, one POST per attempt to an OpenAI-style server, and
`make_http_judge`, the judge `settings.judge` describes.

One `attempt()` is one POST: the body is the judge API's (`judge.apis`), the exchange the
keep-alive pool's (`judge.pool`). Every httpx failure is mapped at this boundary to a
`JudgeAttemptError` subclass (docs/differences.md, D14); retries, pacing and deadlines belong to
the caller (`judge.attempts`), so httpx runs with no timeouts and no connection retries of its
own (D15). Tests inject any other httpx transport (`httpx.MockTransport`, `httpx.ASGITransport`)
in place of the pool.
"""

from __future__ import annotations

import email.utils
import json
import math
import re
import ssl
import time
from collections.abc import Mapping
from typing import Any, Final, final

import httpx
import trio

from genrm_trio.config import ConfigError, Settings, endpoint_of, read_secret
from genrm_trio.judge.apis import JUDGE_APIS, judge_api
from genrm_trio.judge.base import (
    JudgeBadJSON,
    JudgeCall,
    JudgeHTTPError,
    JudgeReply,
    JudgeTransportError,
)
from genrm_trio.judge.http1 import OutgoingRequest
from genrm_trio.judge.pool import (
    KEEPALIVE_EXPIRY_S,
    MAX_RESPONSE_BYTES,
    KeepAlivePool,
    StaleConnectionError,
)
from genrm_trio.judge.tls import judge_ssl_context

__all__ = ["HttpJudge", "make_http_judge", "parse_retry_after"]

# Transport errors that are transient (docs/differences.md, D14): connect/read/write/close
# failures and a connection closed before a complete response. Anything else (a local protocol
# error, an unsupported scheme, a proxy error) is a configuration or client bug and is not
# retried.
_RETRYABLE_TRANSPORT: Final = (httpx.NetworkError, httpx.RemoteProtocolError)

_BEARER: Final = re.compile(rb"(?i)(bearer\s+)[^\s;,\"'()\[\]]+")


# --- reply headers and bodies ---------------------------------------------------------------------


def parse_retry_after(value: str | None, *, now: float | None = None) -> float | None:
    """Seconds to wait from a Retry-After header: delay-seconds or an HTTP date (wall clock)."""
    if value is None:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        pass
    else:
        return seconds if math.isfinite(seconds) and seconds >= 0 else None
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def _raw_header(headers: list[tuple[bytes, bytes]], name: bytes) -> str | None:
    """The first value of header `name` (lower case) in a raw header list."""
    for key, value in headers:
        if key.lower() == name:
            return value.decode("latin-1")
    return None


def _transport_error(exc: httpx.RequestError) -> JudgeTransportError:
    name = type(exc).__name__
    error = JudgeTransportError(name, str(exc) or name)
    if not isinstance(exc, _RETRYABLE_TRANSPORT):
        error.retryable = False
    return error


def _decode_json(content: bytes) -> object:
    try:
        return json.loads(content)
    except json.JSONDecodeError as exc:
        raise JudgeBadJSON(str(exc)) from exc
    except (UnicodeDecodeError, RecursionError) as exc:
        raise JudgeBadJSON(f"{type(exc).__name__}: {exc}") from exc


# --- the judge ------------------------------------------------------------------------------------


@final
class HttpJudge:
    """A `Judge` that POSTs to an OpenAI-style server (Responses or chat completions)."""

    def __init__(
        self,
        *,
        url: str,
        endpoint: str,
        api: str,
        create_params: Mapping[str, Any],
        token: str | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        keepalive_expiry: float = KEEPALIVE_EXPIRY_S,
        max_response_bytes: int = MAX_RESPONSE_BYTES,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self._url = httpx.URL(url)
        self._endpoint = endpoint
        self._path = self._url.path
        headers = {
            "content-type": "application/json",
            "accept": "application/json",
            # Judge replies are JSON on a fast network: compression buys nothing. A server that
            # compresses anyway is decoded (decode_content).
            "accept-encoding": "identity",
        }
        self._secret = token.encode() if token else None
        if token is not None:
            headers["authorization"] = f"Bearer {token}"
        self._headers: Final = headers
        # The request body and the reply's meaning are the API's; the rest is the same for both.
        self._api: Final = judge_api(api, create_params)
        self._pool: KeepAlivePool | None = None
        if transport is None:
            https = self._url.scheme == "https"
            self._pool = KeepAlivePool(
                self._url,
                ssl_context=(ssl_context or judge_ssl_context()) if https else None,
                keepalive_expiry=keepalive_expiry,
                max_response_bytes=max_response_bytes,
            )
            transport = self._pool
        self._transport: Final = transport
        # The built-in pool takes the request as (method, target, headers, body): the headers
        # are the same for every call but for the length.
        self._target: Final = self._url.raw_path
        self._header_list: Final = [(b"host", self._url.netloc)] + [
            (key.encode("ascii"), value.encode("latin-1")) for key, value in headers.items()
        ]
        self._closed = False
        self._in_flight = 0

    def __repr__(self) -> str:
        return f"HttpJudge({self._api.name}, {str(self._url)!r})"

    @property
    def endpoint(self) -> str:
        return self._endpoint

    @property
    def path(self) -> str:
        return self._path

    @property
    def url(self) -> str:
        return str(self._url)

    @property
    def in_flight(self) -> int:
        """Attempts between request start and reply (or failure) now."""
        return self._in_flight

    @property
    def open_connections(self) -> int:
        """Connections the built-in pool holds (0 with an injected transport)."""
        return 0 if self._pool is None else self._pool.connections

    async def attempt(self, call: JudgeCall) -> JudgeReply:
        """One POST: a classified reply, or JudgeTransportError / JudgeHTTPError / JudgeBadJSON."""
        if self._closed:
            raise RuntimeError("HttpJudge is closed")
        self._in_flight += 1
        try:
            if self._pool is not None:
                try:
                    status, raw_headers, body = await self._pool.exchange(self._request(call))
                except StaleConnectionError:
                    # Not answered, not an attempt: once more, on a new connection.
                    request = self._request(call)
                    status, raw_headers, body = await self._pool.exchange(request, fresh=True)
                retry_after = _raw_header(raw_headers, b"retry-after")
            else:
                content = json.dumps(self._api.body(call)).encode("ascii")
                status, body, retry_after = await self._send_httpx(content)
        except httpx.RequestError as exc:
            raise _transport_error(exc) from exc
        finally:
            self._in_flight -= 1
        if not 200 <= status <= 299:
            raise JudgeHTTPError(status, self._redact(body), parse_retry_after(retry_after))
        return self._api.interpret(_decode_json(body))

    def _request(self, call: JudgeCall) -> list[OutgoingRequest]:
        """`call`'s POST in a one-item list the pool empties once it is sent: with a 200 ms
        judge and 1,024 calls in flight, the prompt's bytes held again for the wait were ~6 MB.
        (So a resend builds it anew.)"""
        content = json.dumps(self._api.body(call)).encode("ascii")
        headers = [*self._header_list, (b"content-length", b"%d" % len(content))]
        return [(b"POST", self._target, headers, content)]

    def _redact(self, body: bytes) -> bytes:
        """An error body quoted in failure reasons and logs must not carry credentials: a judge
        or proxy that echoes the request's headers would otherwise leak the bearer token."""
        if self._secret:
            body = body.replace(self._secret, b"[redacted]")
        return _BEARER.sub(rb"\1[redacted]", body)

    async def _send_httpx(self, content: bytes) -> tuple[int, bytes, str | None]:
        """One exchange through an injected httpx transport."""
        request = httpx.Request("POST", self._url, content=content, headers=self._headers)
        response = await self._transport.handle_async_request(request)
        try:
            body = await response.aread()
        except BaseException:
            # bounded: closing the response drops its connection; one second caps it anyway
            with trio.CancelScope(shield=True, deadline=trio.current_time() + 1.0):
                await response.aclose()
            raise
        await response.aclose()
        return response.status_code, body, response.headers.get("retry-after")

    async def aclose(self) -> None:
        """Close the transport and its connections. Idempotent."""
        if not self._closed:
            self._closed = True
            await self._transport.aclose()


def make_http_judge(
    settings: Settings,
    *,
    transport: httpx.AsyncBaseTransport | None = None,
    base_url: str | None = None,
) -> HttpJudge:
    """The judge `settings.judge` describes (at `base_url`, one replica of a fleet, when given);
    `transport` replaces the network (tests)."""
    judge = settings.judge
    if base_url is None:
        if judge.base_url is not None and not isinstance(judge.base_url, str):
            raise ConfigError(
                "settings", "judge.base_url", "a list of URLs is a fleet: use make_judge"
            )
        base_url = judge.base_url
    if base_url is None:
        raise ConfigError("settings", "judge.base_url", "required for an HTTP judge")
    suffix = JUDGE_APIS[judge.api].path
    token = None
    if judge.api_key_env:
        token = read_secret(judge.api_key_env, key="judge.api_key_env")
    return HttpJudge(
        url=base_url.rstrip("/") + suffix,
        endpoint=endpoint_of(base_url),
        api=judge.api,
        create_params=settings.judge_create_params,
        token=token,
        transport=transport,
        keepalive_expiry=judge.keepalive_expiry_s,
        max_response_bytes=judge.max_response_bytes,
        ssl_context=judge_ssl_context(judge.ca_file) if base_url.startswith("https:") else None,
    )
