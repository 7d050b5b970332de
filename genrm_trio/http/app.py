"""The quart-trio application: Gym's resources-server routes over an engine (docs/http-api.md).

`create_app(engine, settings)` builds the app; the engine's lifetime belongs to the caller
(serve.py or a test). Per request the handler reads the body once, decodes it once, validates it
once and encodes the reply once. Every non-200 reply is `application/json` `{"detail": ...}`.
"""

from __future__ import annotations

import dataclasses
import hmac
import logging
import math
import re
import statistics
from collections.abc import Awaitable, Callable, Mapping
from contextvars import ContextVar
from typing import Any, Final, Protocol

import trio
from hypercorn.typing import (
    ASGIReceiveCallable,
    ASGIReceiveEvent,
    ASGISendCallable,
    ASGISendEvent,
    HTTPScope,
    Scope,
)
from quart import Response, request
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException, MethodNotAllowed

from genrm_trio import __version__
from genrm_trio.config import Settings, read_secret
from genrm_trio.domain.checkpoint import (
    CheckpointError,
    RecordsEngine,
    checkpoint,
    report_body,
    restore,
)
from genrm_trio.domain.codec import encode_json
from genrm_trio.domain.model import (
    CohortView,
    CompareFailed,
    CompareInput,
    CompareResult,
    GroupFailed,
    Masked,
    Rejection,
    RequestRejected,
    Scored,
    VerifyInput,
)
from genrm_trio.http.openapi import openapi_document
from genrm_trio.http.rows import HeldVerify
from genrm_trio.http.schema import (
    AggregateMetricsRequest,
    CloseSessionRequest,
    SeedSessionRequest,
    WireError,
    decode_body,
    error,
    parse_compare,
    parse_verify,
    validate,
)
from genrm_trio.judge.base import ReplicaStats
from genrm_trio.metrics import Metrics

__all__ = ["PUBLIC_PATHS", "EngineLike", "create_app", "current_rollout_id"]

log = logging.getLogger("genrm_trio.http")

current_rollout_id: ContextVar[str | None] = ContextVar("genrm_trio_rollout_id", default=None)
"""The rollout id of a `/ng-rollout/{id}/...` request, for the handler's context only."""

PUBLIC_PATHS = frozenset({"/", "/health", "/healthz", "/readyz", "/livez"})
_PREFIX = re.compile(r"/ng-rollout/([A-Za-z0-9][A-Za-z0-9._-]*)(/.*)?", re.DOTALL)
_JSON = "application/json"
_OK = b'{"status":"ok"}'
# The exposition format Metrics.render() produces; accepted by every Prometheus version.
_PROMETHEUS = "text/plain; version=0.0.4; charset=utf-8"
_AUTH_DETAIL = "missing or invalid bearer token"


class EngineLike(RecordsEngine, Protocol):
    """What the app needs of `genrm_trio.engine.engine.Engine` (checkpoints: `RecordsEngine`)."""

    @property
    def metrics(self) -> Metrics: ...

    async def verify(self, item: VerifyInput) -> Scored | Masked | GroupFailed: ...

    async def compare(self, item: CompareInput) -> CompareResult: ...

    def active_cohorts(self) -> list[CohortView]: ...

    def judge_replicas(self) -> list[ReplicaStats]: ...


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


_Reply = tuple[int, object, Mapping[str, str] | None]
"""What a route's core returns: status, JSON payload (or its encoding), extra headers."""
_Route = Callable[[bytes], Awaitable[_Reply]]
_Headers = list[tuple[bytes, bytes]]

BODY_TIMEOUT_S = 60.0  # the whole request body must arrive within this (408)
RESPONSE_TIMEOUT_S = 60.0  # sending a reply is given up after this


def error_reply(exc: Exception, method: str, path: str) -> _Reply:
    """The reply to what a request's handling raised, for every route (docs/http-api.md, "Errors").

    WireError → 422 with its list; RequestRejected → `rejection_status`; CompareFailed → 503;
    an HTTP error of the routing (404, 405 with `Allow`) → its status and name; anything else is a
    bug: 500 with a fixed body, and its traceback logged once (ERROR, `genrm_trio.http`).
    """
    if isinstance(exc, WireError):
        return 422, {"detail": exc.errors}, None
    if isinstance(exc, RequestRejected):
        status, headers = rejection_status(exc)
        return status, {"detail": exc.detail}, headers
    if isinstance(exc, CompareFailed):
        return 503, {"detail": exc.detail}, None
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


class _App(QuartTrio):
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
        expected = self.bearer_token
        if (
            expected is not None
            and path not in PUBLIC_PATHS
            and not _bearer_ok(authorization or "", expected)
        ):
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


def _number(value: Any) -> float | int | None:
    """A metric value for /aggregate_metrics: JSON numbers, not booleans."""
    if type(value) is int or type(value) is float:
        return value
    return None


def _describe(columns: Mapping[str, list[float | int]], into: dict[str, Any]) -> None:
    stats: dict[str, dict[str, Any]] = {"mean": {}, "max": {}, "min": {}, "median": {}, "std": {}}
    for key, values in columns.items():
        try:
            floats = [float(v) for v in values]
        except OverflowError:
            raise WireError(
                [error("number_too_large", ("verify_responses",), f"{key} does not fit a double")]
            ) from None
        stats["mean"][key] = math.fsum(floats) / len(floats)
        stats["max"][key] = max(values)
        stats["min"][key] = min(values)
        stats["median"][key] = statistics.median(floats)
        stats["std"][key] = statistics.stdev(floats) if len(floats) > 1 else 0.0
    for stat, per_key in stats.items():
        for key, value in per_key.items():
            into[f"{stat}/{key}"] = value


def aggregate_metrics(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Gym's reward-profile aggregation without masked rows (docs/http-api.md,
    "POST /aggregate_metrics")."""
    if not rows:
        return {"group_level_metrics": [], "agent_metrics": {}, "key_metrics": {}}
    overall: dict[str, list[float | int]] = {}
    per_task: dict[bytes, dict[str, list[float | int]]] = {}
    measured_tasks: set[bytes] = set()
    all_tasks: set[bytes] = set()
    task_values: dict[bytes, Any] = {}
    masked = 0
    for row in rows:
        task = row.get("_ng_task_index", 0)
        task_key = encode_json(task)  # any JSON value groups; equal values share a group
        task_values.setdefault(task_key, task)
        all_tasks.add(task_key)
        if row.get("mask_sample") is True:
            masked += 1
            continue
        measured_tasks.add(task_key)
        group = per_task.setdefault(task_key, {})
        for key, value in row.items():
            if key.startswith("_"):
                continue
            number = _number(value)
            if number is None:
                continue
            overall.setdefault(key, []).append(number)
            group.setdefault(key, []).append(number)
    agent: dict[str, Any] = {}
    _describe(overall, agent)
    if masked:
        agent["coverage/measured_rollouts"] = len(rows) - masked
        agent["coverage/masked_rollouts"] = masked
        agent["coverage/measured_tasks"] = len(measured_tasks)
        agent["coverage/fully_masked_tasks"] = len(all_tasks - measured_tasks)
    groups: list[dict[str, Any]] = []

    def order(task_key: bytes) -> tuple[int, float, bytes]:
        value = task_values[task_key]
        if type(value) is int or type(value) is float:
            return (0, value, b"")
        return (1, 0.0, task_key)

    for task_key in sorted(per_task, key=order):
        entry: dict[str, Any] = {"_ng_task_index": task_values[task_key]}
        _describe(per_task[task_key], entry)
        groups.append(entry)
    key_metrics = {k: v for k, v in agent.items() if k.startswith("mean/")}
    return {"group_level_metrics": groups, "agent_metrics": agent, "key_metrics": key_metrics}


def _reply(status: int, payload: object, headers: Mapping[str, str] | None = None) -> Response:
    """A Quart reply with a JSON payload."""
    return Response(
        encode_json(payload), status=status, headers=dict(headers or {}), content_type=_JSON
    )


def create_app(engine: EngineLike, settings: Settings) -> QuartTrio:
    """The HTTP application over `engine` (whose lifetime the caller owns).

    Reads the bearer token of `server.api_key_env` now: an unset or empty variable raises
    `ConfigError` naming it.
    """
    app = _App("genrm_trio")
    limit = settings.server.max_body_bytes
    # Quart never reads a body (_App serves every POST route) and its replies get _App's send
    # timeout, so its own body limit and timeouts are off.
    app.config.update(
        MAX_CONTENT_LENGTH=None,
        BODY_TIMEOUT=None,
        RESPONSE_TIMEOUT=None,
        PROVIDE_AUTOMATIC_OPTIONS=False,
    )
    debug = settings.debug_logging

    token: bytes | None = None
    if settings.server.api_key_env:
        secret = read_secret(settings.server.api_key_env, key="server.api_key_env")
        token = secret.encode("utf-8")
    app.bearer_token = token
    app.max_body_bytes = limit
    app.too_large_detail = f"request body exceeds {limit} bytes"

    # Errors of Quart's routes (its 404 and 405 included) get the same mapping as _App's.
    @app.errorhandler(HTTPException)
    @app.errorhandler(Exception)
    async def _error(exc: Exception) -> Response:
        return _reply(*error_reply(exc, request.method, request.path))

    # --- Gym routes (POST: served by _App from ASGI) ---------------------------------------

    async def verify_route(data: bytes) -> _Reply:
        parsed = parse_verify(decode_body(data))
        del data
        # While the request waits for its group it keeps only what its reply needs, encoded
        # (HeldVerify); the decoded body goes now.
        held = HeldVerify.of(parsed)
        pending = engine.verify(parsed.input)
        del parsed
        outcome = await pending
        row: object
        if type(outcome) is Scored:
            row = held.success_json(outcome)  # encoded already: the result is spliced
        elif type(outcome) is Masked:
            row = held.failsafe_row(outcome.reason)
        elif type(outcome) is GroupFailed and outcome.kind == "judge":
            row = held.failsafe_row(outcome.message)
        elif type(outcome) is GroupFailed:
            return 503, {"detail": outcome.message}, None
        else:
            raise TypeError(f"unexpected outcome {type(outcome).__name__}")
        if debug:
            # INFO, like the engine's debug_logging lines: the flag is the opt-in, and the
            # services (serve, Gym's app.py) log at INFO, where DEBUG records never showed.
            log.info(
                "verify task_index=%r group_id=%r rollout_index=%r -> %s",
                held.rest.get("_ng_task_index"),
                held.group_id,
                held.rollout_index,
                type(outcome).__name__,
            )
        return 200, row, None

    async def compare_route(data: bytes) -> _Reply:
        item = parse_compare(decode_body(data))
        if debug:
            log.info("compare: %d bytes, %d responses", len(data), len(item.responses))
        del data
        result = await engine.compare(item)
        if debug:
            log.info("compare rewards: %s", result.rewards)
        reply = {
            "rewards": result.rewards,
            "comparison_results": result.comparison_results,
            "metrics": result.metrics,
        }
        return 200, reply, None

    async def seed_session(data: bytes) -> _Reply:
        value = decode_body(data)
        validate(SeedSessionRequest, value)
        assert type(value) is dict
        if value.keys() == _ENV_SEED_KEYS:
            return 200, {"resources_session_id": value["resources_session_id"]}, None
        return 200, {}, None

    async def close_session(data: bytes) -> _Reply:
        value = decode_body(data)
        validate(CloseSessionRequest, value)
        assert type(value) is dict
        return 200, {"resources_session_id": value["resources_session_id"]}, None

    async def aggregate(data: bytes) -> _Reply:
        value = decode_body(data)
        validate(AggregateMetricsRequest, value)  # the rows are used as decoded, not copied
        assert type(value) is dict
        return 200, aggregate_metrics(value["verify_responses"]), None

    async def checkpoint_restore(data: bytes) -> _Reply:
        value = decode_body(data)
        try:
            report = await restore(engine, value, num_rollouts=settings.num_rollouts_per_prompt)
        except CheckpointError as exc:
            raise RequestRejected(Rejection.INVALID, exc.message) from None
        return 200, report_body(report), None

    app.post_routes.update(
        {
            "/verify": verify_route,
            "/compare": compare_route,
            "/seed_session": seed_session,
            "/close_session": close_session,
            "/aggregate_metrics": aggregate,
            "/checkpoint": checkpoint_restore,  # docs/durable-state.md, "Restore rules"
        }
    )

    # --- routes without a body (Quart) -----------------------------------------------------

    @app.get("/reverify_mode")
    async def reverify_mode() -> Response:
        return _reply(200, "unsupported")

    async def health() -> Response:
        return Response(_OK, status=200, content_type=_JSON)

    for path in sorted(PUBLIC_PATHS):
        app.add_url_rule(path, f"health{path}", health, methods=["GET"])

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(engine.metrics.render(), status=200, content_type=_PROMETHEUS)

    @app.get("/cohorts")
    async def cohorts() -> Response:
        return _reply(200, [dataclasses.asdict(view) for view in engine.active_cohorts()])

    @app.get("/judge/replicas")
    async def judge_replicas() -> Response:
        return _reply(
            200,
            [
                {
                    "replica": stats.replica,
                    "url": stats.url,
                    "calls": stats.calls,
                    "failures": stats.failures,
                    "in_flight": stats.in_flight,
                    "ejected": stats.ejected,
                    "ejections": stats.ejections,
                    "consecutive_failures": stats.consecutive_failures,
                    "back_in_s": stats.back_in_s,
                    "latency_mean_s": (
                        stats.latency_sum_s / stats.latency_count if stats.latency_count else None
                    ),
                    "last_error": stats.last_error,
                }
                for stats in engine.judge_replicas()
            ],
        )

    @app.get("/checkpoint")
    async def checkpoint_export() -> Response:
        return _reply(200, checkpoint(engine))

    openapi: list[bytes] = []

    @app.get("/openapi.json")
    async def openapi_json() -> Response:
        if not openapi:
            doc = openapi_document(title="genrm-trio", version=__version__, auth=token is not None)
            openapi.append(encode_json(doc))
        return Response(openapi[0], status=200, content_type=_JSON)

    return app


_ENV_SEED_KEYS = frozenset({"resources_session_id", "episode_id", "task_id", "task_data"})
