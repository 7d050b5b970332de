"""The judge's context window (docs/configuration.md, "The context window"). Pure: no I/O.

A judge call asks for its prompt plus an output budget, and a server refuses with HTTP 400 when
the two do not fit its window. `context_overflow` reads that refusal in each of its forms:

- vLLM, the budget too large: `'max_tokens' or 'max_completion_tokens' is too large: 2048.
  This model's maximum context length is 3000 tokens and your request has 1033 input tokens
  (2048 > 3000 - 1033).`
- vLLM, the input alone too long: `This model's maximum context length is 3000 tokens. However,
  your request has 3100 input tokens. Please reduce the length of the input messages.`
- vLLM before 0.6 (and OpenAI's older text): `... However, you requested 3081 tokens (1033 in
  the messages, 2048 in the completion). Please reduce the length of the messages or
  completion.`, and `... However, you requested 3100 tokens in the messages, Please reduce the
  length of the messages.`
- OpenAI: code `context_length_exceeded`, `... However, your messages resulted in 130000
  tokens. Please reduce the length of the messages.`; OpenRouter: `This endpoint's maximum
  context length is 8192 tokens. However, you requested about 12000 tokens (10000 of text
  input, 2000 in the output). ...`

`fitted_budget` is the budget an attempt may ask for: `min(budget, window - prompt - margin)`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Final, final

__all__ = [
    "CONTEXT_MARGIN_TOKENS",
    "ContextOverflow",
    "context_overflow",
    "estimate_prompt_tokens",
    "fitted_budget",
]

CONTEXT_MARGIN_TOKENS: Final = 16
"""Tokens kept free below the window: the chat template's own tokens, a tokenizer that counts a
few more than the estimate."""

BYTES_PER_TOKEN_ESTIMATE: Final = 3
"""Bytes a prompt token is taken to cover before the judge has reported any count: low (real
tokenizers average 3 to 5 on text), so the estimate errs long and the budget short."""

_WINDOW: Final = re.compile(r"maximum context length is (\d+) tokens")
_INPUT: Final = re.compile(
    r"your request has (\d+) input tokens"
    r"|\((\d+) in the messages"
    r"|you requested (\d+) tokens in the messages"
    r"|your messages resulted in (\d+) tokens"
    r"|\((\d+) of text input"
)
_BUDGET: Final = re.compile(r"is too large: (\d+)\.|, (\d+) in the (?:completion|output)\)")


@final
@dataclass(frozen=True, slots=True)
class ContextOverflow:
    """A refusal for the context window: its size and, where the server said them, the input
    tokens of the request and the budget it asked for."""

    window: int | None
    input_tokens: int | None
    budget: int | None

    def fits(self, margin: int = CONTEXT_MARGIN_TOKENS) -> int | None:
        """The largest budget that fits beside the stated input, or None when the reply does
        not state both the window and the input (or nothing fits)."""
        if self.window is None or self.input_tokens is None:
            return None
        room = self.window - self.input_tokens - margin
        return room if room > 0 else None

    def describe(self) -> str:
        """The numbers, for the failure reason."""
        parts = []
        if self.window is not None:
            parts.append(f"window {self.window} tokens")
        if self.input_tokens is not None:
            parts.append(f"prompt {self.input_tokens} tokens")
        if self.budget is not None:
            parts.append(f"output budget {self.budget} tokens")
        return ", ".join(parts) or "the judge's context window"


def _message(body: bytes) -> tuple[str, str | None]:
    """The error message and code of an OpenAI-style error body (`{"error": {"message",
    "code"}}` or vLLM's older flat `{"message"}`); the raw text when it is not JSON."""
    text = body.decode("utf-8", errors="replace")
    try:
        payload = json.loads(text)
    except ValueError:
        return text, None
    error = payload.get("error", payload) if isinstance(payload, dict) else None
    if not isinstance(error, dict):
        return text, None
    message, code = error.get("message"), error.get("code")
    return (
        message if isinstance(message, str) else text,
        code if isinstance(code, str) else None,
    )


def _first(match: re.Match[str] | None) -> int | None:
    if match is None:
        return None
    return int(next(group for group in match.groups() if group is not None))


def context_overflow(status: int, body: bytes) -> ContextOverflow | None:
    """The context-window refusal `body` (HTTP `status`) states, or None when it is none."""
    if status != 400:
        return None
    message, code = _message(body)
    window = _first(_WINDOW.search(message))
    if window is None and code != "context_length_exceeded":
        return None
    return ContextOverflow(window, _first(_INPUT.search(message)), _first(_BUDGET.search(message)))


def estimate_prompt_tokens(prompt_bytes: int) -> int:
    """Prompt tokens of a prompt of `prompt_bytes` bytes, before the judge reported a count."""
    return -(-prompt_bytes // BYTES_PER_TOKEN_ESTIMATE)


def fitted_budget(
    budget: int, window: int, prompt_tokens: int, margin: int = CONTEXT_MARGIN_TOKENS
) -> int:
    """`min(budget, window - prompt_tokens - margin)`, at least 1 (a prompt that leaves no room
    is the server's to refuse, with the numbers)."""
    return max(1, min(budget, window - prompt_tokens - margin))
