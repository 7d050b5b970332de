"""The quart-trio application: Gym's resources-server routes over an engine (docs/http-api.md).

`create_app(engine, settings)` builds the app on the ASGI layer of `http/asgi.py`; the engine's
lifetime belongs to the caller (app/serve.py or a test). Per request the handler reads the body
once, decodes it once, validates it once and encodes the reply once. Every non-200 reply is
`application/json` `{"detail": ...}`.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from typing import Protocol

from quart import Response, request
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException

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
from genrm_trio.domain.gym_metrics import NumberTooLarge, aggregate_metrics
from genrm_trio.domain.model import (
    CohortView,
    CompareInput,
    CompareResult,
    GroupFailed,
    Masked,
    Rejection,
    RequestRejected,
    Scored,
    VerifyInput,
)
from genrm_trio.http.asgi import PUBLIC_PATHS, App, Reply, error_reply
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
from genrm_trio.judge.answer_check import unread_fix
from genrm_trio.judge.base import ReplicaStats
from genrm_trio.metrics import Metrics

__all__ = ["EngineLike", "create_app"]

log = logging.getLogger("genrm_trio.http")

_JSON = "application/json"
_OK = b'{"status":"ok"}'
# The exposition format Metrics.render() produces; accepted by every Prometheus version.
_PROMETHEUS = "text/plain; version=0.0.4; charset=utf-8"


class EngineLike(RecordsEngine, Protocol):
    """What the app needs of `genrm_trio.engine.engine.Engine` (checkpoints: `RecordsEngine`)."""

    @property
    def metrics(self) -> Metrics: ...

    async def verify(self, item: VerifyInput) -> Scored | Masked | GroupFailed: ...

    async def compare(self, item: CompareInput) -> CompareResult: ...

    def active_cohorts(self) -> list[CohortView]: ...

    def judge_replicas(self) -> list[ReplicaStats]: ...

    def judge_unreachable(self) -> str | None:
        """Why the judge cannot be reached now, or None (`/readyz`)."""
        ...


def _reply(status: int, payload: object, headers: Mapping[str, str] | None = None) -> Response:
    """A Quart reply with a JSON payload."""
    return Response(
        encode_json(payload), status=status, headers=dict(headers or {}), content_type=_JSON
    )


def replica_view(stats: ReplicaStats) -> dict[str, object]:
    """One replica in `GET /judge/replicas`: every field of `ReplicaStats`, plus the mean
    latency (null before the first finished attempt)."""
    view: dict[str, object] = dataclasses.asdict(stats)
    view["latency_mean_s"] = (
        stats.latency_sum_s / stats.latency_count if stats.latency_count else None
    )
    return view


def not_ready_reason(replicas: Sequence[ReplicaStats], api: str) -> str | None:
    """Why `GET /readyz` answers 503, or None: a judge replica whose prompt tokens show that
    the judge does not read the answers (judge/answer_check.py), with the fix for `judge.api`."""
    for stats in replicas:
        if stats.answers_unread is not None:
            return (
                f"the judge does not read the answers (replica {stats.replica}): "
                f"{stats.answers_unread}. Fix: {unread_fix(api)}"
            )
    return None


def create_app(engine: EngineLike, settings: Settings) -> QuartTrio:
    """The HTTP application over `engine` (whose lifetime the caller owns).

    Reads the bearer token of `server.api_key_env` now: an unset or empty variable raises
    `ConfigError` naming it.
    """
    app = App("genrm_trio")
    limit = settings.server.max_body_bytes
    # Quart never reads a body (App serves every POST route) and its replies get App's send
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

    # Errors of Quart's routes (its 404 and 405 included) get the same mapping as App's.
    @app.errorhandler(HTTPException)
    @app.errorhandler(Exception)
    async def _error(exc: Exception) -> Response:
        return _reply(*error_reply(exc, request.method, request.path))

    # --- Gym routes (POST: served by App from ASGI) ----------------------------------------

    async def verify_route(data: bytes) -> Reply:
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

    async def compare_route(data: bytes) -> Reply:
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

    async def seed_session(data: bytes) -> Reply:
        value = decode_body(data)
        validate(SeedSessionRequest, value)
        assert type(value) is dict
        if value.keys() == _ENV_SEED_KEYS:
            return 200, {"resources_session_id": value["resources_session_id"]}, None
        return 200, {}, None

    async def close_session(data: bytes) -> Reply:
        value = decode_body(data)
        validate(CloseSessionRequest, value)
        assert type(value) is dict
        return 200, {"resources_session_id": value["resources_session_id"]}, None

    async def aggregate(data: bytes) -> Reply:
        value = decode_body(data)
        validate(AggregateMetricsRequest, value)  # the rows are used as decoded, not copied
        assert type(value) is dict
        try:
            reply = aggregate_metrics(value["verify_responses"])
        except NumberTooLarge as exc:  # the statistics are pure; the 422 item is HTTP's
            loc = ("verify_responses",)
            raise WireError([error("number_too_large", loc, str(exc))]) from None
        return 200, reply, None

    async def checkpoint_restore(data: bytes) -> Reply:
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

    async def ready() -> Response:
        # not ready while the judge does not read the answers, or while no judge replica can
        # be reached (comparisons wait for it): a load balancer may route around it
        reason = not_ready_reason(engine.judge_replicas(), settings.judge.api)
        if reason is None:
            reason = engine.judge_unreachable()
        if reason is None:
            return Response(_OK, status=200, content_type=_JSON)
        return _reply(503, {"status": "not ready", "reason": reason})

    for path in sorted(PUBLIC_PATHS):
        handler = ready if path == "/readyz" else health
        app.add_url_rule(path, f"health{path}", handler, methods=["GET"])

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(engine.metrics.render(), status=200, content_type=_PROMETHEUS)

    @app.get("/cohorts")
    async def cohorts() -> Response:
        return _reply(200, [dataclasses.asdict(view) for view in engine.active_cohorts()])

    @app.get("/judge/replicas")
    async def judge_replicas() -> Response:
        return _reply(200, [replica_view(stats) for stats in engine.judge_replicas()])

    # What a client needs to send a group (docs/http-api.md, "GET /group_settings"): its size
    # and the deadlines that bound the wait for its rewards.
    group_settings = {
        "num_rollouts_per_prompt": settings.num_rollouts_per_prompt,
        "cohort_collection_timeout_s": settings.cohort_collection_timeout_s,
        "cohort_evaluation_timeout_s": settings.cohort_evaluation_timeout_s,
    }

    @app.get("/group_settings")
    async def group_settings_route() -> Response:
        return _reply(200, group_settings)

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
