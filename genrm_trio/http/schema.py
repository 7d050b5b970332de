"""The request schema: the pydantic request models and the one validator of request bodies
(docs/http-api.md, "Request", "Errors"), with the 422 item shape every refusal takes.

The hot path works on the decoded JSON value directly: one `decode_body` (the codec's one parse),
one `model_validate` of the request model over it (the declared top-level fields and the message
items of `input`). The request models are the only statement of the request shapes: they
validate, and `/openapi.json` is generated from them (`http/openapi.py`). Echoed values and the
engine inputs are the received objects themselves, never copies. Everything inside `response`
and inside the values of `responses_create_params` is opaque.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Annotated, Any, Final, Literal, TypeVar, final

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    StrictInt,
    StrictStr,
    Tag,
    ValidationError,
)

from genrm_trio.domain.codec import (
    InvalidJSON,
    decode_json,
    decode_json_in_steps,
    split_object_in_steps,
    values_at_most,
)
from genrm_trio.domain.model import CompareInput, JSONValue, VerifyInput

__all__ = [
    "ECHO_KEYS",
    "MAX_JSON_VALUES",
    "ROLES",
    "VERIFY_FIELDS",
    "AggregateMetricsRequest",
    "CloseSessionRequest",
    "CompareBody",
    "SeedSessionRequest",
    "VerifyBody",
    "VerifyRequest",
    "WireError",
    "decode_body",
    "error",
    "parse_aggregate_rows",
    "parse_compare",
    "parse_verify",
    "split_verify_body",
    "validate",
]

MAX_ERRORS = 64  # a 422 lists at most this many problems
_DICT_TYPE: Final = "Input should be a valid dictionary"
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


MAX_JSON_VALUES: Final = 4_000_000
"""The most JSON values a body may hold (counted from its separators, see `values_at_most`).
Decoded, a value costs 50 to 200 bytes whatever its text: a 60 MiB body of `[[],[],…]` was 20
million lists and 1.7 GB. At this bound a body decodes to a few hundred megabytes at most
(docs/reliability.md, "Security"); a `/verify` body is a few hundred values."""

_COUNT_VALUES_FROM: Final = 1 << 20
"""Bodies smaller than this (1 MiB) cannot hold MAX_JSON_VALUES values and are not counted."""


_D = TypeVar("_D")


def _wire_decoded(body: bytes | bytearray, decode: Callable[[bytes | bytearray], _D]) -> _D:
    """`decode(body)`, or WireError with the one `json_too_large` item of a body with more than
    MAX_JSON_VALUES values, or the one `json_invalid` item of what the codec refused (its `loc`
    is the whole body)."""
    if len(body) >= _COUNT_VALUES_FROM:
        values = values_at_most(body if type(body) is bytes else bytes(body))
        if values > MAX_JSON_VALUES:
            message = (
                f"JSON decode error: up to {values} values, more than the {MAX_JSON_VALUES} a "
                "body may hold"
            )
            raise WireError([error("json_too_large", (), message)])
    try:
        return decode(body)
    except InvalidJSON as exc:
        raise WireError([error("json_invalid", (), str(exc))]) from None


def decode_body(body: bytes | bytearray, *, in_steps: bool = False) -> JSONValue:
    """A request body as one JSON value (:func:`decode_json`; with `in_steps`,
    :func:`decode_json_in_steps`, for a worker thread), or WireError (`_wire_decoded`)."""
    return _wire_decoded(body, decode_json_in_steps if in_steps else decode_json)


def split_verify_body(body: bytes | bytearray) -> tuple[JSONValue, bytes]:
    """A large `/verify` body for a worker thread, as :func:`decode_body` refuses it: its
    declared keys decoded (all that `parse_verify` reads) and every key but the echoed ones
    packed (:func:`split_object_in_steps`), which is what a waiting request keeps of them."""
    return _wire_decoded(
        body, partial(split_object_in_steps, keep=_VERIFY_KEYS, pack_all_but=ECHO_KEYS)
    )


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
            kind, msg = "dict_type", _DICT_TYPE
        rank = ranks.get(loc[0], -1) if loc else -1
        items.append((rank, kind != "extra_forbidden", error(kind, _wire_loc(loc), msg)))
    items.sort(key=lambda item: item[:2])
    return [item for _, _, item in items[:MAX_ERRORS]]


_M = TypeVar("_M", bound=BaseModel)


def validate(model: type[_M], value: JSONValue) -> _M:
    """`model.model_validate(value)`, or WireError with the 422 items of what is wrong."""
    try:
        # model_validate without its Python wrapper, a measurable share of validating a /verify
        # body (docs/benchmarks.md, "Small costs behind code choices")
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


_VERIFY_KEYS: Final = frozenset(VERIFY_FIELDS) | frozenset(VERIFY_FIELDS.values())
_FEW_KEYS: Final = 64

ECHO_KEYS: Final = ("responses_create_params", "response")
"""The `/verify` keys every reply row echoes (docs/http-api.md, "Scored member: 200")."""


def parse_verify(value: JSONValue) -> VerifyRequest:
    """Validate a decoded `/verify` body (docs/http-api.md, "Request", "Errors") or raise
    WireError.

    `input`, `response` and `metadata` of the engine input are the decoded objects themselves.
    """
    declared = value
    if type(value) is dict and len(value) > _FEW_KEYS:
        # A client's other keys are accepted as they are, never validated: a body of a million
        # of them would be copied into the model for nothing, in one call that holds the GIL.
        declared = {key: item for key, item in value.items() if key in _VERIFY_KEYS}
    model = validate(VerifyBody, declared)
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


def parse_aggregate_rows(value: JSONValue) -> list[dict[str, Any]]:
    """The rows of a decoded `/aggregate_metrics` body (`AggregateMetricsRequest`), or WireError
    with the items pydantic gives. The rows are checked a row at a time, not by one validation
    call: 500,000 rows held the GIL 112 ms in one (docs/reliability.md, "Security")."""
    rows = value.get("verify_responses") if type(value) is dict else None
    if type(rows) is not list:
        validate(AggregateMetricsRequest, value)  # its items: not an object, missing, not a list
        raise AssertionError("a body without a list of rows validated")
    errors: list[dict[str, Any]] = []
    for index, row in enumerate(rows):
        if type(row) is not dict:
            errors.append(error("dict_type", ("verify_responses", index), _DICT_TYPE))
            if len(errors) == MAX_ERRORS:
                break
    if errors:
        raise WireError(errors)
    return rows


def parse_compare(value: JSONValue, *, max_responses: int | None = None) -> CompareInput:
    """Validate a decoded `/compare` body (docs/http-api.md, "POST /compare") or raise WireError.

    Undeclared top-level keys are ignored; `history` and `responses` are the decoded lists. More
    than `max_responses` responses is one `too_long` item, before anything is validated: one
    validation call holds the GIL throughout, and 500,000 bad responses held it for 210 ms and
    took 600 MB for their errors (docs/reliability.md, "Security").
    """
    if max_responses is not None and type(value) is dict:
        responses = value.get("response_objs")
        if type(responses) is list and len(responses) > max_responses:
            message = (
                f"at most {max_responses} responses per request "
                f"(server.max_compare_responses), got {len(responses)}"
            )
            raise WireError([error("too_long", ("response_objs",), message)])
    model = validate(CompareBody, value)
    assert type(value) is dict
    return CompareInput(
        history=value["conversation_history"],
        responses=value["response_objs"],
        principle=model.principle,
        expected_rubric_ids=_rubric_ids(model.expected_rubric_ids),
    )
