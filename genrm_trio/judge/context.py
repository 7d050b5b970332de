"""Each attempt's output budget fitted into the judge's context window, and what to do when the
judge refuses one for it (docs/configuration.md, "The context window"). No I/O: the Comparator
asks, this answers.

The window is `judge.context_tokens`, else what the start-up probe read from `GET /models`
(`max_model_len`), else what the first overflow reply states. A prompt's tokens are estimated
as `ceil(bytes / 3)` plus the largest overhead seen so far (a reply's prompt tokens minus its
estimate: the chat template's and the instruct prompt's own tokens): conservative for every
prompt at least as long as the shortest one seen, and the margin covers the rest.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, final

from genrm_trio.domain.context_window import (
    CONTEXT_MARGIN_TOKENS,
    ContextOverflow,
    context_overflow,
    estimate_prompt_tokens,
    fitted_budget,
)
from genrm_trio.judge.base import JudgeAttemptError, JudgeCall, JudgeHTTPError, JudgeReply

__all__ = ["CONTEXT_FIXES", "ContextFit", "JudgeContextOverflow", "Resend", "prompt_bytes"]

CONTEXT_FIXES: Final = (
    "fixes: a smaller genrm_responses_create_params.max_output_tokens, a judge with a longer "
    "context window (vLLM --max-model-len), or shorter answers"
)


class JudgeContextOverflow(JudgeAttemptError):
    """The judge refused the attempt for its context window and no budget that fits is worth a
    resend (failure kind `context_overflow`). Never retried: the same request overflows again."""

    type_name = "ContextOverflow"


@final
@dataclass(frozen=True, slots=True)
class Resend:
    """The one resend of an overflowed attempt: with this budget."""

    budget: int


def prompt_bytes(call: JudgeCall) -> int:
    """The bytes of what the comparison shows the judge: history, principle, both answers."""
    texts = [message.get("content", "") for message in call.history]
    texts += [call.principle or "", call.response_1, call.response_2]
    return sum(len(text.encode("utf-8", errors="surrogatepass")) for text in texts)


@final
class ContextFit:
    """One judge's window, as configured or learned, and the prompt-size estimate."""

    __slots__ = ("_min_output", "_overhead", "overflows", "window")

    def __init__(self, window: int | None, min_output_tokens: int) -> None:
        self.window = window
        self._min_output = min_output_tokens
        self._overhead = 0
        self.overflows = 0  # attempts the judge refused for the window

    def estimate(self, call: JudgeCall) -> int:
        """The prompt tokens of `call`, by the estimate above."""
        return estimate_prompt_tokens(prompt_bytes(call)) + self._overhead

    def budget(self, call: JudgeCall, budget: int | None) -> int | None:
        """The budget `call`'s attempt asks for: `min(budget, window - estimate - margin)`
        (`budget` as it is without a window or a budget)."""
        if self.window is None or budget is None:
            return budget
        return fitted_budget(budget, self.window, self.estimate(call))

    def observe(self, call: JudgeCall, reply: JudgeReply) -> None:
        """Learn the prompt overhead from a reply's prompt tokens."""
        if reply.input_tokens is not None:
            overhead = reply.input_tokens - estimate_prompt_tokens(prompt_bytes(call))
            self._overhead = max(self._overhead, overhead)

    def overflowed(self, error: JudgeAttemptError, budget: int | None) -> ContextOverflow | None:
        """The overflow `error` is (counted, and its window learned), or None."""
        if not isinstance(error, JudgeHTTPError):
            return None
        overflow = context_overflow(error.status, error.body)
        if overflow is None:
            return None
        self.overflows += 1
        if overflow.window is not None:
            known = self.window
            self.window = overflow.window if known is None else min(known, overflow.window)
        return overflow

    def resend(self, overflow: ContextOverflow, budget: int | None) -> Resend | None:
        """The resend's budget, when the reply stated the input tokens and what fits is at
        least `judge.min_output_tokens` and below the budget that overflowed."""
        fits = overflow.fits(CONTEXT_MARGIN_TOKENS)
        if fits is None or fits < self._min_output:
            return None
        asked = budget if budget is not None else overflow.budget
        if asked is not None and fits >= asked:
            return None  # the same request again: an overflow is never retried unchanged
        return Resend(fits)

    def failure(self, overflow: ContextOverflow, budget: int | None) -> JudgeContextOverflow:
        """The comparison's failure: the numbers and the fixes."""
        fits = overflow.fits(CONTEXT_MARGIN_TOKENS)
        if overflow.input_tokens is None:
            why = "the reply does not state the prompt's tokens"
        elif fits is None:
            why = "the prompt alone fills the window"
        else:
            why = f"{fits} tokens fit, below judge.min_output_tokens ({self._min_output})"
        asked = f" (asked for {budget})" if budget is not None and overflow.budget is None else ""
        return JudgeContextOverflow(
            f"the judge's context window is too small for this comparison: "
            f"{overflow.describe()}{asked}; {why}; {CONTEXT_FIXES}"
        )
