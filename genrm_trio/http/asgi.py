"""The one ASGI layer every request passes before any route (docs/http-api.md): the rollout
prefix, the bearer check, the body limit and timeouts, the disconnect watcher, the mapping of
errors to statuses, and the POST routes' hot path served straight from ASGI.

`App` is the quart-trio application with this layer in front; `http/app.py` registers the routes
on it.
"""

from __future__ import annotations

import hmac
import logging
import math
import re
from collections.abc import Awaitable, Callable, Mapping
from contextvars import ContextVar
from typing import Any, Final

import trio
from hypercorn.typing import (
    ASGIReceiveCallable,
    ASGIReceiveEvent,
    ASGISendCallable,
    ASGISendEvent,
    HTTPScope,
    Scope,
    WebsocketScope,
)
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException, MethodNotAllowed

from genrm_trio.domain.codec import encode_json
from genrm_trio.domain.model import CompareFailed, Rejection, RequestRejected
from genrm_trio.http.schema import WireError

__all__ = [
    "BODY_TIMEOUT_S",
    "PUBLIC_PATHS",
    "REJECTION_STATUS",
    "RESPONSE_TIMEOUT_S",
    "App",
    "Reply",
    "current_rollout_id",
    "error_reply",
    "rejection_status",
]

log = logging.getLogger("genrm_trio.http")

current_rollout_id: ContextVar[str | None] = ContextVar("genrm_trio_rollout_id", default=None)
"""The rollout id of a `/ng-rollout/{id}/...` request, for the handler's context only."""

PUBLIC_PATHS = frozenset({"/", "/health", "/healthz", "/readyz", "/livez"})
_PREFIX = re.compile(r"/ng-rollout/([A-Za-z0-9][A-Za-z0-9._-]*)(/.*)?", re.DOTALL)
_AUTH_DETAIL = "missing or invalid bearer token"
_WEBSOCKET_DETAIL = "no route speaks WebSocket"


REJECTION_STATUS: dict[Rejection, int] = {
    Rejection.INVALID: 422,
    Rejection.CONFLICT: 409,
    Rejection.UNAVAILABLE: 503,
}


def rejection_status(exc: RequestRejected) -> tuple[int, dict[str, str] | None]:
    """The HTTP status and headers of an engine rejection (docs/http-api.md, "Other statuses")."""
    headers = None
    if exc.retry_after_s is not None:
        headers = {"Retry-After": str(max(1, math.ceil(exc.retry_after_s)))}
    return REJECTION_STATUS[exc.reason], headers


Reply = tuple[int, object, Mapping[str, str] | None]
"""What a route's core returns: status, JSON payload (or its encoding), extra headers."""
_Route = Callable[[bytes], Awaitable[Reply]]
_Headers = list[tuple[bytes, bytes]]

BODY_TIMEOUT_S = 60.0  # the whole request body must arrive within this (408)
RESPONSE_TIMEOUT_S = 60.0  # sending a reply is given up after this


def error_reply(exc: Exception, method: str, path: str) -> Reply:
    """The reply to what a request's handling raised, for every route (docs/http-api.md, "Errors").

    WireError → 422 with its list; RequestRejected → `rejection_status`; CompareFailed → 503;
    an HTTP error of the routing (404, 405 with `Allow`) → its status and name; anything else is a
    bug: 500 with a fixed body, and its traceback logged once (ERROR, `genrm_trio.http`).
    """
    if isinstance(exc, WireError):
        return 422, {"detail": exc.errors}, None
    if isinstance(exc, RequestRejected):
        status, headers = rejection_status(exc)
        if exc.unavailable is None:
            return status, {"detail": exc.detail}, headers
        return status, {"detail": exc.detail, "reason": exc.unavailable}, headers
    if isinstance(exc, CompareFailed):
        return 503, {"detail": exc.detail, "reason": exc.reason}, None
    if isinstance(exc, HTTPException) and exc.code is not None:
        allow = None
        if isinstance(exc, MethodNotAllowed) and exc.valid_methods:
            allow = {"Allow": ", ".join(exc.valid_methods)}
        return exc.code, {"detail": exc.name}, allow
    log.error("internal error on %s %s", method, path, exc_info=exc)
    return 500, {"detail": "internal error"}, None


def _bearer_ok(header: str, expected: bytes) -> bool:
    """Whether an Authorization header value carries the expected bearer token."""
    scheme, _, given = header.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(
        given.strip().encode("latin-1", "replace"), expected
    )


def _json_headers(body: bytes, extra: Mapping[str, str] | None) -> _Headers:
    headers = [
        (key.lower().encode("latin-1"), value.encode("latin-1"))
        for key, value in (extra or {}).items()
    ]
    headers.append((b"content-type", b"application/json"))
    headers.append((b"content-length", b"%d" % len(body)))
    return headers


async def _watch_disconnect(receive: ASGIReceiveCallable, scope: trio.CancelScope) -> None:
    """Cancel the handler when the client goes away, as quart-trio does (docs/architecture.md,
    "How cancellation flows")."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            scope.cancel()
            return


_CLOSE: Final = (b"connection", b"close")


class App(QuartTrio):
    """The one HTTP layer in front of Quart: every request passes `asgi_app` first.

    It strips `/ng-rollout/{id}` and sets `current_rollout_id` (docs/http-api.md, "Rollout
    prefix"); checks the bearer token of every request except the health routes; serves every
    POST route (`post_routes`) straight from ASGI: the method check (405), the body limit (413),
    the body timeout (408), reading the body once, a watcher that cancels the handler when the
    client disconnects, the error mapping (`error_reply`) and the response send timeout. Quart
    serves only routes that take no body (GET and HEAD, its 404 and 405): it is handed no body
    (`_bodiless`), its errors go through `error_reply` too, and `_quart_send` gives its replies
    the same send timeout. A reply sent before an announced body was read carries
    `Connection: close`.

    Serving the POST routes without Quart's per-request machinery (werkzeug headers and routing,
    request and response objects, contexts, two tasks and a nursery per request) saves what
    profiling put at about a sixth of the server's CPU on `/verify`.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.post_routes: dict[str, _Route] = {}
        self.bearer_token: bytes | None = None
        self.max_body_bytes: int | None = None
        self.too_large_detail = "request body too large"
        self._allowed: dict[str, list[str]] = {}

    async def asgi_app(
        self, scope: Scope, receive: ASGIReceiveCallable, send: ASGISendCallable
    ) -> None:
        if scope["type"] == "websocket":
            await self._refuse_websocket(scope, receive, send)
            return
        if scope["type"] != "http":
            await super().asgi_app(scope, receive, send)
            return
        if scope["path"].startswith("/ng-rollout/"):
            match = _PREFIX.fullmatch(scope["path"])
            if match is not None:
                rest = match.group(2) or "/"
                stripped = dict(scope)
                stripped["path"] = rest
                raw_path = scope.get("raw_path")
                prefix = f"/ng-rollout/{match.group(1)}".encode("ascii")
                if isinstance(raw_path, bytes) and raw_path.startswith(prefix):
                    stripped["raw_path"] = raw_path[len(prefix) :] or b"/"
                else:
                    stripped["raw_path"] = rest.encode("utf-8", "replace")
                token = current_rollout_id.set(match.group(1))
                try:
                    await self._serve(stripped, receive, send)  # type: ignore[arg-type]
                finally:
                    current_rollout_id.reset(token)
                return
        await self._serve(scope, receive, send)

    def _unauthorized(self, path: str, authorization: str) -> bool:
        """Whether a request for `path` (its /ng-rollout prefix stripped) lacks the bearer token
        the server wants: every path but PUBLIC_PATHS, when `bearer_token` is set."""
        expected = self.bearer_token
        return (
            expected is not None
            and path not in PUBLIC_PATHS
            and not _bearer_ok(authorization, expected)
        )

    async def _refuse_websocket(
        self, scope: WebsocketScope, receive: ASGIReceiveCallable, send: ASGISendCallable
    ) -> None:
        """No route speaks WebSocket: an upgrade gets the bearer check every request gets (401),
        else 404, each with a JSON body (the ASGI denial response, which hypercorn sends as a
        plain HTTP reply), and is never handed to Quart, which answered 500 and logged a
        traceback per request."""
        match = _PREFIX.fullmatch(scope["path"])
        path = (match.group(2) or "/") if match is not None else scope["path"]
        authorization = next(
            (v.decode("latin-1") for k, v in scope["headers"] if k.lower() == b"authorization"),
            "",
        )
        if self._unauthorized(path, authorization):
            status, detail, extra = 401, _AUTH_DETAIL, {"WWW-Authenticate": "Bearer"}
        else:
            status, detail, extra = 404, _WEBSOCKET_DETAIL, None
        message = await receive()  # websocket.connect
        if message["type"] != "websocket.connect":
            return  # the client went away
        if "websocket.http.response" not in (scope.get("extensions") or {}):
            await send({"type": "websocket.close", "code": 1008, "reason": detail})
            return
        body = encode_json({"detail": detail})
        await send(
            {
                "type": "websocket.http.response.start",
                "status": status,
                "headers": _json_headers(body, extra),
            }
        )
        await send({"type": "websocket.http.response.body", "body": body, "more_body": False})

    async def _serve(
        self, scope: HTTPScope, receive: ASGIReceiveCallable, send: ASGISendCallable
    ) -> None:
        length: int | None = None
        chunked = False
        authorization: str | None = None
        for name, value in scope["headers"]:
            name = name.lower()
            if name == b"content-length":
                try:
                    length = int(value)
                except ValueError:
                    length = None
            elif name == b"transfer-encoding":
                chunked = b"chunked" in value.lower()
            elif name == b"authorization" and authorization is None:
                authorization = value.decode("latin-1")
        # A reply sent before an announced body was read closes the connection: hypercorn +
        # quart-trio may otherwise never answer the next request on it, and an unauthenticated
        # body is not worth reading.
        unread = length > 0 if length is not None else chunked
        path = scope["path"]
        if self._unauthorized(path, authorization or ""):
            detail = {"detail": _AUTH_DETAIL}
            await self._send(send, 401, detail, {"WWW-Authenticate": "Bearer"}, unread)
            return
        route = self.post_routes.get(path)
        if route is not None and scope["method"] != "POST":
            allowed = self._allowed_methods(path)
            if scope["method"] not in allowed:
                exc = MethodNotAllowed(valid_methods=allowed)
                await self._send(send, *error_reply(exc, scope["method"], path), unread)
                return
            route = None  # a method Quart serves on this path (GET /checkpoint)
        if route is None:
            await super().asgi_app(scope, _bodiless(receive), self._quart_send(send, unread))
            return
        limit = self.max_body_bytes
        too_large = {"detail": self.too_large_detail}
        if limit is not None and length is not None and length > limit:
            await self._send(send, 413, too_large, None, unread)
            return
        # The body travels in a one-item list that the route empties: no frame here keeps the
        # raw bytes alive while a /verify request waits for its group.
        box = await _receive_body(receive, limit, BODY_TIMEOUT_S)
        if type(box) is int:
            if box:
                detail = too_large if box == 413 else {"detail": "Request Timeout"}
                await self._send(send, box, detail, None, unread)
            return  # 0: the client went away, nothing to answer
        assert type(box) is list
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_watch_disconnect, receive, nursery.cancel_scope)
            status, body, headers = await self._run_route(route, box, scope)
            with trio.move_on_after(RESPONSE_TIMEOUT_S):
                await _send_raw(send, status, body, headers)
            nursery.cancel_scope.cancel()

    def _allowed_methods(self, path: str) -> list[str]:
        """Every method some route serves on `path`: POST and Quart's (HEAD with GET)."""
        allowed = self._allowed.get(path)
        if allowed is None:
            methods = {"POST"}
            for rule in self.url_map.iter_rules():
                if rule.rule == path:
                    methods |= rule.methods or set()
            allowed = self._allowed[path] = sorted(methods)
        return allowed

    async def _run_route(
        self, route: _Route, box: list[bytes], scope: HTTPScope
    ) -> tuple[int, bytes, _Headers]:
        """The route's reply, or `error_reply` for what it raised."""
        try:
            status, payload, extra = await route(box.pop())
            body = payload if type(payload) is bytes else encode_json(payload)
        except Exception as exc:
            status, payload, extra = error_reply(exc, scope["method"], scope["path"])
            body = encode_json(payload)
        return status, body, _json_headers(body, extra)

    async def _send(
        self,
        send: ASGISendCallable,
        status: int,
        payload: object,
        extra: Mapping[str, str] | None,
        unread: bool,
    ) -> None:
        """A JSON reply sent before the route ran (401, 405, 408, 413)."""
        body = encode_json(payload)
        headers = _json_headers(body, extra)
        if unread:
            headers.insert(len(headers) - 2, _CLOSE)
        with trio.move_on_after(RESPONSE_TIMEOUT_S):
            await _send_raw(send, status, body, headers)

    def _quart_send(self, send: ASGISendCallable, unread: bool) -> ASGISendCallable:
        """`send` for Quart: the response send timeout, and `Connection: close` if a body was
        announced (Quart never reads one). Quart's own RESPONSE_TIMEOUT is off."""
        deadline = math.inf
        expired = False

        async def quart_send(message: ASGISendEvent) -> None:
            nonlocal deadline, expired
            if message["type"] == "http.response.start":
                deadline = trio.current_time() + RESPONSE_TIMEOUT_S
                if unread:
                    message = {**message, "headers": [*message["headers"], _CLOSE]}
            if expired:
                return
            with trio.move_on_at(deadline) as timer:
                await send(message)
            expired = timer.cancelled_caught

        return quart_send


def _bodiless(receive: ASGIReceiveCallable) -> ASGIReceiveCallable:
    """`receive` for Quart's routes, which take no body: an empty body at once, then the real
    messages with their body chunks dropped unread, until the client disconnects."""
    given = False

    async def receive_no_body() -> ASGIReceiveEvent:
        nonlocal given
        if not given:
            given = True
            return {"type": "http.request", "body": b"", "more_body": False}
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return message

    return receive_no_body


async def _receive_body(
    receive: ASGIReceiveCallable, limit: int | None, within_s: float | None
) -> list[bytes] | int:
    """The request body in a one-item list; or 413 (over `limit`), 408 (not complete within
    `within_s`), 0 (the client disconnected)."""
    chunks: list[bytes] = []
    size = 0
    with trio.move_on_after(within_s or math.inf):
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return 0
            chunk: bytes = message.get("body", b"")  # type: ignore[assignment]
            size += len(chunk)
            if limit is not None and size > limit:
                return 413
            chunks.append(chunk)
            if not message.get("more_body", False):
                return [chunks[0] if len(chunks) == 1 else b"".join(chunks)]
    return 408


async def _send_raw(send: ASGISendCallable, status: int, body: bytes, headers: _Headers) -> None:
    await send(
        {"type": "http.response.start", "status": status, "headers": headers, "trailers": False}
    )
    await send({"type": "http.response.body", "body": body, "more_body": False})
