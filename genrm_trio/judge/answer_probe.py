"""Does the judge read the answers, and does it take the GenRM roles? Ask it (docs/operations.md,
"The judge does not read the answers").

`probe_answers` sends one judge replica one comparison of a known prompt with two answers of very
different lengths (4 bytes and about 4 KiB) and an output budget of one token. A judge that shows
the model the answers reports a prompt of at least one token per `MAX_BYTES_PER_TOKEN` bytes of
them; one that does not (Gym's protocol at a plain server, a template that drops unknown roles)
reports the few tokens of the question alone. A refusal is told apart: one that names a GenRM
role, or that the same comparison sent with `judge.prompt: instruct` does not get, is the judge
refusing the roles. The per-prompt check of the workload's own replies (`AnswerCheck`) stays as
the second line.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, final

from genrm_trio.judge.answer_check import MAX_BYTES_PER_TOKEN
from genrm_trio.judge.apis import roles_refused
from genrm_trio.judge.base import (
    Judge,
    JudgeAttemptError,
    JudgeCall,
    JudgeHTTPError,
    JudgeReply,
    JudgeTransportError,
)

__all__ = [
    "PROBE_HISTORY",
    "AnswersRead",
    "AnswersUnread",
    "ProbeFailed",
    "ProbeOutcome",
    "RolesRefused",
    "probe_answers",
    "probe_call",
]

PROBE_HISTORY: Final = ({"role": "user", "content": "Is water wet? Answer in one sentence."},)
_ANSWERS: Final = (
    "Yes.",
    "No. " + "Water itself is not wet; wetness is what water does to other materials. " * 56,
)


@final
@dataclass(frozen=True, slots=True)
class AnswersRead:
    """The prompt holds the answers' tokens: the judge reads them."""

    prompt_tokens: int


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


ANSWER_BYTES: Final = sum(len(text.encode("utf-8")) for text in _ANSWERS)
"""The probe's two answers together."""


def probe_call() -> JudgeCall:
    """The comparison: one known prompt, two answers of very different lengths, one token."""
    return JudgeCall([dict(m) for m in PROBE_HISTORY], *_ANSWERS, None, max_output_tokens=1)


async def probe_answers(judge: Judge, *, instruct: Judge | None = None) -> ProbeOutcome:
    """Probe `judge` (one replica); `instruct`: the same replica with `judge.prompt:
    instruct`, to tell a refusal of the GenRM roles from any other (None: the judge does not
    send them). Bounded by the caller."""
    call = probe_call()
    try:
        reply = await _sent(judge, call)
    except JudgeHTTPError as error:
        return await _refused(error, call, instruct)
    except JudgeAttemptError as error:
        return ProbeFailed(error.describe())
    tokens = reply.input_tokens
    if tokens is None:
        return ProbeFailed("the judge reports no prompt tokens")
    if tokens * MAX_BYTES_PER_TOKEN >= ANSWER_BYTES:
        return AnswersRead(tokens)
    return AnswersUnread(
        f"the start-up probe's answers of {ANSWER_BYTES} bytes gave a prompt of {tokens} "
        f"tokens, fewer than they alone need (at most {MAX_BYTES_PER_TOKEN} bytes a token)"
    )


async def _sent(judge: Judge, call: JudgeCall) -> JudgeReply:
    """`judge.attempt(call)`, once more after a connection that broke (a transport error): the
    probe is no judge call with a retry budget, and one broken connection decides nothing."""
    try:
        return await judge.attempt(call)
    except JudgeTransportError:
        return await judge.attempt(call)


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
        await _sent(instruct, call)
    except JudgeAttemptError as other:  # refused either way: not the roles
        return ProbeFailed(f"{error.describe()}; with judge.prompt: instruct: {other.describe()}")
    return RolesRefused(
        f"{error.describe()}, and the same comparison with judge.prompt: instruct got an answer"
    )
