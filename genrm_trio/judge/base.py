"""The judge boundary: one attempt in, one normalised reply or a typed error out.

A `Judge` performs exactly one HTTP exchange (or one simulated exchange) per `attempt()` call and
interprets the reply of its API (Responses or chat completions) into a `JudgeReply`. The errors
and results of a whole comparison (`JudgeError`, `ComparisonResult`) are defined here too;
the shared retry budget, pacing and parsing that produce them are `judge.attempts`.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, final, runtime_checkable

from genrm_trio.domain.verdict import Verdict


@final
@dataclass(frozen=True, slots=True)
class JudgeCall:
    """What one comparison asks of the judge: the history, then the two answers in display order."""

    history: Sequence[dict[str, str]]  # [{"role": ..., "content": ...}], roles already validated
    response_1: str  # answer text (or the "None" placeholder) shown first
    response_2: str  # answer text shown second
    principle: str | None  # None unless use_principle is on (then request principle or default)
    # This attempt's output budget (`max_output_tokens`, chat `max_tokens`); None leaves the
    # configured create params alone. It travels with the attempt so a retry can ask for more.
    max_output_tokens: int | None = None
    # A fleet's replica (its label) that failed this comparison's previous attempt: the fleet
    # sends this attempt elsewhere when it can. Single judges ignore it.
    avoid_replica: str | None = None


class ReplyStatus(enum.Enum):
    """How one 2xx JSON reply was classified (docs/configuration.md, "Judge requests and
    replies")."""

    COMPLETED = "completed"  # completed status and a non-blank answer text
    BUDGET_EXHAUSTED = "budget_exhausted"  # incomplete because of max_output_tokens / length
    UNUSABLE = "unusable"  # null, {}, other statuses, no message, blank text


@final
@dataclass(frozen=True, slots=True)
class JudgeReply:
    """One 2xx JSON reply, interpreted by the judge's API."""

    status: ReplyStatus
    text: str  # the answer text (concatenated output_text / message content); "" when unusable
    input_tokens: int | None  # usage, when both counts were numbers (not booleans)
    output_tokens: int | None


class Judge(Protocol):
    """One judge attempt. Raises a `JudgeAttemptError` subclass for transport/status/JSON errors.

    Implementations take no timeout argument: the caller wraps each attempt in
    `trio.fail_after(judge_request_timeout_s)` and maps `trio.TooSlowError` itself.
    """

    @property
    def endpoint(self) -> str:
        """`host:port` of the judge, the `{server}` of the judge-error template (D14)."""
        ...

    @property
    def path(self) -> str:
        """The path actually posted, e.g. `/v1/responses` or `/v1/chat/completions`."""
        ...

    async def attempt(self, call: JudgeCall) -> JudgeReply: ...

    async def aclose(self) -> None: ...


def one_line(text: str, limit: int = 1000) -> str:
    """`text` for a log line: every run of whitespace (CR, LF, tabs of an HTML error page) one
    space, cut at `limit` characters (marked with an ellipsis)."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


# --- per-attempt errors (mapped at the boundary from httpx; never escape a comparison) ---------


class JudgeAttemptError(Exception):
    """One attempt failed. `type_name` is the `{ErrorType}` of the judge-error template
    (docs/differences.md, D14)."""

    type_name: str = "JudgeAttemptError"
    retryable: bool = False
    replica: str | None = None  # the fleet replica (its label) the attempt went to, if any

    def describe(self) -> str:
        """`{ErrorType}: {message}` exactly as D14 fixes it (message cut at 1000 chars)."""
        return f"{self.type_name}: {str(self)[:1000]}"


class JudgeTransportError(JudgeAttemptError):
    """Connect, read or write failure, or a connection closed before a complete response."""

    retryable = True

    def __init__(self, type_name: str, message: str) -> None:
        # type_name is one of ConnectError, ReadError, WriteError, RemoteProtocolError
        super().__init__(message)
        self.type_name = type_name


class JudgeHTTPError(JudgeAttemptError):
    """A non-2xx status. Retryable for 408, 429 and 5xx (docs/differences.md, D14)."""

    type_name = "JudgeHTTPError"

    def __init__(self, status: int, body: bytes, retry_after: float | None = None) -> None:
        super().__init__(f"HTTP {status}")
        self.status = status
        self.body = body[:1000]  # only the excerpt is ever shown
        self.retry_after = retry_after  # seconds, parsed from Retry-After when present
        self.retryable = status in (408, 429) or 500 <= status <= 599

    def describe(self) -> str:
        text = f"{self.type_name}: HTTP {self.status}"
        if self.body:
            text += f"; response={self.body.decode('utf-8', errors='replace')}"
        return text


class JudgeTimeout(JudgeAttemptError):
    """The per-attempt deadline (`judge_request_timeout_s`) expired. Not retryable (D14)."""

    type_name = "TimeoutError"

    def __init__(self, timeout_s: float) -> None:
        super().__init__(f"judge attempt exceeded {timeout_s}s")


class JudgeBadJSON(JudgeAttemptError):
    """A 2xx body that is not JSON. Not retryable (D14)."""

    type_name = "JSONDecodeError"


# --- the error that ends a comparison -----------------------------------------------------------


@final
@dataclass(frozen=True, slots=True)
class Usage:
    """Token usage summed over the attempts of one comparison that reported it."""

    input_tokens: int
    output_tokens: int
    budget_hit: bool  # any attempt was budget-exhausted


@final
@dataclass(frozen=True, slots=True)
class ComparisonResult:
    """One successful comparison, in display orientation: the caller flips it back
    when it showed the pair swapped. A default fallback is a success with a parse flag set."""

    selected: Verdict  # the overall verdict, or the rubric mean under score_source=rubric_mean
    overall: Verdict
    usage: Usage | None  # summed over attempts that reported usage; None when none did
    overall_parse_failed: bool
    rubric_parse_failed: bool
    attempts: int  # judge calls made
    escalations: int = 0  # attempts that asked for a larger output budget than the one before


class JudgeError(Exception):
    """A comparison failed: its full message (docs/configuration.md, "Verdicts and retries"),
    plus the usage its attempts reported.

    `usage` is None when no attempt reported usage; failed comparisons still count in the token
    metrics (docs/differences.md, D32).
    """

    def __init__(
        self,
        message: str,
        *,
        usage: Usage | None = None,
        attempts: int = 0,
        escalations: int = 0,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.usage = usage
        self.attempts = attempts
        self.escalations = escalations  # output-budget escalations before it failed


# --- judges made of several replicas ------------------------------------------------------


@final
@dataclass(frozen=True, slots=True)
class ReplicaStats:
    """One replica's counters, for `/metrics` (label `replica`) and `GET /judge/replicas`."""

    replica: str  # the label: `host:port`, or the base URL when two replicas share a host:port
    url: str  # the base URL
    calls: int  # attempts started
    failures: int  # attempts that failed retryably (what ejection counts)
    in_flight: int
    ejected: bool
    ejections: int  # times taken out
    consecutive_failures: int
    back_in_s: float | None  # seconds until a trial attempt may go to it (ejected only)
    latency_sum_s: float  # summed over finished (not cancelled) attempts
    latency_count: int
    last_error: str | None  # `describe()` of the last retryable failure, cut at 200 characters


@runtime_checkable
class ReplicaReporting(Protocol):
    """A judge that spreads its calls over replicas and reports each one (`JudgeFleet`); the
    engine and `/metrics` see it through this protocol only."""

    def replica_stats(self) -> list[ReplicaStats]: ...
