"""Does the judge read the answers? A check on the prompt tokens the judge reports (pure: no I/O).

A judge that is shown the two answers reports more prompt tokens for longer answers. One that is
not (Gym's `genrm_model` protocol sent to a plain OpenAI server, which never shows `metadata` to
the model; a chat template that drops unknown roles) reports the same count whatever the answers,
and its verdicts are about answers it never read. `AnswerCheck` watches the comparisons of each
prompt (the same history and principle, so the answers are the only difference) and finds it at
the first group whose answers differ enough in length (docs/operations.md, "The judge does not
read the answers"):

- two comparisons of one prompt whose answers differ by at least `MIN_DIFFERENCE_BYTES` bytes,
  with prompt-token counts that differ by less than one token per `MAX_BYTES_PER_TOKEN` bytes of
  that difference (equal counts, typically); or
- a comparison whose answers alone, at most `MAX_BYTES_PER_TOKEN` bytes a token, need more
  tokens than the whole prompt had (answers of at least `MIN_ANSWER_BYTES` bytes).

Both bounds are loose: real tokenizers average 3 to 5 bytes a token on text, so a judge that reads
the answers never comes near them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final, final

from genrm_trio.config import JUDGE_API_ALIASES
from genrm_trio.judge.apis import JUDGE_APIS

__all__ = [
    "MAX_BYTES_PER_TOKEN",
    "MIN_ANSWER_BYTES",
    "MIN_DIFFERENCE_BYTES",
    "AnswerCheck",
    "unread_fix",
]

MAX_BYTES_PER_TOKEN: Final = 32
"""More bytes than this a token is not text a tokenizer reads."""
MIN_DIFFERENCE_BYTES: Final = 256
"""Answers that differ by less are not compared: a few tokens either way prove nothing."""
MIN_ANSWER_BYTES: Final = 1024
"""Answers shorter than this are not held against the prompt's size."""
MAX_PROMPTS: Final = 256
"""Prompts remembered at once; past it the memory starts again (bounded, and the first groups
are the ones that matter)."""


def unread_fix(api: str | None) -> str:
    """What to change: the fix text of the `judge.api` object named `api` (`judge.apis`; a
    fleet built without naming its API gets the advice of every one)."""
    if api is None:
        return "; or ".join(kind.unread_fix for kind in JUDGE_APIS.values())
    return JUDGE_APIS[JUDGE_API_ALIASES.get(api, api)].unread_fix


def _size(text: str) -> int:
    return len(text.encode("utf-8", errors="surrogatepass"))


@final
class AnswerCheck:
    """The evidence, one judge (replica) at a time: `observe` every reply's prompt tokens;
    `finding` is the first reason found (None while none is), `prompts_unread` how many prompts
    showed it."""

    __slots__ = ("_seen", "finding", "prompts_unread")

    def __init__(self) -> None:
        # per prompt, keyed by the hash of its history and principle (not the texts, which
        # could hold megabytes per replica): its shortest and longest answers so far as
        # (answer bytes, prompt tokens), and whether it showed the answers unread already
        self._seen: dict[int, _Prompt] = {}
        self.finding: str | None = None
        self.prompts_unread = 0

    def observe(
        self,
        history: Sequence[dict[str, str]],
        principle: str | None,
        answers: tuple[str, str],
        prompt_tokens: int,
    ) -> str | None:
        """Note one reply; the reason, when this reply is the first to show that the judge does
        not read the answers (None otherwise, and on every later one)."""
        size = _size(answers[0]) + _size(answers[1])
        now = (size, prompt_tokens)
        key = hash((tuple((m.get("role"), m.get("content")) for m in history), principle))
        prompt = self._seen.get(key)
        if prompt is None:
            if len(self._seen) >= MAX_PROMPTS:
                self._seen.clear()
            prompt = self._seen[key] = _Prompt(now)
        elif prompt.unread:
            return None  # this prompt showed it already: nothing more to find in it
        reason = None
        if size >= MIN_ANSWER_BYTES and size > prompt_tokens * MAX_BYTES_PER_TOKEN:
            reason = (
                f"the prompt had {prompt_tokens} tokens, fewer than the {size} bytes of the two "
                f"answers alone need (at most {MAX_BYTES_PER_TOKEN} bytes a token)"
            )
        reason = reason or _no_growth(prompt.shortest, now) or _no_growth(prompt.longest, now)
        prompt.shortest = min(prompt.shortest, now)
        prompt.longest = max(prompt.longest, now)
        if reason is None:
            return None
        prompt.unread = True
        self.prompts_unread += 1
        if self.finding is not None:
            return None
        self.finding = reason
        return reason

    def probed(self, reason: str) -> str | None:
        """The start-up answer probe's finding (judge/answer_probe.py): the reason, unless one
        was found already."""
        if self.finding is not None:
            return None
        self.finding = reason
        return reason


@final
class _Prompt:
    __slots__ = ("longest", "shortest", "unread")

    def __init__(self, first: tuple[int, int]) -> None:
        self.shortest = first
        self.longest = first
        self.unread = False


def _no_growth(a: tuple[int, int], b: tuple[int, int]) -> str | None:
    """The reason, when two comparisons of one prompt show prompt tokens that do not grow with
    the answers."""
    (size_a, tokens_a), (size_b, tokens_b) = sorted((a, b))
    grown = size_b - size_a
    if grown < MIN_DIFFERENCE_BYTES or (tokens_b - tokens_a) * MAX_BYTES_PER_TOKEN >= grown:
        return None
    return (
        f"two comparisons of one prompt had {tokens_a} and {tokens_b} prompt tokens for answers "
        f"of {size_a} and {size_b} bytes: the prompt does not grow with the answers"
    )
