"""Does the judge read the answers, and does it take the GenRM roles? Ask it (docs/operations.md,
"The judge does not read the answers").

`probe_answers` sends one judge replica two comparisons of one known prompt, with a short and a
long answer pair, each with an output budget of one token: a judge that shows the model the
answers reports a prompt that grows with them (`answer_check.MAX_BYTES_PER_TOKEN` bytes a token
at most); one that does not (Gym's protocol at a plain server, a template that drops unknown
roles) reports the same count. A refusal of the request is told apart: one that names a GenRM
role, or that the same comparison sent with `judge.prompt: instruct` does not get, is the judge
refusing the roles. The per-prompt check of the workload's own replies (`AnswerCheck`) stays as
the second line.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, final

from genrm_trio.judge.answers import MAX_BYTES_PER_TOKEN
from genrm_trio.judge.apis import roles_refused
from genrm_trio.judge.base import Judge, JudgeAttemptError, JudgeCall, JudgeHTTPError

__all__ = [
    "PROBE_HISTORY",
    "AnswersRead",
    "AnswersUnread",
    "ProbeFailed",
    "ProbeOutcome",
    "RolesRefused",
    "probe_answers",
    "probe_calls",
]

PROBE_HISTORY: Final = ({"role": "user", "content": "Is water wet? Answer in one sentence."},)
_SHORT: Final = ("Yes.", "No.")
_LONG: Final = (
    "Yes. " + "Water wets what it touches, because its molecules cling to most surfaces. " * 24,
    "No. " + "Water itself is not wet; wetness is what it does to other materials. " * 24,
)


@final
@dataclass(frozen=True, slots=True)
class AnswersRead:
    """The prompt grew with the answers: the judge reads them."""

    short_tokens: int
    long_tokens: int


@final
@dataclass(frozen=True, slots=True)
class AnswersUnread:
    """The prompt did not grow with the answers."""

    reason: str


@final
@dataclass(frozen=True, slots=True)
class RolesRefused:
    """The judge refused the GenRM roles (`judge.prompt: instruct` is the fix)."""

    reason: str


@final
@dataclass(frozen=True, slots=True)
class ProbeFailed:
    """No answer either way (the judge is down, reports no usage, ...): the per-prompt check
    decides later."""

    reason: str


ProbeOutcome = AnswersRead | AnswersUnread | RolesRefused | ProbeFailed


def _size(pair: tuple[str, str]) -> int:
    return sum(len(text.encode("utf-8")) for text in pair)


def probe_calls() -> tuple[JudgeCall, JudgeCall]:
    """The two comparisons: a short and a long answer pair of one prompt, one output token."""
    history = [dict(message) for message in PROBE_HISTORY]
    return (
        JudgeCall(history, *_SHORT, None, max_output_tokens=1),
        JudgeCall(history, *_LONG, None, max_output_tokens=1),
    )


async def probe_answers(judge: Judge, *, instruct: Judge | None = None) -> ProbeOutcome:
    """Probe `judge` (one replica); `instruct`: the same replica with `judge.prompt:
    instruct`, to tell a refusal of the GenRM roles from any other (None: the judge does not
    send them). Bounded by the caller."""
    short, long = probe_calls()
    try:
        short_reply = await judge.attempt(short)
    except JudgeHTTPError as error:
        return await _refused(error, short, instruct)
    except JudgeAttemptError as error:
        return ProbeFailed(error.describe())
    try:
        long_reply = await judge.attempt(long)
    except JudgeAttemptError as error:
        return ProbeFailed(error.describe())
    tokens = (short_reply.input_tokens, long_reply.input_tokens)
    if tokens[0] is None or tokens[1] is None:
        return ProbeFailed("the judge reports no prompt tokens")
    grown = _size(_LONG) - _size(_SHORT)
    if (tokens[1] - tokens[0]) * MAX_BYTES_PER_TOKEN >= grown:
        return AnswersRead(tokens[0], tokens[1])
    return AnswersUnread(
        f"the start-up probe's answers of {_size(_SHORT)} and {_size(_LONG)} bytes gave "
        f"{tokens[0]} and {tokens[1]} prompt tokens: the prompt does not grow with the answers"
    )


async def _refused(error: JudgeHTTPError, call: JudgeCall, instruct: Judge | None) -> ProbeOutcome:
    """A refused probe: the roles' fault when the reply names one, or when the same comparison
    in the instruct messages gets through."""
    if instruct is None:
        return ProbeFailed(error.describe())
    if roles_refused(error.status, error.body):
        return RolesRefused(error.describe())
    if error.status not in (400, 422, 500):
        return ProbeFailed(error.describe())
    try:
        await instruct.attempt(call)
    except JudgeAttemptError:
        return ProbeFailed(error.describe())  # refused either way: not the roles
    return RolesRefused(
        f"{error.describe()}, and the same comparison with judge.prompt: instruct got an answer"
    )
