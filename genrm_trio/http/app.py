"""The quart-trio application: Gym's resources-server routes over an engine (docs/http-api.md).

`create_app(engine, settings)` builds the app on the ASGI layer of `http/asgi.py`; the engine's
lifetime belongs to the caller (app/serve.py or a test). Per request the handler reads the body
once, decodes it once, validates it once and encodes the reply once. Every non-200 reply is
`application/json` `{"detail": ...}`.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any, Final, Protocol, TypeVar, final

import trio
from quart import Response, request
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException

from genrm_trio import __version__
from genrm_trio.config import Settings, read_secret
from genrm_trio.domain.checkpoint import (
    CheckpointError,
    RecordsEngine,
    export_checkpoint,
    parse_checkpoint,
    report_body,
)
from genrm_trio.domain.codec import (
    encode_json,
    encode_json_in_steps,
    release_in_steps,
    values_at_most,
)
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
from genrm_trio.domain.records import TerminalRecord, WatermarkRecord
from genrm_trio.http.asgi import PUBLIC_PATHS, App, Reply, error_reply
from genrm_trio.http.openapi import openapi_document
from genrm_trio.http.rows import HeldVerify
from genrm_trio.http.schema import (
    CloseSessionRequest,
    SeedSessionRequest,
    WireError,
    decode_body,
    error,
    parse_aggregate_rows,
    parse_compare,
    parse_verify,
    split_verify_body,
    validate,
)
from genrm_trio.judge.answer_check import unread_fix
from genrm_trio.judge.base import ReplicaStats
from genrm_trio.judge.offload import score_off_loop, with_loop_turns
from genrm_trio.judge.prompt_check import PROMPT_FIX
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
    the judge does not read the answers (judge/answer_check.py), with the fix for `judge.api`,
    or that does not take the GenRM roles (judge/prompt_check.py)."""
    for stats in replicas:
        if stats.answers_unread is not None:
            return (
                f"the judge does not read the answers (replica {stats.replica}): "
                f"{stats.answers_unread}. Fix: {unread_fix(api)}"
            )
        if stats.roles_refused is not None:
            return (
                f"the judge does not take the GenRM roles (replica {stats.replica}): "
                f"{stats.roles_refused}. Fix: {PROMPT_FIX}"
            )
    return None


@final
class _Routes:
    """Every route's handler over one engine (created by `create_app`): the POST routes' cores,
    which `App` serves from ASGI (`Reply` in, a body's bytes out), and Quart's bodiless routes."""

    def __init__(self, engine: EngineLike, settings: Settings, token: bytes | None) -> None:
        self.engine = engine
        self.settings = settings
        self.debug = settings.debug_logging
        self.auth = token is not None
        # One large body, export or restore at a time is decoded in a worker thread: the loop
        # keeps answering (a 36 MiB body stalled every client for 9 s), and their decoded forms,
        # 25 times their bytes, do not add up (docs/reliability.md, "Security").
        self.offload = trio.CapacityLimiter(1)
        # What a client needs to send a group (docs/http-api.md, "GET /group_settings"): its
        # size and the deadlines that bound the wait for its rewards.
        self.group_settings = {
            "num_rollouts_per_prompt": settings.num_rollouts_per_prompt,
            "cohort_collection_timeout_s": settings.cohort_collection_timeout_s,
            "cohort_evaluation_timeout_s": settings.cohort_evaluation_timeout_s,
        }
        self.openapi: bytes | None = None

    # --- Gym routes (POST: served by App from ASGI) ----------------------------------------

    async def verify(self, data: bytes) -> Reply:
        # While the request waits for its group it keeps only what its reply needs, encoded
        # (HeldVerify); the decoded body goes now.
        if not _decodes_long(data):
            parsed = parse_verify(decode_body(data))
            held = HeldVerify.of(parsed)
            item = parsed.input
            del parsed
        else:
            item, held = await score_off_loop(partial(_off_loop, _held_verify, data), self.offload)
        del data
        task_index = item.task_index
        pending = self.engine.verify(item)
        del item
        outcome = await pending
        row: object
        if type(outcome) is Scored:
            row = held.success_json(outcome)  # encoded already: the result is spliced
        elif type(outcome) is Masked:
            row = await self._failsafe_row(held, outcome.reason)
        elif type(outcome) is GroupFailed and outcome.kind == "judge":
            row = await self._failsafe_row(held, outcome.message)
        elif type(outcome) is GroupFailed:
            return 503, {"detail": outcome.message, "reason": outcome.reason}, None
        else:
            raise TypeError(f"unexpected outcome {type(outcome).__name__}")
        if self.debug:
            # INFO, like the engine's debug_logging lines: the flag is the opt-in, and the
            # services (serve, Gym's app.py) log at INFO, where DEBUG records never showed.
            log.info(
                "verify task_index=%r group_id=%r rollout_index=%r -> %s",
                task_index,
                held.group_id,
                held.rollout_index,
                type(outcome).__name__,
            )
        return 200, row, None

    async def _failsafe_row(self, held: HeldVerify, message: str) -> object:
        if not held.packed:
            return held.failsafe_row(message)
        work = partial(_off_loop, held.failsafe_json_in_steps, message)
        return await score_off_loop(work, self.offload)

    async def compare(self, data: bytes) -> Reply:
        most = self.settings.server.max_compare_responses
        if not _decodes_long(data):
            item = parse_compare(decode_body(data), max_responses=most)
        else:
            work = partial(_off_loop, _parsed_compare, data, most)
            item = await score_off_loop(work, self.offload)
        if self.debug:
            log.info("compare: %d bytes, %d responses", len(data), len(item.responses))
        del data
        result = await self.engine.compare(item)
        if self.debug:
            log.info("compare rewards: %s", result.rewards)
        reply = {
            "rewards": result.rewards,
            "comparison_results": result.comparison_results,
            "metrics": result.metrics,
        }
        return 200, reply, None

    async def seed_session(self, data: bytes) -> Reply:
        value = decode_body(data)
        validate(SeedSessionRequest, value)
        assert type(value) is dict
        if value.keys() == _ENV_SEED_KEYS:
            return 200, {"resources_session_id": value["resources_session_id"]}, None
        return 200, {}, None

    async def close_session(self, data: bytes) -> Reply:
        value = decode_body(data)
        validate(CloseSessionRequest, value)
        assert type(value) is dict
        return 200, {"resources_session_id": value["resources_session_id"]}, None

    async def aggregate(self, data: bytes) -> Reply:
        reply = await score_off_loop(partial(_off_loop, _aggregate_reply, data), self.offload)
        return 200, reply, None

    async def checkpoint_restore(self, data: bytes) -> Reply:
        n = self.settings.num_rollouts_per_prompt
        try:
            records, marks = await score_off_loop(
                partial(_off_loop, _parsed_checkpoint, data, n), self.offload
            )
        except CheckpointError as exc:
            raise RequestRejected(Rejection.INVALID, exc.message) from None
        del data
        report = await self.engine.restore_records(records, marks)
        return 200, report_body(report), None

    # --- routes without a body (Quart) -----------------------------------------------------

    async def error(self, exc: Exception) -> Response:
        # Errors of Quart's routes (its 404 and 405 included) get the same mapping as App's.
        return _reply(*error_reply(exc, request.method, request.path))

    async def reverify_mode(self) -> Response:
        return _reply(200, "unsupported")

    async def health(self) -> Response:
        return Response(_OK, status=200, content_type=_JSON)

    async def ready(self) -> Response:
        # not ready while the judge does not read the answers, or while no judge replica can
        # be reached (comparisons wait for it): a load balancer may route around it
        reason = not_ready_reason(self.engine.judge_replicas(), self.settings.judge.api)
        if reason is None:
            reason = self.engine.judge_unreachable()
        if reason is None:
            return Response(_OK, status=200, content_type=_JSON)
        return _reply(503, {"status": "not ready", "reason": reason})

    async def metrics(self) -> Response:
        return Response(self.engine.metrics.render(), status=200, content_type=_PROMETHEUS)

    async def cohorts(self) -> Response:
        return _reply(200, [dataclasses.asdict(view) for view in self.engine.active_cohorts()])

    async def judge_replicas(self) -> Response:
        return _reply(200, [replica_view(stats) for stats in self.engine.judge_replicas()])

    async def group_settings_route(self) -> Response:
        return _reply(200, self.group_settings)

    async def checkpoint_export(self) -> Response:
        # the records are immutable: read here, unpacked and encoded in the thread
        records, marks = self.engine.terminal_records(), self.engine.watermark_records()
        work = partial(_off_loop, _export_json, records, marks)
        return Response(await score_off_loop(work, self.offload), status=200, content_type=_JSON)

    async def openapi_json(self) -> Response:
        if self.openapi is None:
            doc = openapi_document(title="genrm-trio", version=__version__, auth=self.auth)
            self.openapi = encode_json(doc)
        return Response(self.openapi, status=200, content_type=_JSON)


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
    token: bytes | None = None
    if settings.server.api_key_env:
        secret = read_secret(settings.server.api_key_env, key="server.api_key_env")
        token = secret.encode("utf-8")
    app.bearer_token = token
    app.max_body_bytes = limit
    app.too_large_detail = f"request body exceeds {limit} bytes"

    routes = _Routes(engine, settings, token)
    app.register_error_handler(HTTPException, routes.error)
    app.register_error_handler(Exception, routes.error)
    app.post_routes.update(
        {
            "/verify": routes.verify,
            "/compare": routes.compare,
            "/seed_session": routes.seed_session,
            "/close_session": routes.close_session,
            "/aggregate_metrics": routes.aggregate,
            "/checkpoint": routes.checkpoint_restore,  # docs/durable-state.md, "Restore rules"
        }
    )
    for path in sorted(PUBLIC_PATHS):
        handler = routes.ready if path == "/readyz" else routes.health
        app.add_url_rule(path, f"health{path}", handler, methods=["GET"])
    for path, handler in (
        ("/reverify_mode", routes.reverify_mode),
        ("/metrics", routes.metrics),
        ("/cohorts", routes.cohorts),
        ("/judge/replicas", routes.judge_replicas),
        ("/group_settings", routes.group_settings_route),
        ("/checkpoint", routes.checkpoint_export),
        ("/openapi.json", routes.openapi_json),
    ):
        app.add_url_rule(path, handler.__name__, handler, methods=["GET"])
    return app


OFF_LOOP_VALUES: Final = 100_000
"""A `/verify` or `/compare` body with more JSON values than this (an upper bound from its
separators, `values_at_most`) is decoded and validated (a `/verify` also held: `HeldVerify`, its
extra keys compressed) in a worker thread. Decoding costs about 0.1-0.2 µs per value and
1 ns per byte of string: an agent's body of a few hundred values, or one with a megabyte-long
answer, takes well under a millisecond on the loop, and one at this bound about 10-20 ms."""

OFF_LOOP_BODY_BYTES: Final = 16 << 20
"""Any body from this size (16 MiB) is decoded off the loop, whatever it holds."""

_COUNTED_FROM: Final = 64 * 1024
"""Smaller bodies cannot hold OFF_LOOP_VALUES values and are not counted."""


def _decodes_long(data: bytes) -> bool:
    """Whether decoding `data` could hold the loop for more than a few milliseconds."""
    if len(data) < _COUNTED_FROM:
        return False
    return len(data) >= OFF_LOOP_BODY_BYTES or values_at_most(data) > OFF_LOOP_VALUES


_T = TypeVar("_T")


def _off_loop(work: Callable[..., _T], *args: Any) -> _T:
    """`work(*args)` in the worker thread, leaving every decoded value there: an error is
    re-raised without the traceback whose frames hold the decoded body, so that its (possibly
    millions of) objects are freed in the thread, not by the loop."""
    try:
        return work(*args)
    except Exception as exc:
        raise exc.with_traceback(None) from None


def _held_verify(data: bytes) -> tuple[VerifyInput, HeldVerify]:
    """What a waiting `/verify` keeps: its declared keys are decoded, its other keys packed as
    they are read and freed in the thread (`split_verify_body`)."""
    declared, packed_rest = split_verify_body(data)
    parsed = parse_verify(declared)
    return parsed.input, HeldVerify.of(parsed, packed_rest=packed_rest)


def _parsed_compare(data: bytes, max_responses: int) -> CompareInput:
    return parse_compare(decode_body(data, in_steps=True), max_responses=max_responses)


def _aggregate_reply(data: bytes) -> bytes:
    """The encoded `/aggregate_metrics` reply (pure: run off the loop)."""
    value = decode_body(data, in_steps=True)
    rows = parse_aggregate_rows(value)  # the rows are used as decoded, not copied
    try:
        reply = aggregate_metrics(rows)
    except NumberTooLarge as exc:  # the statistics are pure; the 422 item is HTTP's
        loc = ("verify_responses",)
        raise WireError([error("number_too_large", loc, str(exc))]) from None
    finally:
        release_in_steps(value)
    return encode_json(reply)


def _parsed_checkpoint(
    data: bytes, num_rollouts: int
) -> tuple[list[TerminalRecord], list[WatermarkRecord]]:
    value = decode_body(data, in_steps=True)
    try:
        records, marks = parse_checkpoint(value, num_rollouts=num_rollouts)
    finally:
        release_in_steps(value)  # the records hold copies (packed results, strings)
    # packed here, as the registry holds them: on the loop, comparing 2,000 unpacked records
    # with the retained ones unpacked each (137 ms); packed ones compare by their bytes
    return [record.compacted() for record in with_loop_turns(records)], marks


def _export_json(records: list[TerminalRecord], marks: list[WatermarkRecord]) -> bytes:
    # a cohort at a time: the whole document by one call held the GIL for 66 ms at 2,000 groups
    return encode_json_in_steps(export_checkpoint(with_loop_turns(records), marks))


_ENV_SEED_KEYS = frozenset({"resources_session_id", "episode_id", "task_id", "task_data"})
