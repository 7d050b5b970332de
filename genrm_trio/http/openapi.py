"""`GET /openapi.json`: the reply models and the OpenAPI 3.1 document of every route, generated
from them and the request models of `http/schema.py` (docs/http-api.md).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Literal, final, get_type_hints

from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt, create_model
from pydantic.json_schema import models_json_schema

from genrm_trio.domain.checkpoint import RestoreReport
from genrm_trio.domain.model import CohortView, Unavailable
from genrm_trio.http.asgi import PUBLIC_PATHS
from genrm_trio.http.rows import FAILSAFE_REASON_LIMIT
from genrm_trio.http.schema import (
    AggregateMetricsRequest,
    CloseSessionRequest,
    CompareBody,
    SeedSessionRequest,
    VerifyBody,
)
from genrm_trio.judge.base import ReplicaStats

__all__ = ["openapi_document"]

# --- reply models (OpenAPI only) ----------------------------------------------------------------
#
# Replies are rendered without them (`http/rows.py`, the routes); these describe their shapes.


class VerifyRow(BaseModel):
    """HTTP 200 for a scored member (docs/http-api.md, "Scored member: 200")."""

    responses_create_params: dict[str, Any]
    response: dict[str, Any]
    reward: float
    mask_sample: Literal[False]
    failure_kind: None
    failure_reason: None
    reasoning_text: str
    answer_text: str
    reward_score_raw: float
    reward_rubric_aggregate_valid: float | None
    reward_overall_score_raw: float
    reward_overall_score: float
    reward_length_adjustment: float
    genrm_parse_failure_rate_per_group: float
    genrm_rubric_parse_failure_rate_per_group: float
    genrm_input_tokens_per_comparison_mean: float | None
    genrm_input_tokens_per_comparison_p50: float | None
    genrm_input_tokens_per_comparison_p95: float | None
    genrm_output_tokens_per_comparison_mean: float | None
    genrm_output_tokens_per_comparison_p50: float | None
    genrm_output_tokens_per_comparison_p95: float | None
    genrm_output_tokens_total_per_group: float | None
    genrm_max_output_tokens_hit_rate_per_group: float | None
    genrm_failed_comparison_rate_per_group: float
    genrm_masked_rollout_rate_per_group: float
    genrm_position_disagreement_rate_per_group: float | None = Field(
        default=None, description="Only under position_balance: alternate"
    )
    genrm_budget_escalation_rate_per_group: float | None = Field(
        default=None, description="Only with judge.budget_escalation set"
    )
    genrm_bradley_terry_log_likelihood_per_observation: float | None = Field(
        default=None, description="Only under aggregator_method: bradley_terry"
    )
    genrm_preference_cycle_rate_per_group: float | None = Field(
        default=None,
        description="Only under aggregator_method: bradley_terry, where decided triangles exist",
    )
    genrm_eager_comparison_rate_per_group: float | None = Field(
        default=None, description="Only with eager_comparisons (the default)"
    )
    ng_group_id: str | None = Field(alias="_ng_group_id")
    ng_group_attempt: int = Field(alias="_ng_group_attempt")
    ng_rollout_index: int | None = Field(alias="_ng_rollout_index")


class FailsafeRow(BaseModel):
    """HTTP 200 for a masked member or a judge-kind group failure (docs/http-api.md): the request
    dumped by alias (without `_ng_rollout_id`, extra keys kept) plus these keys."""

    model_config = ConfigDict(extra="allow")

    responses_create_params: dict[str, Any]
    response: dict[str, Any]
    principle: str | None
    prompt_id: str | None
    ng_task_index: int | None = Field(alias="_ng_task_index")
    ng_group_id: str | None = Field(alias="_ng_group_id")
    ng_group_attempt: int = Field(alias="_ng_group_attempt")
    ng_rollout_index: int | None = Field(alias="_ng_rollout_index")
    expected_rubric_ids: list[int] | None
    reward: float = Field(description="Always 0.0: a placeholder, never a score")
    mask_sample: Literal[True]
    failure_kind: Literal["judge_failed"]
    failure_reason: str = Field(max_length=FAILSAFE_REASON_LIMIT)
    instance_config: dict[str, Any]
    ng_failure_class: Literal["judge_failed"] = Field(alias="_ng_failure_class")
    ng_failure_judge_error: str = Field(alias="_ng_failure_judge_error")


class ComparisonResult(BaseModel):
    response_i: int
    response_j: int
    judge_idx: int
    score_1: float
    score_2: float
    ranking: float


class CompareReply(BaseModel):
    rewards: list[float]
    comparison_results: list[ComparisonResult] | None
    metrics: dict[str, float | None] | None


class ErrorDetail(BaseModel):
    """Every non-200 reply except 422 and 503."""

    detail: str


class UnavailableDetail(BaseModel):
    """A 503: the message, and its reason for programs (docs/http-api.md, "503 reasons")."""

    detail: str
    reason: Unavailable


class ValidationItem(BaseModel):
    type: str
    loc: list[str | int]
    msg: str


class ValidationErrorReply(BaseModel):
    """HTTP 422 for a body that is not JSON or does not match the schema."""

    detail: list[ValidationItem] | str


class SeedSessionResponse(BaseModel):
    resources_session_id: Any = Field(default=None, description="Only for the env-server form")


class CloseSessionResponse(BaseModel):
    resources_session_id: Any


class AggregateMetricsResponse(BaseModel):
    group_level_metrics: list[dict[str, StrictInt | StrictFloat]]
    agent_metrics: dict[str, StrictInt | StrictFloat]
    key_metrics: dict[str, StrictInt | StrictFloat]


class GroupSettingsResponse(BaseModel):
    """`GET /group_settings`: what a client needs to send a group and bound its wait."""

    num_rollouts_per_prompt: int
    cohort_collection_timeout_s: float
    cohort_evaluation_timeout_s: float


class HealthResponse(BaseModel):
    status: Literal["ok"]


# `GET /cohorts` renders `dataclasses.asdict(CohortView)`: its schema is derived from the
# dataclass itself, field by field, so the two cannot drift apart.
_COHORT_FIELDS: dict[str, Any] = {
    name: (hint, ...) for name, hint in get_type_hints(CohortView).items()
}
CohortInfo: type[BaseModel] = create_model("CohortInfo", **_COHORT_FIELDS)

# `POST /checkpoint` replies `domain/checkpoint.py`'s `report_body`: every `RestoreReport` field.
_RESTORE_FIELDS: dict[str, Any] = {
    name: (hint, ...) for name, hint in get_type_hints(RestoreReport).items()
}
RestoreReply: type[BaseModel] = create_model("RestoreReply", **_RESTORE_FIELDS)

# `GET /judge/replicas` renders `http/app.py`'s `replica_view`: every `ReplicaStats` field and the
# mean latency; derived from the dataclass the same way.
_REPLICA_FIELDS: dict[str, Any] = {
    name: (hint, ...) for name, hint in get_type_hints(ReplicaStats).items()
}
JudgeReplica: type[BaseModel] = create_model(
    "JudgeReplica",
    **_REPLICA_FIELDS,
    latency_mean_s=(
        float | None,
        Field(description="latency_sum_s / latency_count; null before the first finished attempt"),
    ),
)


_SCHEMA_MODELS: tuple[tuple[type[BaseModel], Literal["validation", "serialization"]], ...] = (
    (VerifyBody, "validation"),
    (VerifyRow, "serialization"),
    (FailsafeRow, "serialization"),
    (CompareBody, "validation"),
    (CompareReply, "serialization"),
    (ErrorDetail, "serialization"),
    (UnavailableDetail, "serialization"),
    (ValidationErrorReply, "serialization"),
    (SeedSessionRequest, "validation"),
    (SeedSessionResponse, "serialization"),
    (CloseSessionRequest, "validation"),
    (CloseSessionResponse, "serialization"),
    (AggregateMetricsRequest, "validation"),
    (AggregateMetricsResponse, "serialization"),
    (GroupSettingsResponse, "serialization"),
    (HealthResponse, "serialization"),
    (CohortInfo, "serialization"),
    (JudgeReplica, "serialization"),
    (RestoreReply, "serialization"),
)


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json_content(schema: Mapping[str, Any]) -> dict[str, Any]:
    return {"application/json": {"schema": dict(schema)}}


def _reply(description: str, schema: Mapping[str, Any]) -> dict[str, Any]:
    return {"description": description, "content": _json_content(schema)}


@final
class _Operations:
    """Builds the operations of one document: `ref` names a model's schema as
    `models_json_schema` named it; the responses every operation shares (404, and 401 when a
    token is required)."""

    def __init__(self, ref: Callable[[type[BaseModel]], dict[str, str]], *, auth: bool) -> None:
        self.ref = ref
        self.auth = auth
        self.plain = _reply("Error", self.ref(ErrorDetail))
        self.unavailable = _reply("Unavailable: see its reason", self.ref(UnavailableDetail))
        self.invalid = _reply("Invalid JSON or schema", self.ref(ValidationErrorReply))
        self.too_large = _reply("Request body exceeds server.max_body_bytes", self.ref(ErrorDetail))
        self.common: dict[str, Any] = {"404": _reply("Not Found", self.ref(ErrorDetail))}
        if auth:
            self.common["401"] = _reply("Missing or invalid bearer token", self.ref(ErrorDetail))

    def post(
        self, summary: str, body: type[BaseModel], ok: Mapping[str, Any], **extra: Any
    ) -> dict[str, Any]:
        responses: dict[str, Any] = {
            "200": _reply("OK", ok),
            "413": self.too_large,
            "422": self.invalid,
        }
        responses.update(extra)
        responses.update(self.common)
        return {
            "post": {
                "summary": summary,
                "requestBody": {"required": True, "content": _json_content(self.ref(body))},
                "responses": responses,
            }
        }

    def get(self, summary: str, ok: Mapping[str, Any], *, public: bool = False) -> dict[str, Any]:
        responses: dict[str, Any] = {"200": _reply("OK", ok)}
        if not public:
            responses.update(self.common)
        op: dict[str, Any] = {"summary": summary, "responses": responses}
        if public and self.auth:
            op["security"] = []
        return {"get": op}


def _reward_paths(ops: _Operations) -> dict[str, Any]:
    """The reward routes: /verify, /compare, the session no-ops, aggregates, reverify mode."""
    ref = ops.ref
    return {
        "/verify": ops.post(
            "Reward one rollout of a cohort (buffers until the group is complete)",
            VerifyBody,
            {"oneOf": [ref(VerifyRow), ref(FailsafeRow)]},
            **{"409": ops.plain, "503": ops.unavailable},
        ),
        "/compare": ops.post(
            "Judge a batch of answers pairwise",
            CompareBody,
            ref(CompareReply),
            **{"503": ops.unavailable},
        ),
        "/seed_session": ops.post(
            "No-op session seed", SeedSessionRequest, ref(SeedSessionResponse)
        ),
        "/close_session": ops.post(
            "No-op session close", CloseSessionRequest, ref(CloseSessionResponse)
        ),
        "/aggregate_metrics": ops.post(
            "Reward-profile statistics over verify rows",
            AggregateMetricsRequest,
            ref(AggregateMetricsResponse),
        ),
        "/reverify_mode": ops.get(
            'Always "unsupported"', {"type": "string", "const": "unsupported"}
        ),
    }


def _operator_paths(ops: _Operations) -> dict[str, Any]:
    """The operator's routes: cohorts, group settings, judge fleet, metrics, this document and
    checkpoints."""
    ref = ops.ref
    any_object: dict[str, Any] = {"type": "object"}
    export = ops.get("Checkpoint v1 export of terminal cohorts and watermarks", any_object)
    return {
        "/cohorts": ops.get(
            "Active cohorts, oldest first", {"type": "array", "items": ref(CohortInfo)}
        ),
        "/group_settings": ops.get(
            "The group size (num_rollouts_per_prompt) and the deadlines a group's wait is bound by",
            ref(GroupSettingsResponse),
        ),
        "/judge/replicas": ops.get(
            "Per-replica counters of the judge: one row per base URL ([] for a simulated judge)",
            {"type": "array", "items": ref(JudgeReplica)},
        ),
        "/metrics": {
            "get": {
                "summary": "Prometheus metrics",
                "responses": {
                    "200": {
                        "description": "OK",
                        "content": {"text/plain": {"schema": {"type": "string"}}},
                    },
                    **ops.common,
                },
            }
        },
        "/openapi.json": ops.get("This document", {"type": "object"}),
        "/checkpoint": {
            "get": export["get"],
            "post": {
                "summary": (
                    "Merge a checkpoint v1 body (added, unchanged, watermarks, superseded, "
                    "conflicts)"
                ),
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": any_object}},
                },
                "responses": {
                    "200": _reply("OK", ref(RestoreReply)),
                    "413": ops.too_large,
                    "422": _reply(
                        "An invalid checkpoint: nothing applied", ref(ValidationErrorReply)
                    ),
                    "503": ops.unavailable,
                    **ops.common,
                },
            },
        },
    }


def openapi_document(*, title: str, version: str, auth: bool) -> dict[str, Any]:
    """The OpenAPI 3.1 document of every route, generated from the models above."""
    keys, defs = models_json_schema(_SCHEMA_MODELS, ref_template="#/components/schemas/{model}")
    names = {model: schema["$ref"].rsplit("/", 1)[-1] for (model, _), schema in keys.items()}

    def ref(model: type[BaseModel]) -> dict[str, str]:
        return _ref(names[model])

    ops = _Operations(ref, auth=auth)
    paths = _reward_paths(ops) | _operator_paths(ops)
    health = ref(HealthResponse)
    for path in sorted(PUBLIC_PATHS):  # the paths the bearer check lets through
        paths[path] = ops.get("Liveness", health, public=True)

    doc: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {
            "title": title,
            "version": version,
            "description": (
                "GenRM pairwise-comparison rewards, wire-compatible with NeMo Gym's genrm_compare "
                "resources server. Every route is also served under /ng-rollout/{rollout_id}/."
            ),
        },
        "paths": paths,
        "components": {"schemas": defs.get("$defs", {})},
    }
    if auth:
        doc["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
        doc["security"] = [{"bearer": []}]
    return doc
