"""The judge APIs, one object each: `ChatCompletionsApi` (OpenAI chat completions) and
`OpenAIResponsesApi` (the OpenAI Responses API), which put the history, the principle and both
answers in the model's prompt, for any OpenAI-compatible server; and `GenRMModelApi` (Gym's
`genrm_model` Responses protocol: the answers in `metadata`, which only Gym's `genrm_model`
server puts in the prompt). Each knows the path it is POSTed to, builds its request body from a
`JudgeCall` and classifies its decoded reply into a `JudgeReply`; the transport around them is
`judge.client.HttpJudge`'s. Pure: no I/O. Request bodies and reply kinds:
docs/configuration.md, "Judge requests and replies".
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import math
from collections.abc import Mapping
from typing import Any, ClassVar, Final, Protocol, assert_never, final, get_args

from genrm_trio.config import JUDGE_API_ALIASES, JudgeApiName
from genrm_trio.domain.text import answer_text
from genrm_trio.judge.base import JudgeCall, JudgeReply, ReplyStatus

# The judge client's logger: the dropped-params line was logged there before the APIs had a
# module of their own.
log = logging.getLogger("genrm_trio.judge")

__all__ = [
    "JUDGE_APIS",
    "ChatCompletionsApi",
    "GenRMModelApi",
    "JudgeApi",
    "OpenAIResponsesApi",
    "chat_body",
    "chat_params",
    "genrm_messages",
    "interpret_chat",
    "interpret_responses",
    "judge_api",
    "judge_api_type",
    "openai_responses_body",
    "responses_body",
]


class JudgeApi(Protocol):
    """One judge API: the path under the judge's base URL, the request body of one attempt, and
    what a decoded reply means."""

    name: ClassVar[JudgeApiName]
    path: ClassVar[str]
    # whether the model's chat template sees the roles principle, response_1 and response_2
    custom_roles: ClassVar[bool]

    def body(self, call: JudgeCall) -> dict[str, Any]:
        """The JSON body of one attempt of `call`."""
        ...

    def interpret(self, reply: object) -> JudgeReply:
        """Classify one decoded reply."""
        ...


def judge_api(api: str, create_params: Mapping[str, Any]) -> JudgeApi:
    """The `judge.api` named `api` (or its earlier name, `JUDGE_API_ALIASES`), sending
    `create_params` (copied: later changes to the mapping do not reach the requests)."""
    kind = JUDGE_APIS.get(JUDGE_API_ALIASES.get(api, api))
    if kind is None:
        raise ValueError(f"unknown judge api {api!r}")
    return kind(create_params)


# --- usage, shared by both replies ----------------------------------------------------------------


def _count(value: object) -> int | None:
    """A token count: an int or finite float, never a bool."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and math.isfinite(value):
        return int(value)
    return None


def _reasoning(reply: Mapping[str, Any]) -> int | None:
    """Reasoning tokens where the reply reports them: Responses
    `usage.output_tokens_details.reasoning_tokens`, chat
    `usage.completion_tokens_details.reasoning_tokens`."""
    usage = reply.get("usage")
    if not isinstance(usage, Mapping):
        return None
    for key in ("output_tokens_details", "completion_tokens_details"):
        details = usage.get(key)
        if isinstance(details, Mapping):
            return _count(details.get("reasoning_tokens"))
    return None


def _reply(
    status: ReplyStatus, text: str, tokens: tuple[int | None, int | None], reply: Mapping[str, Any]
) -> JudgeReply:
    tokens_in, tokens_out = tokens
    reasoning = _reasoning(reply) if tokens_out is not None else None
    return JudgeReply(status, text, tokens_in, tokens_out, reasoning)


def _usage(reply: Mapping[str, Any]) -> tuple[int | None, int | None]:
    """(input, output) tokens: `input_tokens` else `prompt_tokens`, `output_tokens` else
    `completion_tokens`; both or neither (an attempt counts only if both are numbers)."""
    usage = reply.get("usage")
    if not isinstance(usage, Mapping):
        return None, None
    raw_in = usage.get("input_tokens")
    if raw_in is None:
        raw_in = usage.get("prompt_tokens")
    raw_out = usage.get("output_tokens")
    if raw_out is None:
        raw_out = usage.get("completion_tokens")
    tokens_in, tokens_out = _count(raw_in), _count(raw_out)
    if tokens_in is None or tokens_out is None:
        return None, None
    return tokens_in, tokens_out


# --- Responses ------------------------------------------------------------------------------------


def genrm_messages(call: JudgeCall) -> list[dict[str, str]]:
    """The comparison as the model reads it: the history, then `{"role": "principle"}` (when
    the call has one), `{"role": "response_1"}` and `{"role": "response_2"}`. The judge's chat
    template must accept those three roles (GenRM models' templates do)."""
    messages = [{"role": entry["role"], "content": entry["content"]} for entry in call.history]
    if call.principle:
        messages.append({"role": "principle", "content": call.principle})
    messages.append({"role": "response_1", "content": call.response_1})
    messages.append({"role": "response_2", "content": call.response_2})
    return messages


def responses_body(params: Mapping[str, Any], call: JudgeCall) -> dict[str, Any]:
    """The Gym `genrm_model` request: create params with `input` and `metadata` set, and
    `max_output_tokens` replaced by the attempt's own budget when the call carries one.

    `params` is never mutated and is serialised at once, so a shallow copy is as good as the
    reference's deep copy.
    """
    metadata = {"response_1": call.response_1, "response_2": call.response_2}
    if call.principle is not None:
        metadata["principle"] = call.principle
    body = dict(params)
    body["input"] = [
        {"role": entry["role"], "content": entry["content"], "type": "message"}
        for entry in call.history
    ]
    body["metadata"] = metadata
    if call.max_output_tokens is not None:
        body["max_output_tokens"] = call.max_output_tokens
    return body


def interpret_responses(reply: object) -> JudgeReply:
    """Classify one decoded Responses reply."""
    if not isinstance(reply, dict):
        return JudgeReply(ReplyStatus.UNUSABLE, "", None, None)
    tokens = _usage(reply)
    status = reply.get("status") or "completed"
    if status == "completed":
        text = answer_text(reply)
        if text.strip():
            return _reply(ReplyStatus.COMPLETED, text, tokens, reply)
    elif status == "incomplete":
        details = reply.get("incomplete_details")
        if isinstance(details, dict) and details.get("reason") == "max_output_tokens":
            cut = _reply(ReplyStatus.BUDGET_EXHAUSTED, "", tokens, reply)
            return dataclasses.replace(cut, partial=answer_text(reply))
    return _reply(ReplyStatus.UNUSABLE, "", tokens, reply)


@final
class GenRMModelApi:
    """`judge.api: genrm_model` (formerly `responses`): POST `{base_url}/responses` with the
    create params, `input` and `metadata` (`responses_body`), Gym's `genrm_model` protocol; the
    reply is a Responses object (`interpret_responses`). Only Gym's `genrm_model` server shows
    `metadata` to the model: any other server judges without reading the answers."""

    name: ClassVar[JudgeApiName] = "genrm_model"
    path: ClassVar[str] = "/responses"
    custom_roles: ClassVar[bool] = False

    def __init__(self, create_params: Mapping[str, Any]) -> None:
        self._params: Final = copy.deepcopy(dict(create_params))

    def body(self, call: JudgeCall) -> dict[str, Any]:
        return responses_body(self._params, call)

    def interpret(self, reply: object) -> JudgeReply:
        return interpret_responses(reply)


def openai_responses_body(params: Mapping[str, Any], call: JudgeCall) -> dict[str, Any]:
    """A plain OpenAI Responses request: the create params, with `input` the history, the
    principle and both answers as messages (`genrm_messages`), `"stream": false` (servers that
    stream by default, such as transformers serve, then answer one JSON object), and the
    attempt's own budget as `max_output_tokens` when the call carries one."""
    body = dict(params)
    body["input"] = [{**message, "type": "message"} for message in genrm_messages(call)]
    body["stream"] = False
    if call.max_output_tokens is not None:
        body["max_output_tokens"] = call.max_output_tokens
    return body


@final
class OpenAIResponsesApi:
    """`judge.api: openai_responses`: POST `{base_url}/responses` (vLLM's, transformers serve's,
    any OpenAI Responses endpoint) with the comparison in `input` (`openai_responses_body`);
    the reply is a Responses object (`interpret_responses`)."""

    name: ClassVar[JudgeApiName] = "openai_responses"
    path: ClassVar[str] = "/responses"
    custom_roles: ClassVar[bool] = True

    def __init__(self, create_params: Mapping[str, Any]) -> None:
        self._params: Final = copy.deepcopy(dict(create_params))

    def body(self, call: JudgeCall) -> dict[str, Any]:
        return openai_responses_body(self._params, call)

    def interpret(self, reply: object) -> JudgeReply:
        return interpret_responses(reply)


# --- chat completions -----------------------------------------------------------------------------

# Responses create params that chat completions takes under the same name. The others are
# mapped below or dropped (input and metadata are rebuilt per call anyway).
_CHAT_SAME_NAME: Final = frozenset(
    {
        "model",
        "temperature",
        "top_p",
        "top_logprobs",
        "user",
        "service_tier",
        "prompt_cache_key",
        "safety_identifier",
    }
)
_CHAT_MAPPED: Final = frozenset({"max_output_tokens", "reasoning", "text", "instructions"})
_CHAT_REBUILT: Final = frozenset({"input", "metadata"})


def chat_params(params: Mapping[str, Any]) -> tuple[dict[str, Any], str | None, list[str]]:
    """Map Responses create params to chat-completion params.

    Returns (params, instructions, dropped keys). `instructions` becomes a leading system message.
    """
    out: dict[str, Any] = {}
    dropped: list[str] = []
    instructions: str | None = None
    for key, value in params.items():
        if key in _CHAT_SAME_NAME:
            out[key] = value
        elif key == "max_output_tokens":
            out["max_tokens"] = value
        elif key == "reasoning" and isinstance(value, Mapping) and value.get("effort") is not None:
            out["reasoning_effort"] = value["effort"]
        elif key == "text" and isinstance(value, Mapping) and isinstance(value.get("format"), dict):
            fmt = dict(value["format"])
            kind = fmt.pop("type", None)
            if kind == "json_schema":
                out["response_format"] = {"type": "json_schema", "json_schema": fmt}
            elif kind in ("json_object", "text"):
                out["response_format"] = {"type": kind}
            else:
                dropped.append(key)
        elif key == "instructions" and isinstance(value, str):
            instructions = value
        elif key not in _CHAT_REBUILT:
            dropped.append(key)
    if "top_logprobs" in out:
        out["logprobs"] = True
    out["n"] = 1
    return out, instructions, dropped


def chat_body(
    params: Mapping[str, Any], instructions: str | None, call: JudgeCall
) -> dict[str, Any]:
    """A chat-completions request: history, then principle, response_1, response_2
    (`genrm_messages`), `"stream": false`; the attempt's own budget, when the call carries one,
    is sent as `max_tokens`."""
    messages: list[dict[str, str]] = []
    if instructions is not None:
        messages.append({"role": "system", "content": instructions})
    messages.extend(genrm_messages(call))
    body = dict(params)
    body["messages"] = messages
    body["stream"] = False
    if call.max_output_tokens is not None:
        body["max_tokens"] = call.max_output_tokens
    return body


def interpret_chat(reply: object) -> JudgeReply:
    """Classify one decoded chat-completions reply."""
    if not isinstance(reply, dict):
        return JudgeReply(ReplyStatus.UNUSABLE, "", None, None)
    tokens = _usage(reply)
    choices = reply.get("choices")
    choice = choices[0] if isinstance(choices, list) and choices else None
    if not isinstance(choice, dict):
        return _reply(ReplyStatus.UNUSABLE, "", tokens, reply)
    finish = choice.get("finish_reason")
    message = choice.get("message")
    text = message.get("content") if isinstance(message, dict) else None
    if finish == "length":
        cut = _reply(ReplyStatus.BUDGET_EXHAUSTED, "", tokens, reply)
        partial = text if isinstance(text, str) else ""
        return dataclasses.replace(
            cut, cut_by="finish_reason=length (the reply reached max_tokens)", partial=partial
        )
    if finish in (None, "stop") and isinstance(text, str) and text.strip():
        return _reply(ReplyStatus.COMPLETED, text, tokens, reply)
    return _reply(ReplyStatus.UNUSABLE, "", tokens, reply)


@final
class ChatCompletionsApi:
    """`judge.api: chat_completions`: POST `{base_url}/chat/completions` with the create params
    mapped once to chat params (`chat_params`; the ones chat does not take are logged once and
    dropped) and the call as messages (`chat_body`); the reply is a chat completion
    (`interpret_chat`)."""

    name: ClassVar[JudgeApiName] = "chat_completions"
    path: ClassVar[str] = "/chat/completions"
    custom_roles: ClassVar[bool] = True

    def __init__(self, create_params: Mapping[str, Any]) -> None:
        chat, instructions, dropped = chat_params(copy.deepcopy(dict(create_params)))
        if dropped:
            log.info(
                "judge.api chat_completions: ignoring create params chat does not take: %s",
                ", ".join(sorted(dropped)),
            )
        self._params: Final = chat
        self._instructions: Final = instructions

    def body(self, call: JudgeCall) -> dict[str, Any]:
        return chat_body(self._params, self._instructions, call)

    def interpret(self, reply: object) -> JudgeReply:
        return interpret_chat(reply)


JudgeApiType = type[ChatCompletionsApi] | type[OpenAIResponsesApi] | type[GenRMModelApi]


def judge_api_type(name: JudgeApiName) -> JudgeApiType:
    """The object of the `judge.api` value `name`: the one place a new judge API is added, beside
    its value in `config.JudgeApiName` (mypy fails here until every value has its object)."""
    match name:
        case "chat_completions":
            return ChatCompletionsApi
        case "openai_responses":
            return OpenAIResponsesApi
        case "genrm_model":
            return GenRMModelApi
        case _:
            assert_never(name)


JUDGE_APIS: Final[Mapping[str, JudgeApiType]] = {
    name: judge_api_type(name) for name in get_args(JudgeApiName)
}
"""Every `judge.api` value and its object, derived from `config.JudgeApiName`."""
