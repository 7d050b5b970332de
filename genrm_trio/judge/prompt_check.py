"""Does the judge take the prompt it is sent? (docs/operations.md, "The judge refuses the GenRM
roles"). Pure: no I/O.

A judge sent the GenRM roles (`judge.prompt: genrm`) that is not a GenRM model either refuses
them (a hosted API's 400 naming `response_1`, a strict chat template's error) or lets them
through without the judging instructions, and then answers in prose: no verdict, every
comparison a parse-failure fallback. `PromptCheck` watches one replica: the first refusal that
names a role, or `NO_VERDICT_REPLIES` completed replies in a row without a verdict before any
had one, is its `finding` (the start-up probe, `answer_probe`, finds a bare 500 for the roles).
"""

from __future__ import annotations

from typing import Final, final

from genrm_trio.domain.verdict import SCORE_KEYS, VerdictParseError, parse_overall
from genrm_trio.judge.apis import roles_refused
from genrm_trio.judge.base import one_line
from genrm_trio.judge.comparison import READ_OFF_LOOP_CHARS

__all__ = ["NO_VERDICT_REPLIES", "PROMPT_FIX", "PromptCheck"]

NO_VERDICT_REPLIES: Final = 8
"""Completed replies without a verdict, before any with one, that make a replica's finding."""

PROMPT_FIX: Final = (
    "set judge.prompt: instruct (a system and a user message any instruct model reads)"
)
"""What to change, said after the finding."""


@final
class PromptCheck:
    """One replica's evidence: `finding` is the first reason found (None while none is)."""

    __slots__ = ("_verdicts", "_without", "finding")

    def __init__(self) -> None:
        self.finding: str | None = None
        self._verdicts = False  # a reply had a verdict: the judge understands the prompt
        self._without = 0

    def observe_error(self, status: int, body: bytes) -> str | None:
        """Note an error reply; the reason, when it is the first to show a refusal of the
        roles."""
        if self.finding is not None or not roles_refused(status, body):
            return None
        text = body.decode("utf-8", errors="replace")
        return self._found(f"it refused the GenRM roles: HTTP {status}: {one_line(text, 300)}")

    @property
    def watching(self) -> bool:
        """Whether replies are still evidence: no verdict yet, no finding yet."""
        return not self._verdicts and self.finding is None

    def observe_text(self, text: str) -> str | None:
        """`observe_reply` for a completed reply's text: whether it holds any verdict at all
        (any `score_1`, `score_2` or `ranking`, in any range). Parsed only while `watching`.
        A text longer than `READ_OFF_LOOP_CHARS` is not parsed: this runs on the event loop
        (its comparison parses it in a worker thread), and a reply that names a verdict key is
        evidence enough that the judge read its instructions."""
        if not self.watching:
            return None
        if len(text) > READ_OFF_LOOP_CHARS:
            return self.observe_reply(any(key in text for key in SCORE_KEYS))
        try:
            parse_overall(text, default_score=3.0, default_ranking=3.5, validate_range=False)
        except VerdictParseError:
            return self.observe_reply(False)
        return self.observe_reply(True)

    def observe_reply(self, verdict: bool) -> str | None:
        """Note a completed reply and whether it held a verdict; the reason, when it is the
        `NO_VERDICT_REPLIES`-th without one before any had one."""
        if verdict:
            self._verdicts = True
            return None
        if self._verdicts or self.finding is not None:
            return None
        self._without += 1
        if self._without < NO_VERDICT_REPLIES:
            return None
        return self._found(
            f"its first {self._without} completed replies held no verdict: it answers in prose"
        )

    def refused(self, reason: str) -> str | None:
        """The start-up probe's finding (`answer_probe.RolesRefused`)."""
        if self.finding is not None:
            return None
        return self._found(f"it refused the GenRM roles: {reason}")

    def _found(self, reason: str) -> str:
        self.finding = reason
        return reason
