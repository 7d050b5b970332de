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

from genrm_trio.config import JUDGE_API_ALIASES, OUTPUT_BUDGET_PARAM, JudgeApiName
from genrm_trio.domain.prompt import VERDICT_JSON_SCHEMA, InstructPrompt, PromptTemplateError
from genrm_trio.domain.text import answer_text
from genrm_trio.judge.base import JudgeAttemptError, JudgeCall, JudgeReply, ReplyStatus

# The judge client's logger: the dropped-params line was logged there before the APIs had a
# module of their own.
log = logging.getLogger("genrm_trio.judge")

__all__ = [
    "JUDGE_APIS",
    "ChatCompletionsApi",
    "GenRMModelApi",
    "JudgeApi",
    "JudgePromptError",
    "OpenAIResponsesApi",
    "chat_body",
    "chat_params",
    "genrm_messages",
    "interpret_chat",
    "interpret_responses",
    "judge_api",
    "judge_api_type",
    "openai_responses_body",
    "prompt_messages",
    "responses_body",
    "roles_refused",
]


class JudgeApi(Protocol):
    """One judge API: the path under the judge's base URL, the request body of one attempt, and
    what a decoded reply means."""

    name: ClassVar[JudgeApiName]
    path: ClassVar[str]
    # the request key of the attempt's output budget
    budget_key: ClassVar[str]
    # what to change when the judge's prompt tokens show it does not read the answers
    unread_fix: ClassVar[str]

    @property
    def custom_roles(self) -> bool:
        """Whether the model's chat template is sent the roles principle, response_1 and
        response_2 (`judge.prompt: genrm` with an API that puts the answers in messages)."""
        ...

    def body(self, call: JudgeCall) -> dict[str, Any]:
        """The JSON body of one attempt of `call` (`JudgePromptError` if the instruct template
        fails to render it)."""
        ...

    def interpret(self, reply: object) -> JudgeReply:
        """Classify one decoded reply."""
        ...


def judge_api(
    api: str,
    create_params: Mapping[str, Any],
    *,
    prompt: InstructPrompt | None = None,
    structured_output: bool = False,
) -> JudgeApi:
    """The `judge.api` named `api` (or its earlier name, `JUDGE_API_ALIASES`), sending
    `create_params` (copied: later changes to the mapping do not reach the requests); `prompt`:
    the `judge.prompt: instruct` messages (None: the GenRM roles); `structured_output`: ask for
    the verdict's JSON schema (`judge.structured_output`)."""
    kind = JUDGE_APIS.get(JUDGE_API_ALIASES.get(api, api))
    if kind is None:
        raise ValueError(f"unknown judge api {api!r}")
    return kind(create_params, prompt=prompt, structured_output=structured_output)


class JudgePromptError(JudgeAttemptError):
    """The `judge.prompt_template` failed to render this comparison (it rendered the sentinel
    answers at start, `domain.prompt`). Not retried: the same comparison renders the same."""

    type_name = "PromptTemplateError"


_ROLE_NAMES: Final = (b"response_1", b"response_2", b"principle")


def roles_refused(status: int, body: bytes) -> bool:
    """Whether an error reply refuses the request for its GenRM roles: a 400, 422 or 500 whose
    body names one of them (a hosted API's `Invalid value: 'response_1'` with `param:
    messages[3].role`; vLLM's and a strict chat template's `unknown role: response_1`)."""
    if status not in (400, 422, 500):
        return False
    lowered = body.lower()
    return any(name in lowered for name in _ROLE_NAMES)


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


def prompt_messages(prompt: InstructPrompt | None, call: JudgeCall) -> list[dict[str, str]]:
    """The comparison as messages: the GenRM roles (`genrm_messages`) without an instruct
    prompt, else its system and user messages; `JudgePromptError` if the template fails."""
    if prompt is None:
        return genrm_messages(call)
    try:
        return prompt.messages(call.history, call.principle, call.response_1, call.response_2)
    except PromptTemplateError as exc:
        raise JudgePromptError(f"judge.prompt_template: {exc}") from None


def _verdict_format() -> dict[str, Any]:
    """The verdict's JSON schema as a Responses `text.format` (`judge.structured_output`)."""
    return {"type": "json_schema", "name": "verdict", "schema": VERDICT_JSON_SCHEMA, "strict": True}


def _own_params(create_params: Mapping[str, Any], structured_output: bool) -> dict[str, Any]:
    """An API's own copy of the Responses create params (never shared with the settings); with
    `structured_output`, its `text.format` asks for the verdict schema (any other key of `text`
    kept)."""
    params = copy.deepcopy(dict(create_params))
    if structured_output:
        text = params.get("text")
        kept = text if isinstance(text, Mapping) else {}
        params["text"] = {**kept, "format": _verdict_format()}
    return params


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
        body[GenRMModelApi.budget_key] = call.max_output_tokens
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
    budget_key: ClassVar[str] = "max_output_tokens"
    unread_fix: ClassVar[str] = (
        "judge.api genrm_model sends the answers in metadata, which only Gym's genrm_model "
        "server shows the model; for vLLM or any other OpenAI-compatible server set "
        "judge.api: chat_completions (or openai_responses)"
    )

    def __init__(
        self,
        create_params: Mapping[str, Any],
        *,
        prompt: InstructPrompt | None = None,
        structured_output: bool = False,
    ) -> None:
        if prompt is not None:
            # the settings refuse it (judge.prompt): Gym's protocol has no messages to fill
            raise ValueError("judge.api genrm_model sends no messages: no judge.prompt: instruct")
        self._params: Final = _own_params(create_params, structured_output)

    @property
    def custom_roles(self) -> bool:
        return False

    def body(self, call: JudgeCall) -> dict[str, Any]:
        return responses_body(self._params, call)

    def interpret(self, reply: object) -> JudgeReply:
        return interpret_responses(reply)


def openai_responses_body(
    params: Mapping[str, Any], call: JudgeCall, prompt: InstructPrompt | None = None
) -> dict[str, Any]:
    """A plain OpenAI Responses request: the create params, with `input` the comparison as
    messages (`prompt_messages`: the history, the principle and both answers as the GenRM roles,
    or the instruct prompt's system and user messages), `"stream": false` (servers that stream
    by default, such as transformers serve, then answer one JSON object), and the attempt's own
    budget as `max_output_tokens` when the call carries one."""
    body = dict(params)
    body["input"] = [{**message, "type": "message"} for message in prompt_messages(prompt, call)]
    body["stream"] = False
    if call.max_output_tokens is not None:
        body[OpenAIResponsesApi.budget_key] = call.max_output_tokens
    return body


_ROLES_FIX: Final = (
    "judge.api {api} with judge.prompt: genrm sends the answers as the roles principle, "
    "response_1 and response_2: the judge model's chat template must render them (one that "
    "drops unknown roles hides the answers); for any other model set judge.prompt: instruct"
)


@final
class OpenAIResponsesApi:
    """`judge.api: openai_responses`: POST `{base_url}/responses` (vLLM's, transformers serve's,
    any OpenAI Responses endpoint) with the comparison in `input` (`openai_responses_body`);
    the reply is a Responses object (`interpret_responses`)."""

    name: ClassVar[JudgeApiName] = "openai_responses"
    path: ClassVar[str] = "/responses"
    budget_key: ClassVar[str] = "max_output_tokens"
    unread_fix: ClassVar[str] = _ROLES_FIX.format(api="openai_responses")

    def __init__(
        self,
        create_params: Mapping[str, Any],
        *,
        prompt: InstructPrompt | None = None,
        structured_output: bool = False,
    ) -> None:
        self._params: Final = _own_params(create_params, structured_output)
        self._prompt: Final = prompt

    @property
    def custom_roles(self) -> bool:
        return self._prompt is None

    def body(self, call: JudgeCall) -> dict[str, Any]:
        return openai_responses_body(self._params, call, self._prompt)

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
_CHAT_MAPPED: Final = frozenset({OUTPUT_BUDGET_PARAM, "reasoning", "text", "instructions"})
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
        elif key == OUTPUT_BUDGET_PARAM:
            out[ChatCompletionsApi.budget_key] = value
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
    params: Mapping[str, Any],
    instructions: str | None,
    call: JudgeCall,
    prompt: InstructPrompt | None = None,
) -> dict[str, Any]:
    """A chat-completions request: history, then principle, response_1, response_2
    (`genrm_messages`), or the instruct prompt's system and user messages (`instructions`
    joined to its system message: templates that take one system message take no second),
    `"stream": false`; the attempt's own budget, when the call carries one, is sent as
    `max_tokens`."""
    messages: list[dict[str, str]] = []
    shown = prompt_messages(prompt, call)
    if instructions is not None:
        if prompt is not None and shown[0]["role"] == "system":
            shown[0] = {"role": "system", "content": f"{instructions}\n\n{shown[0]['content']}"}
        else:
            messages.append({"role": "system", "content": instructions})
    messages.extend(shown)
    body = dict(params)
    body["messages"] = messages
    body["stream"] = False
    if call.max_output_tokens is not None:
        body[ChatCompletionsApi.budget_key] = call.max_output_tokens
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
    budget_key: ClassVar[str] = "max_tokens"
    unread_fix: ClassVar[str] = _ROLES_FIX.format(api="chat_completions")

    def __init__(
        self,
        create_params: Mapping[str, Any],
        *,
        prompt: InstructPrompt | None = None,
        structured_output: bool = False,
    ) -> None:
        # the verdict schema's text.format is mapped to response_format by chat_params
        chat, instructions, dropped = chat_params(_own_params(create_params, structured_output))
        if dropped:
            log.info(
                "judge.api chat_completions: ignoring create params chat does not take: %s",
                ", ".join(sorted(dropped)),
            )
        self._params: Final = chat
        self._instructions: Final = instructions
        self._prompt: Final = prompt

    @property
    def custom_roles(self) -> bool:
        return self._prompt is None

    def body(self, call: JudgeCall) -> dict[str, Any]:
        return chat_body(self._params, self._instructions, call, self._prompt)

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
