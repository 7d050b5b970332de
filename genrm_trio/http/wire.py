"""The wire: request decoding and validation, row rendering and reply encoding (docs/http-api.md).

The hot path works on the decoded JSON value directly: one UTF-8 decode, one `json` parse, one
`model_validate` of the request model over it (the declared top-level fields and the message
items of `input`), one encode of the reply. The request models are the only statement of the
request shapes: they validate, and `/openapi.json` is generated from them together with the
reply models at the end. Echoed values and the engine inputs are the received objects
themselves, never copies. Everything inside `response` and inside the values of
`responses_create_params` is opaque.
"""

from __future__ import annotations

import json
import math
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from itertools import accumulate
from typing import Annotated, Any, Final, Literal, NoReturn, TypeVar, final

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    StrictFloat,
    StrictInt,
    StrictStr,
    Tag,
    ValidationError,
)
from pydantic.json_schema import models_json_schema

from genrm_trio.domain.model import CompareInput, JSONValue, Scored, VerifyInput
from genrm_trio.domain.records import compact_json, compressed, result_dict, result_json

__all__ = [
    "FAILSAFE_REASON_LIMIT",
    "MAX_DEPTH",
    "ROLES",
    "HeldVerify",
    "VerifyRequest",
    "WireError",
    "decode_json",
    "encode_json",
    "error",
    "failsafe_row",
    "openapi_document",
    "parse_compare",
    "parse_verify",
    "success_row",
    "validate",
]

MAX_DEPTH = 512  # deepest accepted nesting of arrays and objects (docs/http-api.md, "422 lists")
FAILSAFE_REASON_LIMIT = 2000  # failure_reason is cut to this many characters (docs/http-api.md)
MAX_ERRORS = 64  # a 422 lists at most this many problems
ROLES = frozenset({"user", "assistant", "system", "developer"})

Loc = tuple[str | int, ...]


@final
class WireError(Exception):
    """A request the wire refuses: rendered as HTTP 422 `{"detail": errors}`."""

    def __init__(self, errors: list[dict[str, Any]]) -> None:
        super().__init__(errors[0]["msg"] if errors else "invalid request")
        self.errors = errors


def error(kind: str, loc: Loc, msg: str) -> dict[str, Any]:
    """One 422 item: `{"type", "loc", "msg"}` (input values are never echoed)."""
    return {"type": kind, "loc": ["body", *loc], "msg": msg}


# --- decoding -----------------------------------------------------------------------------------


def _reject_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not valid JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError("number out of range")
    return value


# Every float goes through `_finite_float` (about 0.4 µs each): 1e400 must be refused, not
# turned into inf, and a scan of the text that could skip the hook costs as much as it saves.
_DECODER = json.JSONDecoder(parse_constant=_reject_constant, parse_float=_finite_float)
# Depth scan: structural bytes only, brackets as signed steps (+1 open, -1 close).
_STRUCTURE = bytes(b for b in range(256) if b not in b'[]{}"')
_STEPS = bytes.maketrans(b"[{]}", b"\x01\x01\xff\xff")


def _too_deep(raw: bytes) -> bool:
    """Whether arrays/objects nest deeper than MAX_DEPTH, brackets inside strings ignored.

    Exact for valid JSON (escapes are removed before strings are cut out); for invalid JSON the
    answer does not matter, the parser rejects it anyway. Only C-level bytes operations, plus a
    C-level running sum over the brackets outside strings.
    """
    if raw.count(b"[") + raw.count(b"{") <= MAX_DEPTH:
        return False
    unescaped = raw.replace(b"\\\\", b"").replace(b'\\"', b"") if b"\\" in raw else raw
    outside = b"".join(unescaped.translate(None, _STRUCTURE).split(b'"')[::2])
    if len(outside) <= MAX_DEPTH:
        return False
    steps = memoryview(outside.translate(_STEPS)).cast("b")
    return max(accumulate(steps)) > MAX_DEPTH


def _json_invalid(msg: str) -> WireError:
    return WireError([error("json_invalid", (), msg)])


def decode_json(body: bytes | bytearray) -> JSONValue:
    """One RFC 8259 JSON value from a request body, with Python `json` string semantics.

    Raises WireError (`json_invalid`) for invalid UTF-8, truncated or trailing data, NaN/Infinity
    literals, numbers that overflow a double or exceed Python's integer digit limit, and nesting
    deeper than 512. Escaped lone surrogates are accepted; duplicate keys: the last one wins.
    """
    raw = body if type(body) is bytes else bytes(body)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _json_invalid(f"JSON decode error: invalid UTF-8 at byte {exc.start}") from None
    if _too_deep(raw):
        raise _json_invalid(f"JSON decode error: nesting deeper than {MAX_DEPTH} levels")
    try:
        return _DECODER.decode(text)
    except json.JSONDecodeError as exc:
        raise _json_invalid(f"JSON decode error: {exc.msg} at position {exc.pos}") from None
    except RecursionError:
        raise _json_invalid("JSON decode error: nesting too deep") from None
    except ValueError as exc:
        raise _json_invalid(f"JSON decode error: {exc}") from None


# --- encoding -----------------------------------------------------------------------------------


def encode_json(value: JSONValue) -> bytes:
    """ASCII-safe compact JSON; lone surrogates become `\\uXXXX` escapes.

    Raises ValueError for NaN/Infinity: the engine never produces them, so that is a bug (500).
    """
    return compact_json(value).encode("ascii")


# --- request validation -------------------------------------------------------------------------
#
# The request models are the one statement of what a body must look like: `parse_*` run them on
# the decoded value and `/openapi.json` is generated from them. Open values are `Any` or
# `dict[str, Any]`, so validation never traverses them; pydantic copies the containers it
# validates (the `input` list, message items, `response`), so the engine inputs take their values
# from the decoded body afterwards, never from the model.

Role = Literal["user", "assistant", "system", "developer"]


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


def _str_or_list(value: Any) -> str | None:
    kind = type(value)
    return "str" if kind is str else "list" if kind is list else None


_STR_OR_LIST_MSG = "Input should be a valid string or a list of objects"

# A message's `content`: a JSON string or a list of objects, one `content_type` error otherwise.
MessageContent = Annotated[
    Annotated[StrictStr, Tag("str")] | Annotated[list[dict[str, Any]], Tag("list")],
    Discriminator(
        _str_or_list, custom_error_type="content_type", custom_error_message=_STR_OR_LIST_MSG
    ),
]


class MessageItem(_Open):
    """An `input` item whose `type` is "message" or absent. Other keys are opaque."""

    type: Literal["message"] | None = None
    role: Role
    content: MessageContent


def _item_kind(value: Any) -> str:
    if type(value) is dict:
        return "message" if value.get("type", "message") == "message" else "other"
    return "other"


InputItem = Annotated[
    Annotated[MessageItem, Tag("message")] | Annotated[dict[str, Any], Tag("other")],
    Discriminator(_item_kind),
]
# `input`: a JSON string or a list of items, one `input_type` error otherwise.
PromptInput = Annotated[
    Annotated[StrictStr, Tag("str")] | Annotated[list[InputItem], Tag("list")],
    Discriminator(
        _str_or_list, custom_error_type="input_type", custom_error_message=_STR_OR_LIST_MSG
    ),
]


class ResponsesCreateParams(BaseModel):
    """Responses API create params as Gym's agent sends them; only `input` is required and only
    `input` and `metadata` are read. Values other than `input` are opaque."""

    model_config = ConfigDict(extra="forbid")

    input: PromptInput
    background: Any = None
    context_management: Any = None
    conversation: Any = None
    include: Any = None
    instructions: Any = None
    max_output_tokens: Any = None
    max_tool_calls: Any = None
    metadata: Any = None
    model: Any = None
    moderation: Any = None
    parallel_tool_calls: Any = None
    previous_response_id: Any = None
    prompt: Any = None
    prompt_cache_key: Any = None
    prompt_cache_retention: Any = None
    reasoning: Any = None
    safety_identifier: Any = None
    service_tier: Any = None
    store: Any = None
    stream: Any = None
    stream_options: Any = None
    temperature: Any = None
    text: Any = None
    tool_choice: Any = None
    tools: Any = None
    top_logprobs: Any = None
    top_p: Any = None
    truncation: Any = None
    user: Any = None


def _alias(alias: str, name: str) -> Any:
    return Field(
        default=None,
        validation_alias=AliasChoices(alias, name),
        serialization_alias=alias,
    )


class VerifyBody(_Open):
    """`POST /verify` body. Aliased fields accept the wire name or the field name (the wire name
    wins when both are sent); any other key is accepted and echoed only in failsafe rows."""

    model_config = ConfigDict(extra="allow")

    responses_create_params: ResponsesCreateParams
    response: dict[str, Any] = Field(description="The policy's Responses API response object")
    principle: StrictStr | None = None
    prompt_id: StrictStr | None = None
    task_index: StrictInt | None = _alias("_ng_task_index", "task_index")
    group_id: StrictStr | None = _alias("_ng_group_id", "group_id")
    group_attempt: StrictInt = Field(
        default=0,
        ge=0,
        validation_alias=AliasChoices("_ng_group_attempt", "group_attempt"),
        serialization_alias="_ng_group_attempt",
    )
    rollout_index: StrictInt | None = _alias("_ng_rollout_index", "rollout_index")
    capture_rollout_id: StrictStr | None = Field(
        default=None,
        validation_alias=AliasChoices("_ng_rollout_id", "capture_rollout_id"),
        serialization_alias="_ng_rollout_id",
        description="Capture identity; never echoed",
    )
    expected_rubric_ids: list[StrictInt] | None = None


class HistoryMessage(_Open):
    role: Role
    content: StrictStr


class CompareBody(BaseModel):
    """`POST /compare` body; undeclared keys are ignored."""

    conversation_history: list[HistoryMessage]
    response_objs: list[dict[str, Any]]
    principle: StrictStr | None = None
    expected_rubric_ids: list[StrictInt] | None = None


class SeedSessionRequest(_Open):
    """Any JSON object (the agent's row); exactly these four keys select the env-server form."""

    resources_session_id: Any = None
    episode_id: Any = None
    task_id: Any = None
    task_data: Any = None


class CloseSessionRequest(_Open):
    resources_session_id: Any
    episode_id: Any


class AggregateMetricsRequest(BaseModel):
    verify_responses: list[dict[str, Any]]


# Every declared /verify field, wire name (alias) → field name (docs/http-api.md, "Request").
VERIFY_FIELDS: dict[str, str] = {
    (field.serialization_alias or name): name for name, field in VerifyBody.model_fields.items()
}
_NAME_TO_ALIAS = {name: alias for alias, name in VERIFY_FIELDS.items() if name != alias}
# Failsafe dump order: every declared field by alias except `_ng_rollout_id` (docs/http-api.md,
# "Masked member or judge failure: 200 failsafe row").
_DUMP_FIELDS: tuple[str, ...] = (
    "responses_create_params",
    "response",
    "principle",
    "prompt_id",
    "_ng_task_index",
    "_ng_group_id",
    "_ng_group_attempt",
    "_ng_rollout_index",
    "expected_rubric_ids",
)
_CAPTURE_KEYS = frozenset({"_ng_rollout_id", "capture_rollout_id"})


def _wire_loc(loc: tuple[str | int, ...]) -> Loc:
    """A pydantic error location as the key path of the body: without union tags.

    A tagged union puts its tag after its own location. The only ones are in the create params:
    `input` (str | list), each item of its list (message | other) and a message's `content`
    (str | list): ``(rcp, "input", "list", 3, "message", "content", "list", 0)`` is
    ``(rcp, "input", 3, "content", 0)``.
    """
    if len(loc) < 3 or loc[0] != "responses_create_params" or loc[1] != "input":
        return loc
    rest = loc[3:]
    if len(rest) > 1:
        rest = (rest[0], *rest[2:])
    if len(rest) > 2 and rest[1] == "content":
        rest = (*rest[:2], *rest[3:])
    return (*loc[:2], *rest)


def _rank(model: type[BaseModel]) -> dict[str | int, int]:
    """Declaration rank of each top-level key (field name and aliases) of `model`."""
    ranks: dict[str | int, int] = {}
    for rank, (name, field) in enumerate(model.model_fields.items()):
        ranks[name] = rank
        if isinstance(field.validation_alias, AliasChoices):
            for choice in field.validation_alias.choices:
                if isinstance(choice, str):
                    ranks[choice] = rank
    return ranks


_RANKS: dict[type[BaseModel], dict[str | int, int]] = {}


def _wire_errors(model: type[BaseModel], exc: ValidationError) -> list[dict[str, Any]]:
    """pydantic's errors as 422 items: wire types and messages, key paths, at most MAX_ERRORS.

    A value that should be an object is `dict_type` (pydantic says `model_type` for a model).
    Order: by top-level field, and within `responses_create_params` its undeclared keys first,
    then `input` (pydantic reports a model's extra keys after its fields).
    """
    ranks = _RANKS.get(model)
    if ranks is None:
        ranks = _RANKS[model] = _rank(model)
    items: list[tuple[int, bool, dict[str, Any]]] = []
    for found in exc.errors(include_url=False, include_context=False, include_input=False):
        kind = found["type"]
        msg = found["msg"]
        loc = found["loc"]
        if kind == "model_type":
            kind, msg = "dict_type", "Input should be a valid dictionary"
        rank = ranks.get(loc[0], -1) if loc else -1
        items.append((rank, kind != "extra_forbidden", error(kind, _wire_loc(loc), msg)))
    items.sort(key=lambda item: item[:2])
    return [item for _, _, item in items[:MAX_ERRORS]]


_M = TypeVar("_M", bound=BaseModel)


def validate(model: type[_M], value: JSONValue) -> _M:
    """`model.model_validate(value)`, or WireError with the 422 items of what is wrong."""
    try:
        # model_validate without its Python wrapper (0.4 µs of the ~6 µs of a /verify body)
        validated: _M = model.__pydantic_validator__.validate_python(value)
        return validated
    except ValidationError as exc:
        raise WireError(_wire_errors(model, exc)) from None


def _rubric_ids(value: list[int] | None) -> tuple[int, ...] | None:
    return None if value is None else tuple(sorted(set(value)))


@final
@dataclass(frozen=True, slots=True)
class VerifyRequest:
    """A validated `/verify` body: the decoded object (for echoes) and the engine's input."""

    body: dict[str, Any]
    input: VerifyInput


def parse_verify(value: JSONValue) -> VerifyRequest:
    """Validate a decoded `/verify` body (docs/http-api.md, "Request", "Errors") or raise
    WireError.

    `input`, `response` and `metadata` of the engine input are the decoded objects themselves.
    """
    model = validate(VerifyBody, value)
    assert type(value) is dict
    rcp = value["responses_create_params"]
    metadata = rcp.get("metadata")
    return VerifyRequest(
        body=value,
        input=VerifyInput(
            input=rcp["input"],
            response=value["response"],
            principle=model.principle,
            metadata=metadata if type(metadata) is dict else None,
            task_index=model.task_index,
            group_id=model.group_id,
            group_attempt=model.group_attempt,
            group_attempt_given="group_attempt" in model.model_fields_set,
            rollout_index=model.rollout_index,
            prompt_id=model.prompt_id,
            expected_rubric_ids=_rubric_ids(model.expected_rubric_ids),
        ),
    )


def parse_compare(value: JSONValue) -> CompareInput:
    """Validate a decoded `/compare` body (docs/http-api.md, "POST /compare") or raise WireError.

    Undeclared top-level keys are ignored; `history` and `responses` are the decoded lists.
    """
    model = validate(CompareBody, value)
    assert type(value) is dict
    return CompareInput(
        history=value["conversation_history"],
        responses=value["response_objs"],
        principle=model.principle,
        expected_rubric_ids=_rubric_ids(model.expected_rubric_ids),
    )


# --- rows ---------------------------------------------------------------------------------------


def success_row(request: VerifyRequest, outcome: Scored) -> dict[str, JSONValue]:
    """The scored `/verify` row (docs/http-api.md, "Scored member: 200"): echoes, the result
    keys, identity keys."""
    body = request.body
    inp = request.input
    row: dict[str, JSONValue] = {
        "responses_create_params": body["responses_create_params"],
        "response": body["response"],
    }
    row.update(result_dict(outcome.result))
    row["_ng_group_id"] = inp.group_id
    row["_ng_group_attempt"] = inp.group_attempt
    row["_ng_rollout_index"] = inp.rollout_index
    return row


_ECHO_KEYS: Final = ("responses_create_params", "response")


@final
@dataclass(frozen=True, slots=True)
class HeldVerify:
    """What a `/verify` request keeps while it waits for its group: the echoed fields already
    encoded as the reply will carry them, the identity keys, and the rest of the body.

    The decoded body of an agent's request is ~8 KB of dicts and strings with 1,000-character
    answers; its echo as compact JSON is ~2.3 KB, and with a group's members waiting in the
    hundreds that is most of a request's footprint. Encoding it now instead of at the reply costs
    nothing extra; the failsafe row (masked members) decodes it again. A long echo (long answers,
    reasoning traces) is kept zlib-compressed (:func:`compressed`; the agent's body with a
    1,000-character answer stays plain): its text is the second copy of the answer the cohort
    holds anyway, and (e) of the benchmarks holds 15,000 of them.
    """

    echo: bytes  # {"responses_create_params":…,"response":…}, zlib-compressed if echo_compressed
    rest: dict[str, Any]  # the body's other keys, in their order
    group_id: str | None
    group_attempt: int
    rollout_index: int | None
    echo_compressed: bool = False

    @staticmethod
    def of(request: VerifyRequest) -> HeldVerify:
        body = request.body
        inp = request.input
        echo = encode_json({key: body[key] for key in _ECHO_KEYS})
        packed = compressed(echo)
        return HeldVerify(
            echo=echo if packed is None else packed,
            rest={key: value for key, value in body.items() if key not in _ECHO_KEYS},
            group_id=inp.group_id,
            group_attempt=inp.group_attempt,
            rollout_index=inp.rollout_index,
            echo_compressed=packed is not None,
        )

    def echo_json(self) -> bytes:
        """The echoed fields as compact JSON: ``{"responses_create_params":…,"response":…}``."""
        return zlib.decompress(self.echo) if self.echo_compressed else self.echo

    def body(self) -> dict[str, Any]:
        """The request body again (equal to the decoded one; the echoed fields last)."""
        echoed = decode_json(self.echo_json())
        assert type(echoed) is dict
        return {**self.rest, **echoed}

    def success_json(self, outcome: Scored) -> bytes:
        """The encoded scored row: ``encode_json(success_row(...))``, with the result spliced in
        as the JSON it is stored as (a :class:`PackedResult`) instead of decoded and encoded."""
        inner = result_json(outcome.result)[1:-1].encode("ascii")
        tail = encode_json(
            {
                "_ng_group_id": self.group_id,
                "_ng_group_attempt": self.group_attempt,
                "_ng_rollout_index": self.rollout_index,
            }
        )
        middle = b"," + inner + b"," if inner else b","
        return self.echo_json()[:-1] + middle + tail[1:]

    def failsafe_row(self, message: str) -> dict[str, JSONValue]:
        """:func:`failsafe_row` of the request this was made from."""
        return failsafe_row(self.body(), message)


def failsafe_row(body: dict[str, Any], message: str) -> dict[str, JSONValue]:
    """The judge failsafe row for a masked member or a judge-kind failure (docs/http-api.md).

    The request body dumped by alias (absent declared fields added: `_ng_group_attempt` 0, the
    others null; `_ng_rollout_id` removed; extra keys kept), then the failure keys. The body is
    not mutated; `instance_config` is a shallow copy.
    """
    row: dict[str, JSONValue] = dict.fromkeys(_DUMP_FIELDS)
    row["_ng_group_attempt"] = 0
    for key, value in body.items():
        if key in _CAPTURE_KEYS:
            continue
        alias = _NAME_TO_ALIAS.get(key)
        if alias is not None:
            if alias in body:
                continue  # the alias was sent too and wins
            key = alias
        row[key] = value
    reason = message[:FAILSAFE_REASON_LIMIT]
    instance_config = body.get("instance_config")
    merged: dict[str, JSONValue] = dict(instance_config) if type(instance_config) is dict else {}
    merged["mask_sample"] = True
    row["reward"] = 0.0
    row["mask_sample"] = True
    row["failure_kind"] = "judge_failed"
    row["failure_reason"] = reason
    row["instance_config"] = merged
    row["_ng_failure_class"] = "judge_failed"
    row["_ng_failure_judge_error"] = reason
    return row


# --- reply models (OpenAPI only) ----------------------------------------------------------------
#
# Replies are rendered above without them; these describe their shapes for `/openapi.json`.


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
    ng_group_id: str | None = Field(alias="_ng_group_id")
    ng_group_attempt: int = Field(alias="_ng_group_attempt")
    ng_rollout_index: int | None = Field(alias="_ng_rollout_index")


class FailsafeRow(_Open):
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
    """Every non-200 reply except 422."""

    detail: str


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


class HealthResponse(BaseModel):
    status: Literal["ok"]


class CohortInfo(BaseModel):
    key: str
    group_id: str | None
    group_attempt: int
    state: Literal["collecting", "judging"]
    members_present: int
    members_expected: int
    requests_waiting: int
    comparisons_total: int
    comparisons_done: int
    comparisons_failed: int
    comparisons_pending: int
    deadline: Literal["collection", "evaluation"]
    deadline_s_left: float


_SCHEMA_MODELS: tuple[tuple[type[BaseModel], Literal["validation", "serialization"]], ...] = (
    (VerifyBody, "validation"),
    (VerifyRow, "serialization"),
    (FailsafeRow, "serialization"),
    (CompareBody, "validation"),
    (CompareReply, "serialization"),
    (ErrorDetail, "serialization"),
    (ValidationErrorReply, "serialization"),
    (SeedSessionRequest, "validation"),
    (SeedSessionResponse, "serialization"),
    (CloseSessionRequest, "validation"),
    (CloseSessionResponse, "serialization"),
    (AggregateMetricsRequest, "validation"),
    (AggregateMetricsResponse, "serialization"),
    (HealthResponse, "serialization"),
    (CohortInfo, "serialization"),
)


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json_content(schema: Mapping[str, Any]) -> dict[str, Any]:
    return {"application/json": {"schema": dict(schema)}}


def _reply(description: str, schema: Mapping[str, Any]) -> dict[str, Any]:
    return {"description": description, "content": _json_content(schema)}


def openapi_document(*, title: str, version: str, auth: bool) -> dict[str, Any]:
    """The OpenAPI 3.1 document of every route, generated from the models above."""
    keys, defs = models_json_schema(_SCHEMA_MODELS, ref_template="#/components/schemas/{model}")
    names = {model: schema["$ref"].rsplit("/", 1)[-1] for (model, _), schema in keys.items()}

    def ref(model: type[BaseModel]) -> dict[str, str]:
        return _ref(names[model])

    plain = _reply("Error", ref(ErrorDetail))
    invalid = _reply("Invalid JSON or schema", ref(ValidationErrorReply))
    too_large = _reply("Request body exceeds server.max_body_bytes", ref(ErrorDetail))
    common: dict[str, Any] = {"404": _reply("Not Found", ref(ErrorDetail))}
    if auth:
        common["401"] = _reply("Missing or invalid bearer token", ref(ErrorDetail))

    def post(
        summary: str, body: type[BaseModel], ok: Mapping[str, Any], **extra: Any
    ) -> dict[str, Any]:
        responses: dict[str, Any] = {"200": _reply("OK", ok), "413": too_large, "422": invalid}
        responses.update(extra)
        responses.update(common)
        return {
            "post": {
                "summary": summary,
                "requestBody": {"required": True, "content": _json_content(ref(body))},
                "responses": responses,
            }
        }

    def get(summary: str, ok: Mapping[str, Any], *, public: bool = False) -> dict[str, Any]:
        responses: dict[str, Any] = {"200": _reply("OK", ok)}
        if not public:
            responses.update(common)
        op: dict[str, Any] = {"summary": summary, "responses": responses}
        if public and auth:
            op["security"] = []
        return {"get": op}

    health = ref(HealthResponse)
    _OBJECT: dict[str, Any] = {"type": "object"}
    paths: dict[str, Any] = {
        "/verify": post(
            "Reward one rollout of a cohort (buffers until the group is complete)",
            VerifyBody,
            {"oneOf": [ref(VerifyRow), ref(FailsafeRow)]},
            **{"409": plain, "503": plain},
        ),
        "/compare": post(
            "Judge a batch of answers pairwise",
            CompareBody,
            ref(CompareReply),
            **{"503": plain},
        ),
        "/seed_session": post("No-op session seed", SeedSessionRequest, ref(SeedSessionResponse)),
        "/close_session": post(
            "No-op session close", CloseSessionRequest, ref(CloseSessionResponse)
        ),
        "/aggregate_metrics": post(
            "Reward-profile statistics over verify rows",
            AggregateMetricsRequest,
            ref(AggregateMetricsResponse),
        ),
        "/reverify_mode": get('Always "unsupported"', {"type": "string", "const": "unsupported"}),
        "/cohorts": get(
            "Active cohorts, oldest first", {"type": "array", "items": ref(CohortInfo)}
        ),
        "/judge/replicas": get(
            "Per-replica counters of a judge fleet ([] for one judge)",
            {"type": "array", "items": {"type": "object"}},
        ),
        "/metrics": {
            "get": {
                "summary": "Prometheus metrics",
                "responses": {
                    "200": {
                        "description": "OK",
                        "content": {"text/plain": {"schema": {"type": "string"}}},
                    },
                    **common,
                },
            }
        },
        "/openapi.json": get("This document", {"type": "object"}),
        "/checkpoint": {
            "get": get("Checkpoint v1 export of terminal cohorts and watermarks", _OBJECT)["get"],
            "post": {
                "summary": "Merge a checkpoint v1 body (added, unchanged, watermarks, conflicts)",
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": _OBJECT}},
                },
                "responses": {
                    "200": {
                        "description": "OK",
                        "content": {"application/json": {"schema": _OBJECT}},
                    },
                    **common,
                },
            },
        },
    }
    for path in ("/", "/health", "/healthz", "/readyz", "/livez"):
        paths[path] = get("Liveness", health, public=True)

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
