"""The instruct prompt `settings.judge` asks for (`judge.prompt`, `judge.prompt_template`): the
shipped template (package data beside `domain.prompt`) or the operator's file, read once and
checked at start (docs/configuration.md, "judge.prompt")."""

from __future__ import annotations

from importlib.resources import files
from typing import Final, assert_never

from genrm_trio.config import MAX_PROMPT_TEMPLATE_BYTES, ConfigError, JudgeSettings
from genrm_trio.domain.prompt import InstructPrompt, PromptTemplateError

__all__ = ["SHIPPED_TEMPLATE", "judge_prompt", "shipped_template"]

SHIPPED_TEMPLATE: Final = "instruct_prompt.jinja"
"""The shipped template's file name in the `genrm_trio.domain` package."""


def shipped_template() -> str:
    """The text of the shipped `judge.prompt: instruct` template."""
    return files("genrm_trio.domain").joinpath(SHIPPED_TEMPLATE).read_text(encoding="utf-8")


def judge_prompt(judge: JudgeSettings) -> InstructPrompt | None:
    """The instruct prompt of `judge` (None: `judge.prompt: genrm`, the GenRM roles). A template
    that cannot serve (too large, not UTF-8, not Jinja2, not showing both answers) raises
    `ConfigError` on its key, one line."""
    match judge.prompt:
        case "genrm":
            return None
        case "instruct":
            pass
        case _:
            assert_never(judge.prompt)
    path = judge.prompt_template
    if path is None:
        return InstructPrompt(shipped_template())
    key = "judge.prompt_template"
    try:
        with open(path, "rb") as file:
            raw = file.read(MAX_PROMPT_TEMPLATE_BYTES + 1)
    except OSError as exc:
        raise ConfigError("settings", key, f"{path}: {exc.strerror or exc}") from None
    if len(raw) > MAX_PROMPT_TEMPLATE_BYTES:
        raise ConfigError("settings", key, f"{path}: larger than {MAX_PROMPT_TEMPLATE_BYTES} bytes")
    try:
        return InstructPrompt(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ConfigError("settings", key, f"{path}: not UTF-8 ({exc.reason})") from None
    except PromptTemplateError as exc:
        raise ConfigError("settings", key, f"{path}: {exc}") from None
