"""The judge boundary: one attempt in, one normalised reply or a typed error out.

A `Judge` performs exactly one HTTP exchange (or one simulated exchange) per `attempt()` call and
interprets the reply of its API (Responses or chat completions) into a `JudgeReply`. The errors
and results of a whole comparison (`JudgeError`, `ComparisonResult`) are defined here too;
the shared retry budget, pacing and parsing that produce them are `judge.attempts`.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Final, Protocol, final, runtime_checkable

from genrm_trio.domain.ratelimit import RateLimitHeaders
from genrm_trio.domain.verdict import Verdict

EXCERPT_BYTES: Final = 1000
"""How much of a judge's error body a failure reason quotes (redacted first: judge.client)."""


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
    # The replica the judge's rate limits admitted this attempt to (judge/limits.py): a fleet
    # sends it there, though the limits hold that replica for other calls (its trial call).
    prefer_replica: str | None = None
    # What this attempt's Comparator and a fleet tell each other (one per attempt of a fleet's
    # comparison; None for a single judge).
    ticket: AttemptTicket | None = field(default=None, compare=False, repr=False)


@final
class AttemptTicket:
    """One attempt, as its `Comparator` and a `JudgeFleet` see it. The fleet notes where the
    attempt went (`replica`) and what to do should it end by its own deadline; the Comparator,
    which owns that deadline (`judge_request_timeout_s`), says so (`deadline_expired`). A
    cancellation from outside (the group's deadline, a disconnect, a superseded group) is never
    reported: it is neither an answer nor a failure of the replica. So neither guesses."""

    __slots__ = ("_on_deadline", "forgive", "previous", "replica", "server_error")

    def __init__(self, previous: AttemptTicket | None = None) -> None:
        self.replica: str | None = None  # the fleet replica the attempt went to (its label)
        self._on_deadline: Callable[[JudgeAttemptError], None] | None = None
        # The same comparison's previous attempt (the Comparator links them; one link only):
        # a server error on two replicas in a row is the request's fault, not theirs.
        self.previous = previous
        if previous is not None:
            previous.previous = None
        self.server_error = False  # the fleet: this attempt ended in an HTTP 5xx
        # The fleet: undo what that 5xx counted against its replica, should it prove the
        # request's fault (None: nothing was counted)
        self.forgive: Callable[[], None] | None = None

    def went_to(self, replica: str, on_deadline: Callable[[JudgeAttemptError], None]) -> None:
        """The fleet: the attempt is on `replica`; call `on_deadline` if its deadline ends it."""
        self.replica = replica
        self._on_deadline = on_deadline

    def not_sent(self) -> None:
        """The Comparator: the attempt never reached a server and goes out again as the same
        attempt: where it went is forgotten, its link to the previous attempt kept (a 5xx the
        resend gets is weighed against that attempt's, `JudgeFleet._server_error`)."""
        self.replica = None
        self._on_deadline = None

    def deadline_expired(self, error: JudgeAttemptError) -> None:
        """The Comparator: the attempt's own deadline ended it (`error`, a `JudgeTimeout`)."""
        on_deadline, self._on_deadline = self._on_deadline, None
        if on_deadline is not None:
            on_deadline(error)


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
    # of output_tokens, the reasoning ones, where the API reports them (Responses
    # `output_tokens_details`, chat `completion_tokens_details`)
    reasoning_tokens: int | None = None
    # A budget-exhausted reply: what the API called the cut when it is not the Responses
    # `incomplete_details.reason=max_output_tokens` (chat: "finish_reason=length"), and the text
    # it was cut in (it may hold a verdict, which a cut reply still does not count as)
    cut_by: str | None = None
    partial: str = ""
    # what the reply's headers said of the judge's rate limits (None: nothing; judge/limits.py)
    rate_limit: RateLimitHeaders | None = None


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


PROBE_LIMIT_S = 5.0
"""A probe (`GET /models`: the start-up probe, judge/probe.py, and the outage's, judge/outage.py)
waits at most this long for each replica (the start-up one less when judge_request_timeout_s is).
"""


def one_line(text: str, limit: int = 1000) -> str:
    """`text` for a log line: every run of whitespace (CR, LF, tabs of an HTML error page) one
    space, cut at `limit` characters (marked with an ellipsis)."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def unreachable_note(seconds: float | None) -> str:
    """What a deadline failure adds while no judge replica can be reached (`seconds` since
    then; None: one can)."""
    return "" if seconds is None else f" (judge unreachable for {seconds:.0f}s)"


# --- per-attempt errors (mapped at the boundary, judge.client; never escape a comparison) -------


class JudgeAttemptError(Exception):
    """One attempt failed. `type_name` is the `{ErrorType}` of the judge-error template
    (docs/differences.md, D14)."""

    type_name: str = "JudgeAttemptError"
    retryable: bool = False
    # Retried, although not `retryable`, when the judge is a fleet of several replicas: the
    # failure belongs to the replica (its deadline, its certificate), not to the request.
    retry_elsewhere: bool = False
    replica: str | None = None  # the fleet replica (its label) the attempt went to, if any
    # False: the request never reached a server (its connection could not be opened: refused,
    # reset while connecting, a name that does not resolve). Such a call is no attempt of its
    # comparison when the judge waits out outages (`JudgeFleet.watched`).
    reached: bool = True

    def describe(self) -> str:
        """`{ErrorType}: {message}` exactly as D14 fixes it (message cut at 1000 chars)."""
        return f"{self.type_name}: {str(self)[:1000]}"


class JudgeTransportError(JudgeAttemptError):
    """Connect, read or write failure, or a connection closed before a complete response."""

    retryable = True

    def __init__(self, type_name: str, message: str, *, reached: bool = True) -> None:
        # type_name, whether it is retried and whether the request reached a server:
        # judge.client.TRANSPORT_ERRORS, the one table
        super().__init__(message)
        self.type_name = type_name
        self.reached = reached


class JudgeHTTPError(JudgeAttemptError):
    """A non-2xx status. Retryable for 408, 429 and 5xx (docs/differences.md, D14); a 429 is
    then sent again as no attempt, once the judge's rate limits admit it (judge/limits.py)."""

    type_name = "JudgeHTTPError"

    def __init__(self, status: int, body: bytes, retry_after: float | None = None) -> None:
        super().__init__(f"HTTP {status}")
        self.status = status
        self.body = body[:EXCERPT_BYTES]  # only the excerpt is ever shown
        self.retry_after = retry_after  # seconds, parsed from Retry-After when present
        self.rate_limit: RateLimitHeaders | None = None  # its rate-limit headers (a 429's)
        self.retryable = status in (408, 429) or 500 <= status <= 599
        self.hint: str | None = None  # what the client suspects, said after the reply

    def describe(self) -> str:
        text = f"{self.type_name}: HTTP {self.status}"
        if self.body:
            text += f"; response={self.body.decode('utf-8', errors='replace')}"
        if self.hint:
            text += f"; hint: {self.hint}"
        return text


class JudgeTimeout(JudgeAttemptError):
    """The per-attempt deadline (`judge_request_timeout_s`) expired. Not retried against the
    same judge (D14); retried on another replica of a fleet (D43)."""

    type_name = "TimeoutError"
    retry_elsewhere = True

    def __init__(self, timeout_s: float) -> None:
        super().__init__(f"judge attempt exceeded {timeout_s}s")


class JudgeStalled(JudgeAttemptError):
    """The fleet replica the attempt was on stalled (`judge.replica_stall_s`: calls in flight,
    none answered, while other replicas answered) and the attempt was cancelled. Retryable."""

    type_name = "ReplicaStalled"
    retryable = True


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
    stalls: int  # times taken out as stalled (`judge.replica_stall_s`); counted in ejections too
    back_in_s: float | None  # seconds until a trial attempt may go to it (ejected only)
    latency_sum_s: float  # summed over finished (not cancelled) attempts
    latency_count: int
    last_error: str | None  # `describe()` of the last retryable failure, cut at 200 characters
    # usage the replica reported, summed over its replies (reasoning: where the API reports it)
    input_tokens: int = 0
    output_tokens: int = 0
    reasoning_tokens: int = 0
    # judge.answer_check.AnswerCheck: why its prompt tokens show that the model does not read the
    # answers (None: no sign of it), and how many prompts showed it
    answers_unread: str | None = None
    prompts_unread: int = 0
    # judge/prompt_check.py: why the judge does not take the GenRM roles (None: no sign of it)
    roles_refused: str | None = None
    # attempts the replica refused for its context window (judge/context.py)
    context_overflows: int = 0


@runtime_checkable
class Probing(Protocol):
    """A judge that can tell whether its server is up without a judge call (`HttpJudge`:
    `GET {base_url}/models`)."""

    async def probe(self) -> str | None:
        """None when the server answered; else why not, on one line. Has no deadline of its
        own: the caller bounds it."""
        ...
