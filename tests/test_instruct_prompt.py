"""`judge.prompt: instruct` and the judge-API objects' own request parts (#36 item 4, #37 item 1):

- the shipped template shows the conversation, the principle and both answers (Response 1
  first) in a system and a user message and asks for the verdict the parser reads;
- a user template (`judge.prompt_template`) is refused at start, one line, unless it shows
  both answers; it renders in a sandbox with undefined variables refused;
- chat completions and the Responses API send it; `judge.structured_output` asks for the
  verdict schema; each API sends the budget under its own key and owns its fix text;
- the roles hint only where a reply refuses the GenRM roles.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from genrm_trio.config import ConfigError, JudgeApiName, settings_from_mapping
from genrm_trio.domain.prompt import VERDICT_JSON_SCHEMA, InstructPrompt, PromptTemplateError
from genrm_trio.domain.verdict import parse_overall
from genrm_trio.judge.answer_check import unread_fix
from genrm_trio.judge.apis import (
    JUDGE_APIS,
    ChatCompletionsApi,
    GenRMModelApi,
    JudgePromptError,
    OpenAIResponsesApi,
    judge_api,
    roles_refused,
)
from genrm_trio.judge.base import JudgeCall
from genrm_trio.judge.client import make_http_judge
from genrm_trio.judge.prompts import judge_prompt, shipped_template

HISTORY = [
    {"role": "system", "content": "You are a maths tutor."},
    {"role": "user", "content": "What is 2+2?"},
]
CALL = JudgeCall(HISTORY, "four", "It is 4.", "be correct", max_output_tokens=77)


def shipped() -> InstructPrompt:
    return InstructPrompt(shipped_template())


# --- the shipped prompt ---------------------------------------------------------------------------


def test_the_shipped_prompt_shows_everything_in_order_in_standard_roles() -> None:
    messages = shipped().messages(HISTORY, "be correct", "four", "It is 4.")
    assert [m["role"] for m in messages] == ["system", "user"]
    user = messages[1]["content"]
    order = ["[system]", "You are a maths tutor.", "[user]", "What is 2+2?", "# Principle"]
    order += ["be correct", "# Response 1\nfour", "# Response 2\nIt is 4."]
    positions = [user.index(part) for part in order]
    assert positions == sorted(positions)
    assert "# Principle" not in shipped().messages(HISTORY, None, "a", "b")[1]["content"]


def test_the_shipped_prompt_asks_for_the_verdict_the_parser_reads_with_its_scales() -> None:
    system = shipped().messages(HISTORY, None, "a", "b")[0]["content"]
    example = next(line for line in system.splitlines() if line.startswith('{"score_1"'))
    # its placeholders filled in as a model would: the parser reads that shape
    filled = example.replace("<integer 1-5>", "4", 1).replace("<integer 1-5>", "2")
    filled = filled.replace("<integer 1-6>", "2")
    assert tuple(
        parse_overall(filled, default_score=3, default_ranking=3.5, validate_range=True)
    ) == (4, 2, 2)
    for scale in ("from 1 (very poor) to 5 (excellent)", "1 = Response 1 is much better"):
        assert scale in system
    assert "6 = Response 2 is much better than Response 1" in system


# --- user templates -------------------------------------------------------------------------------

GOOD = (
    "{% block user %}Q: {{ history[-1].content }}\n"
    "A: {{ response_1 }}\nB: {{ response_2 }}{% endblock %}"
)


@pytest.mark.parametrize(
    ("source", "error"),
    [
        ("{{ response_1 }} {{ response_2 }}", "has no {% block user %}"),
        (
            "{% block user %}{{ response_1 }}{% endblock %}",
            "does not show {{ response_2 }}: the judge would not read that answer",
        ),
        ("{% block user %}{{ answer }}{% endblock %}", "UndefinedError: 'answer' is undefined"),
        ("{% block user %}{{ response_1 }{% endblock %}", "line 1: unexpected '}'"),
        (
            "{% block user %}{{ response_1.__class__ }}{{ response_2 }}{% endblock %}",
            "SecurityError: access to attribute '__class__' of 'str' object is unsafe.",
        ),
    ],
)
def test_a_template_that_cannot_serve_is_refused_in_one_line(source: str, error: str) -> None:
    with pytest.raises(PromptTemplateError) as info:
        InstructPrompt(source)
    assert str(info.value).startswith(error), str(info.value)
    assert "\n" not in str(info.value)


def test_a_user_template_without_a_system_block_sends_one_user_message() -> None:
    messages = InstructPrompt(GOOD).messages(HISTORY, None, "x", "y")
    assert messages == [{"role": "user", "content": "Q: What is 2+2?\nA: x\nB: y"}]


def test_a_template_that_fails_on_real_data_fails_that_attempt_only() -> None:
    api = judge_api("chat_completions", {}, prompt=InstructPrompt(GOOD))
    with pytest.raises(JudgePromptError) as info:
        api.body(JudgeCall([], "x", "y", None))  # no history: history[-1] is undefined
    assert info.value.describe().startswith("PromptTemplateError: judge.prompt_template: ")
    assert not info.value.retryable


def settings(judge: dict[str, Any], **extra: Any) -> Any:
    return settings_from_mapping(
        {"judge": {"base_url": "http://judge.test:8000/v1", **judge}, **extra}
    )


def config_error(judge: dict[str, Any], **extra: Any) -> str:
    with pytest.raises(ConfigError) as info:
        settings(judge, **extra)
    return str(info.value)


def test_prompt_keys_that_do_not_fit_are_config_errors(tmp_path: Path) -> None:
    template = tmp_path / "judge.jinja"
    template.write_text(GOOD)
    assert config_error({"api": "chat_completions", "prompt_template": str(template)}) == (
        "<settings>: judge.prompt_template: needs judge.prompt: instruct"
    )
    assert config_error({"api": "genrm_model", "prompt": "instruct"}) == (
        "<settings>: judge.prompt: instruct needs judge.api chat_completions or "
        "openai_responses (genrm_model sends the answers in metadata)"
    )
    assert config_error({"api": "chat_completions", "prompt": "verbose"}).startswith(
        "<settings>: judge.prompt: Input should be 'genrm' or 'instruct'"
    )
    missing = tmp_path / "missing.jinja"
    assert config_error(
        {"api": "chat_completions", "prompt": "instruct", "prompt_template": str(missing)}
    ) == (f"<settings>: judge.prompt_template: {missing} is not a file")
    rubric = {"score_source": "rubric_mean"}
    assert config_error({"api": "chat_completions", "prompt": "instruct"}, **rubric) == (
        "<settings>: judge.prompt: the shipped instruct prompt asks for the overall verdict "
        "only: with score_source: rubric_mean set judge.prompt_template to a template that "
        "asks for rubric_evaluations"
    )
    assert config_error({"api": "chat_completions", "structured_output": True}, **rubric) == (
        "<settings>: judge.structured_output: the verdict schema has no rubric_evaluations: "
        "not with score_source: rubric_mean"
    )


def test_a_template_file_is_checked_when_the_judge_is_made(tmp_path: Path) -> None:
    template = tmp_path / "judge.jinja"
    template.write_text("{% block user %}{{ response_1 }}{% endblock %}")
    config = settings(
        {"api": "chat_completions", "prompt": "instruct", "prompt_template": str(template)}
    )
    with pytest.raises(ConfigError) as info:
        make_http_judge(config)
    assert str(info.value) == (
        f"settings: judge.prompt_template: {template}: does not show {{{{ response_2 }}}}: "
        "the judge would not read that answer"
    )
    template.write_bytes(b"\xff" + GOOD.encode())
    with pytest.raises(ConfigError, match="not UTF-8"):
        judge_prompt(config.judge)
    template.write_text(GOOD + " " * 64 * 1024)
    with pytest.raises(ConfigError, match="larger than 65536 bytes"):
        judge_prompt(config.judge)
    template.write_text(GOOD)
    prompt = judge_prompt(config.judge)
    assert prompt is not None
    assert prompt.messages(HISTORY, None, "x", "y")[0]["content"].endswith("A: x\nB: y")
    assert judge_prompt(settings({"api": "chat_completions"}).judge) is None


# --- the bodies -----------------------------------------------------------------------------------


def test_chat_completions_sends_the_instruct_messages_and_the_budget_as_max_tokens() -> None:
    api = judge_api(
        "chat_completions",
        {"model": "m", "max_output_tokens": 64, "instructions": "Be terse."},
        prompt=shipped(),
    )
    body = api.body(CALL)
    system, user = shipped().messages(HISTORY, "be correct", "four", "It is 4.")
    assert body["messages"] == [
        # one system message: templates that take one take no second
        {"role": "system", "content": "Be terse.\n\n" + system["content"]},
        user,
    ]
    assert (body["max_tokens"], body["stream"], body["model"]) == (77, False, "m")
    assert "max_output_tokens" not in body
    assert not api.custom_roles


def test_the_responses_api_sends_the_instruct_messages_as_input() -> None:
    api = judge_api("openai_responses", {"max_output_tokens": 64}, prompt=shipped())
    body = api.body(CALL)
    shown = shipped().messages(HISTORY, "be correct", "four", "It is 4.")
    assert body["input"] == [{**m, "type": "message"} for m in shown]
    assert body["max_output_tokens"] == 77
    assert not api.custom_roles
    assert judge_api("openai_responses", {}).custom_roles


@pytest.mark.parametrize("api", ["chat_completions", "openai_responses", "genrm_model"])
def test_structured_output_asks_for_the_verdict_schema(api: JudgeApiName) -> None:
    body = judge_api(api, {"text": {"verbosity": "low"}}, structured_output=True).body(CALL)
    schema = {"name": "verdict", "schema": VERDICT_JSON_SCHEMA, "strict": True}
    if api == "chat_completions":
        assert body["response_format"] == {"type": "json_schema", "json_schema": schema}
    else:
        assert body["text"] == {
            "verbosity": "low",
            "format": {"type": "json_schema", **schema},
        }
    # a verdict the schema allows is one the parser reads
    verdict = json.dumps({"score_1": 5, "score_2": 1, "ranking": 6})
    assert tuple(
        parse_overall(verdict, default_score=3, default_ranking=3.5, validate_range=True)
    ) == (5, 1, 6)


def test_each_api_owns_its_budget_key_and_its_fix_text() -> None:
    assert {name: kind.budget_key for name, kind in JUDGE_APIS.items()} == {
        "chat_completions": "max_tokens",
        "openai_responses": "max_output_tokens",
        "genrm_model": "max_output_tokens",
    }
    for name, kind in JUDGE_APIS.items():
        assert judge_api(name, {}).body(CALL)[kind.budget_key] == 77
        assert unread_fix(name) == kind.unread_fix
    assert "set judge.api: chat_completions" in GenRMModelApi.unread_fix
    for kind in (ChatCompletionsApi, OpenAIResponsesApi):
        assert kind.unread_fix.endswith("for any other model set judge.prompt: instruct")
    assert unread_fix("responses") == GenRMModelApi.unread_fix  # the earlier name


# --- refused for the roles ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "body", "refused"),
    [
        # OpenAI's refusal of an unknown role
        (
            400,
            b'{"error": {"message": "Invalid value: \'response_1\'. Supported values are: '
            b"'system', 'assistant', 'user', 'function', 'tool', and 'developer'.\", "
            b'"type": "invalid_request_error", "param": "messages[3].role", '
            b'"code": "invalid_value"}}',
            True,
        ),
        # a strict chat template's raise_exception, as vLLM reports it
        (400, b'{"object": "error", "message": "unknown role: principle"}', True),
        (500, b'{"detail": "unknown role: response_2"}', True),
        # an outage, a proxy, transformers serve's bare 500: nothing says roles
        (500, b"Internal Server Error", False),
        (503, b"unknown role: response_1", False),
        (429, b"rate limited", False),
    ],
)
def test_a_reply_refuses_the_roles_only_when_it_names_one(
    status: int, body: bytes, refused: bool
) -> None:
    assert roles_refused(status, body) is refused
