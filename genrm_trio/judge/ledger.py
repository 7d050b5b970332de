"""What a judge fleet's replicas did: the reply observer and the per-replica ledger.

The fleet (judge/fleet.py) tells every `ReplyObserver` registered with it (`JudgeFleet.observe`)
what became of each attempt on each replica, in httpcore's `Trace` style: a call per event, with
the replica, the call and what it got. Nothing else in the fleet counts. `ReplicaLedger` is the
observer behind `GET /judge/replicas` and the per-replica series of `/metrics`: calls, retryable
failures and the last one, latency, the usage each replica reported, and the check that its
prompt tokens grow with the answers (judge/answer_check.py), which logs one ERROR the first time a
replica shows that it does not read them.

What each counter counts (docs/http-api.md, `GET /judge/replicas`):

- `calls`: attempts sent to the replica. A call whose connection could not be opened while the
  fleet is watched is no attempt (it is sent again, `not_sent`): it is taken back;
- `failures`: attempts that failed retryably (transport error, 408, 5xx, the attempt's
  deadline, a stall; a 429 is none: it holds the replica, judge/limits.py), including a 5xx
  later found to be the request's fault; never a call that was not sent;
- latency: attempts that finished with an answer or an error (not cancelled ones, not timeouts).
"""

from __future__ import annotations

import logging
from typing import Protocol, assert_never, final

from genrm_trio.domain.context_window import context_overflow
from genrm_trio.judge.answer_check import AnswerCheck, unread_fix
from genrm_trio.judge.answer_probe import (
    AnswersRead,
    AnswersUnread,
    ProbeFailed,
    ProbeOutcome,
    RolesRefused,
)
from genrm_trio.judge.base import (
    JudgeAttemptError,
    JudgeCall,
    JudgeHTTPError,
    JudgeReply,
    ReplyStatus,
)
from genrm_trio.judge.prompt_check import PROMPT_FIX, PromptCheck
from genrm_trio.judge.routing import Replica

log = logging.getLogger("genrm_trio.judge")

__all__ = ["ReplicaCounts", "ReplicaLedger", "ReplyObserver"]


class ReplyObserver(Protocol):
    """Told what became of each attempt on each replica of a fleet (module docstring)."""

    def sent(self, replica: Replica) -> None:
        """An attempt went to `replica`."""
        ...

    def finished(
        self,
        replica: Replica,
        call: JudgeCall,
        seconds: float,
        reply: JudgeReply | None,
        error: JudgeAttemptError | None,
    ) -> None:
        """It came back after `seconds`: with `reply` (a 2xx JSON reply), or with `error` (an
        HTTP status, a transport error, a body that is not JSON)."""
        ...

    def failed(self, replica: Replica, error: JudgeAttemptError) -> None:
        """It failed retryably (after `finished`, or by its deadline or a stall)."""
        ...

    def not_sent(self, replica: Replica, error: JudgeAttemptError) -> None:
        """Its connection could not be opened and the fleet is watched: no attempt."""
        ...


@final
class ReplicaCounts:
    """One replica's counters (module docstring)."""

    __slots__ = (
        "answers",
        "calls",
        "context_overflows",
        "failures",
        "input_tokens",
        "last_error",
        "latency_count",
        "latency_sum",
        "output_tokens",
        "prompt",
        "reasoning_tokens",
    )

    def __init__(self) -> None:
        self.calls = 0
        self.failures = 0
        self.last_error: str | None = None
        self.latency_sum = 0.0
        self.latency_count = 0
        self.input_tokens = 0
        self.output_tokens = 0
        self.reasoning_tokens = 0
        self.answers = AnswerCheck()
        self.prompt = PromptCheck()  # does it take the GenRM roles (judge/prompt_check.py)
        self.context_overflows = 0  # attempts refused for the context window


@final
class ReplicaLedger:
    """The per-replica counters of a fleet, kept as a `ReplyObserver`; `api` is `judge.api`,
    named in the "does not read the answers" line; `sends_roles`: the judge is sent the GenRM
    roles (`judge.prompt: genrm` with an API that puts the answers in messages), so whether it
    takes them is watched (judge/prompt_check.py)."""

    def __init__(self, replicas: int, api: str | None, *, sends_roles: bool = False) -> None:
        self.counts = [ReplicaCounts() for _ in range(replicas)]
        self._api = api
        self._roles = sends_roles

    def sent(self, replica: Replica) -> None:
        self.counts[replica.index].calls += 1

    def finished(
        self,
        replica: Replica,
        call: JudgeCall,
        seconds: float,
        reply: JudgeReply | None,
        error: JudgeAttemptError | None,
    ) -> None:
        counts = self.counts[replica.index]
        counts.latency_sum += seconds
        counts.latency_count += 1
        if isinstance(error, JudgeHTTPError):
            self._refused(replica, counts, error)
        if reply is None:
            return
        if self._roles and reply.status is ReplyStatus.COMPLETED and counts.prompt.watching:
            self._roles_found(replica, counts.prompt.observe_text(reply.text))
        if reply.input_tokens is None or reply.output_tokens is None:
            return
        counts.input_tokens += reply.input_tokens
        counts.output_tokens += reply.output_tokens
        if reply.reasoning_tokens is not None:
            counts.reasoning_tokens += reply.reasoning_tokens
        answers = (call.response_1, call.response_2)
        reason = counts.answers.observe(call.history, call.principle, answers, reply.input_tokens)
        if reason is not None:
            log.error(
                "the judge does not read the answers (replica %s): %s. Fix: %s",
                replica.label,
                reason,
                unread_fix(self._api),
            )

    def _refused(self, replica: Replica, counts: ReplicaCounts, error: JudgeHTTPError) -> None:
        """An error status: a refusal for the context window, or of the GenRM roles."""
        if context_overflow(error.status, error.body) is not None:
            counts.context_overflows += 1
        elif self._roles:
            self._roles_found(replica, counts.prompt.observe_error(error.status, error.body))

    def _roles_found(self, replica: Replica, reason: str | None) -> None:
        """One ERROR, the first time `replica` shows it does not take the GenRM roles."""
        if reason is not None:
            log.error(
                "the judge does not take the GenRM roles (replica %s): %s. Fix: %s",
                replica.label,
                reason,
                PROMPT_FIX,
            )

    def probed(self, replica: Replica, outcome: ProbeOutcome) -> None:
        """What the answer probe (judge/answer_probe.py) found of `replica`."""
        counts = self.counts[replica.index]
        match outcome:
            case AnswersRead(tokens):
                log.info(
                    "judge replica %s reads the answers (the answer probe's prompt had %d tokens)",
                    replica.label,
                    tokens,
                )
            case AnswersUnread(reason):
                if counts.answers.probed(reason) is not None:
                    log.error(
                        "the judge does not read the answers (replica %s): %s. Fix: %s",
                        replica.label,
                        reason,
                        unread_fix(self._api),
                    )
            case RolesRefused(reason):
                self._roles_found(replica, counts.prompt.refused(reason))
            case ProbeFailed(reason):
                log.info(
                    "judge replica %s: the answer probe got no answer: %s", replica.label, reason
                )
            case _:
                assert_never(outcome)

    def failed(self, replica: Replica, error: JudgeAttemptError) -> None:
        counts = self.counts[replica.index]
        counts.failures += 1
        counts.last_error = error.describe()[:200]

    def not_sent(self, replica: Replica, error: JudgeAttemptError) -> None:
        counts = self.counts[replica.index]
        counts.calls -= 1  # counted when sent; it turned out to be no attempt
        counts.last_error = error.describe()[:200]
