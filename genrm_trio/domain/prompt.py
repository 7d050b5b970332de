"""The `judge.prompt: instruct` messages: a system and a user message that show any instruct
model the conversation, the principle and both answers and ask for the verdict genrm-trio
parses (docs/configuration.md, "judge.prompt"). Pure: the template's text comes in, messages
come out (loading it is `judge.prompts`).

A template is Jinja2, as chat templates are, rendered in a sandbox with undefined variables
refused. It has a `user` block (required) and a `system` block (optional), each rendered with
`PROMPT_VARIABLES`. A template must show both answers: `InstructPrompt` renders it once with
sentinel answers and refuses it otherwise, so a typo fails the start, not the training run.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final, final

import jinja2
from jinja2.sandbox import SandboxedEnvironment

__all__ = [
    "PROMPT_VARIABLES",
    "VERDICT_JSON_SCHEMA",
    "InstructPrompt",
    "PromptTemplateError",
]

PROMPT_VARIABLES: Final = ("history", "principle", "response_1", "response_2")
"""What a template may read: `history`, the conversation as a list of `{role, content}`;
`principle`, a string or None (None unless `use_principle` is on); `response_1` and
`response_2`, the answers in the order shown."""

VERDICT_JSON_SCHEMA: Final[dict[str, Any]] = {
    "type": "object",
    "properties": {
        "score_1": {"type": "integer", "minimum": 1, "maximum": 5},
        "score_2": {"type": "integer", "minimum": 1, "maximum": 5},
        "ranking": {"type": "integer", "minimum": 1, "maximum": 6},
    },
    "required": ["score_1", "score_2", "ranking"],
    "additionalProperties": False,
}
"""The overall verdict (docs/scoring.md, "Overall verdict") as a JSON schema, for
`judge.structured_output`."""

_SENTINELS: Final = ("@@genrm-trio response_1 sentinel@@", "@@genrm-trio response_2 sentinel@@")


class PromptTemplateError(ValueError):
    """A template that cannot serve: it does not compile, does not render, has no `user` block,
    or does not show both answers. The message is one line."""


@final
class InstructPrompt:
    """A compiled instruct template: `messages()` renders one comparison."""

    __slots__ = ("_system", "_template")

    def __init__(self, source: str) -> None:
        """Compile `source` and render it once with sentinel answers; `PromptTemplateError` if
        it cannot serve."""
        # the environment of Hugging Face chat templates (trim_blocks, lstrip_blocks), in a
        # sandbox: a template is configuration, not code genrm-trio trusts
        environment = SandboxedEnvironment(
            trim_blocks=True,
            lstrip_blocks=True,
            undefined=jinja2.StrictUndefined,
            autoescape=False,
        )
        try:
            template = environment.from_string(source)
        except jinja2.TemplateSyntaxError as exc:
            message = " ".join(str(exc.message).split())
            raise PromptTemplateError(f"line {exc.lineno}: {message}") from None
        if "user" not in template.blocks:
            raise PromptTemplateError("has no {% block user %}: the user message is that block")
        self._template = template
        self._system = "system" in template.blocks
        sample = [{"role": "user", "content": "a question"}]
        shown = "\n".join(m["content"] for m in self.messages(sample, "a principle", *_SENTINELS))
        for name, sentinel in zip(("response_1", "response_2"), _SENTINELS, strict=True):
            if sentinel not in shown:
                raise PromptTemplateError(
                    f"does not show {{{{ {name} }}}}: the judge would not read that answer"
                )

    def messages(
        self,
        history: Sequence[dict[str, str]],
        principle: str | None,
        response_1: str,
        response_2: str,
    ) -> list[dict[str, str]]:
        """The system message (when the template has that block) and the user message."""
        try:
            return self._render(history, principle, response_1, response_2)
        except (jinja2.TemplateError, ArithmeticError, LookupError, TypeError) as exc:
            # a template that rendered the sentinels can still trip on real data
            raise PromptTemplateError(" ".join(f"{type(exc).__name__}: {exc}".split())) from None

    def _render(
        self,
        history: Sequence[dict[str, str]],
        principle: str | None,
        response_1: str,
        response_2: str,
    ) -> list[dict[str, str]]:
        template = self._template
        context = template.new_context(
            {
                "history": [dict(message) for message in history],
                "principle": principle,
                "response_1": response_1,
                "response_2": response_2,
            }
        )
        messages = []
        if self._system:
            system = "".join(template.blocks["system"](context)).strip()
            if system:
                messages.append({"role": "system", "content": system})
        user = "".join(template.blocks["user"](context)).strip()
        messages.append({"role": "user", "content": user})
        return messages
