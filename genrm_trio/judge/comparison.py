"""One comparison's attempts, as a small object: what the next attempt asks (`next_call`), what
an error or a reply of it means (`on_error`, `on_reply`), and how the comparison ends (`result`)
when every attempt is spent. `Comparator.compare` (judge/attempts.py) drives it, and owns the
slots, the per-attempt deadline and the sleeps between attempts; this module does no I/O.
Parsing a reply (`Comparison.read`, a `ReplyReading`) is apart from judging it (`on_reply`), so
that the Comparator can parse a long reply in a worker thread (docs/reliability.md, "Security").

All A = `genrm_parse_retries + 1` attempts share one budget across transport errors, retryable
HTTP statuses, unusable replies and parse failures (docs/configuration.md, "Verdicts and
retries"). With `judge.budget_escalation` set, an attempt that ran out of its output budget makes
the next attempt ask for `min(ceil(budget x factor), cap)` (docs/scoring.md, section 6).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, NoReturn, assert_never, final

from genrm_trio.config import OUTPUT_BUDGET_PARAM, Settings
from genrm_trio.domain.context_window import context_overflow
from genrm_trio.domain.verdict import Verdict, VerdictParseError, parse_overall, parse_rubric
from genrm_trio.judge.apis import JudgePromptError
from genrm_trio.judge.base import (
    AttemptTicket,
    ComparisonResult,
    JudgeAttemptError,
    JudgeBadJSON,
    JudgeCall,
    JudgeError,
    JudgeHTTPError,
    JudgeReply,
    JudgeStalled,
    JudgeTimeout,
    ReplyStatus,
    Usage,
    one_line,
)
from genrm_trio.judge.context import ContextFit, JudgeContextOverflow
from genrm_trio.judge.events import AttemptEvents

log = logging.getLogger("genrm_trio.judge")

__all__ = ["READ_OFF_LOOP_CHARS", "Comparison", "ComparisonRules", "ReplyReading", "outcome_of"]


def outcome_of(error: JudgeAttemptError) -> tuple[str, str]:
    """(metric outcome, retry cause) of a failed attempt (an overflow and a prompt that does not
    render are never retried: their cause is never counted)."""
    match error:
        case JudgeHTTPError() if context_overflow(error.status, error.body) is not None:
            return "context_overflow", "context_overflow"
        case JudgeHTTPError():
            return "http_error", "http"
        case JudgeContextOverflow():
            return "context_overflow", "context_overflow"
        case JudgePromptError():
            return "prompt_error", "prompt_error"
        case JudgeTimeout():
            return "timeout", "timeout"
        case JudgeBadJSON():
            return "bad_json", "bad_json"
        case JudgeStalled():
            return "stalled", "stall"
        case _:  # JudgeTransportError, and any other attempt error (a bug) reported as one
            return "transport_error", "transport"


@final
class ComparisonRules:
    """What every comparison of a comparator follows, read once from its settings."""

    def __init__(
        self,
        settings: Settings,
        events: AttemptEvents,
        *,
        elsewhere: bool,
        endpoint: str,
        path: str,
    ) -> None:
        self.settings = settings
        self.events = events
        self.elsewhere = elsewhere  # several replicas: a replica's own failure is retried
        self.endpoint = endpoint  # the judge's, for a failure whose replica is unknown
        self.path = path
        self.attempts = settings.attempts
        self.timeout = settings.judge_request_timeout_s
        # the configured budget as given, for the log lines (also when it is not an integer)
        self.budget_tokens = settings.judge_create_params.get(OUTPUT_BUDGET_PARAM)
        self.budget = settings.output_budget  # every comparison's first attempt asks for this
        # each attempt's budget fitted into the judge's context window (judge/context.py)
        self.context = ContextFit(settings.judge.context_tokens, settings.judge.min_output_tokens)
        self.escalation = settings.judge.budget_escalation
        self.rubric = settings.score_source == "rubric_mean"
        self.defaults = Verdict(
            settings.default_score, settings.default_score, settings.default_ranking
        )

    def parse_overall(self, text: str) -> Verdict | None:
        settings = self.settings
        try:
            return parse_overall(
                text,
                default_score=settings.default_score,
                default_ranking=settings.default_ranking,
                validate_range=settings.validate_verdict_range,
            )
        except VerdictParseError:
            return None


READ_OFF_LOOP_CHARS: Final = 32_768
"""A reply whose text (with the cut text of a reply cut at its budget) is longer is parsed in a
worker thread. Measured (docs/reliability.md, "Security"): 32 KiB of the densest text
(`{}{}…`) takes 13 ms to parse, 32 KiB of prose 0.1 ms, and a thread hand-off 0.15 ms; a
normal verdict reply (a few KiB) stays on the loop."""


@final
@dataclass(frozen=True, slots=True)
class ReplyReading:
    """The verdicts parsed from one reply: its overall verdict (of the cut text for a reply cut
    at its budget) and, with `score_source: rubric_mean`, its rubric verdict; None where none
    parses."""

    overall: Verdict | None
    rubric: Verdict | None


_UNREAD: Final = ReplyReading(None, None)


@final
class Comparison:
    """One comparison's attempts (module docstring): `next_call` before each, then `on_error`
    or `on_reply` with what it got, and `result` when all are spent."""

    __slots__ = (
        "_budget",
        "_budget_hits",
        "_call",
        "_completed_seen",
        "_cut_verdicts",
        "_escalations",
        "_judge_pass",
        "_last_overall",
        "_n",
        "_pair",
        "_previous",
        "_raised",
        "_rubric_ids",
        "_rules",
        "_start",
        "_tokens",
        "avoid",
        "retry_after",
    )

    def __init__(
        self,
        rules: ComparisonRules,
        call: JudgeCall,
        pair: tuple[int, int],
        judge_pass: int,
        rubric_ids: Sequence[int] | None,
    ) -> None:
        self._rules = rules
        self._call = call
        self._pair = pair
        self._judge_pass = judge_pass
        self._rubric_ids = rubric_ids
        self._n = 0  # the attempt under way (1-based)
        self._tokens: tuple[int, int] | None = None  # usage summed; None: none reported yet
        self._budget_hits = 0
        self._cut_verdicts = 0  # of those, replies cut after they had written a verdict
        self._completed_seen = False
        self._last_overall: Verdict | None = None  # parsed overall of the last attempt, if any
        # this attempt's output budget: the caller's, else the configured one
        budget = call.max_output_tokens if call.max_output_tokens is not None else rules.budget
        self._budget = budget
        self._start = budget
        self._raised: int | None = None  # the next attempt's escalated budget, once decided
        self._escalations = 0
        self._previous: AttemptTicket | None = None  # the last attempt's ticket
        self.retry_after: float | None = None  # the last failure's Retry-After, for the sleep
        self.avoid: str | None = None  # the replica whose failure caused this retry (failover)

    def next_call(self) -> JudgeCall:
        """The next attempt's call: its output budget (escalated when decided), the replica to
        avoid, and a ticket linked to the previous attempt's."""
        rules = self._rules
        self._n += 1
        self._last_overall = None
        raised = self._raised
        if raised is not None:
            # counted and logged when the escalated attempt really starts, not when decided
            log.info(
                "GenRM output budget escalated for pair %s (judge %d): attempt %d/%d asks "
                "for max_output_tokens %d -> %d",
                self._pair,
                self._judge_pass,
                self._n,
                rules.attempts,
                self._budget,
                raised,
            )
            self._budget, self._raised = raised, None
            self._escalations += 1
            rules.events.escalated()
        call = self._call
        budget = self._budget
        ticket = AttemptTicket(self._previous)
        self._previous = ticket
        return dataclasses.replace(
            call,
            max_output_tokens=rules.context.budget(
                call, budget if budget is not None else call.max_output_tokens
            ),
            avoid_replica=self.avoid,
            ticket=ticket,
        )

    def on_error(self, error: JudgeAttemptError) -> None:
        """The attempt failed: note what the retry needs, or raise the comparison's
        `JudgeError` when the failure is not retried or no attempt is left."""
        rules = self._rules
        n = self._n
        retryable = error.retryable or (error.retry_elsewhere and rules.elsewhere)
        if retryable and n < rules.attempts:
            self._retry(outcome_of(error)[1], error.describe())
            self.retry_after = error.retry_after if isinstance(error, JudgeHTTPError) else None
            self.avoid = error.replica
            return
        server = error.replica or rules.endpoint
        message = (
            f"GenRM judge {server} {rules.path} pair={self._pair} "
            f"deadline={rules.timeout}s: {error.describe()}"
        )
        rules.events.comparison_ended("failed")
        raise JudgeError(
            message, usage=self._usage(), attempts=n, escalations=self._escalations
        ) from error

    def held_past_deadline(self, why: str) -> NoReturn:
        """The judge's rate limit holds this attempt past the deadline (judge/limits.py): the
        comparison fails now, with `why`; the held attempt was never sent, so is none."""
        rules = self._rules
        rules.events.comparison_ended("failed")
        raise JudgeError(
            f"GenRM judge {rules.endpoint} {rules.path} pair={self._pair}: {why}",
            usage=self._usage(),
            attempts=self._n - 1,
            escalations=self._escalations,
        )

    def read(self, reply: JudgeReply) -> ReplyReading:
        """The verdicts `on_reply` needs of `reply`. Pure and safe in a worker thread: it reads
        only what this comparison and its rules hold, which nothing changes meanwhile."""
        rules = self._rules
        match reply.status:
            case ReplyStatus.BUDGET_EXHAUSTED:
                partial = reply.partial
                return ReplyReading(rules.parse_overall(partial) if partial.strip() else None, None)
            case ReplyStatus.UNUSABLE:
                return _UNREAD
            case ReplyStatus.COMPLETED:
                overall = rules.parse_overall(reply.text)
                if not rules.rubric:
                    return ReplyReading(overall, None)
                assert self._rubric_ids is not None
                try:
                    rubric: Verdict | None = parse_rubric(
                        reply.text,
                        expected_ids=self._rubric_ids,
                        validate_range=rules.settings.validate_verdict_range,
                    )
                except VerdictParseError:
                    rubric = None
                return ReplyReading(overall, rubric)
            case _:
                assert_never(reply.status)

    def on_reply(self, reply: JudgeReply, reading: ReplyReading) -> ComparisonResult | None:
        """The attempt got a reply, and `reading` is `read(reply)`: the comparison's result when
        it holds a verdict, else None (the next attempt follows, if any is left: `result`
        otherwise)."""
        self.avoid = None
        self.retry_after = None
        self._rules.context.observe(self._call, reply)
        if reply.input_tokens is not None and reply.output_tokens is not None:
            used_in, used_out = self._tokens or (0, 0)
            self._tokens = (used_in + reply.input_tokens, used_out + reply.output_tokens)
        match reply.status:
            case ReplyStatus.BUDGET_EXHAUSTED:
                self._cut(reply, holds=reading.overall is not None)
                cause = "budget"
            case ReplyStatus.UNUSABLE:
                cause = "unusable"
            case ReplyStatus.COMPLETED:
                self._completed_seen = True
                result = self._verdict(reading)
                if result is not None:
                    return result
                cause = "parse"
            case _:
                assert_never(reply.status)
        if self._n < self._rules.attempts:
            self._retry(cause, cause)
        return None

    def _cut(self, reply: JudgeReply, *, holds: bool) -> None:
        """A reply cut at the output budget: a WARNING, and the next budget when escalating."""
        rules = self._rules
        self._budget_hits += 1
        # A cut reply is never a completed answer (the reference's rule), even when it holds a
        # verdict; the line says which it was.
        self._cut_verdicts += holds
        budget = self._budget
        log.warning(
            "GenRM output budget exhausted for pair %s (attempt %d/%d, "
            "max_output_tokens=%s): %s and %s",
            self._pair,
            self._n,
            rules.attempts,
            budget if budget is not None else rules.budget_tokens,
            reply.cut_by or "response is incomplete (reason=max_output_tokens)",
            "holds a verdict, which a reply cut at the budget does not count as"
            if holds
            else "contains no verdict",
        )
        if rules.escalation is not None and budget is not None and self._n < rules.attempts:
            after = rules.escalation.next_budget(budget)
            self._raised = after if after > budget else None  # at the cap: retry as it is

    def _verdict(self, reading: ReplyReading) -> ComparisonResult | None:
        """The result of a completed reply's reading, or None when it holds no verdict."""
        rules = self._rules
        overall = reading.overall
        if not rules.rubric:
            if overall is None:
                return None
            rules.events.comparison_ended("verdict")
            return ComparisonResult(
                overall, overall, self._usage(), False, False, self._n, self._escalations
            )
        self._last_overall = overall
        selected = reading.rubric
        if selected is None:
            return None
        rules.events.comparison_ended("verdict")
        return ComparisonResult(
            selected,
            overall if overall is not None else rules.defaults,
            self._usage(),
            overall is None,
            False,
            self._n,
            self._escalations,
        )

    def result(self) -> ComparisonResult:
        """Every attempt is spent without a verdict: the default-score fallback when a completed
        reply was seen, else the comparison's `JudgeError`."""
        rules = self._rules
        total = rules.attempts
        if self._completed_seen:
            log.warning(
                "GenRM %s parse failed for pair %s after %d attempts; using defaults",
                rules.settings.score_source,
                self._pair,
                total,
            )
            rules.events.comparison_ended("fallback")
            last = self._last_overall
            return ComparisonResult(
                selected=rules.defaults,
                overall=last if last is not None else rules.defaults,
                usage=self._usage(),
                overall_parse_failed=last is None,
                rubric_parse_failed=rules.rubric,
                attempts=total,
                escalations=self._escalations,
            )
        message = f"Judge returned no completed answer after {total} attempts"
        if self._budget_hits:
            message += self._budget_note()
        rules.events.comparison_ended("failed")
        raise JudgeError(
            message, usage=self._usage(), attempts=total, escalations=self._escalations
        )

    def _budget_note(self) -> str:
        """The reference's text on exhausted budgets; with escalation, the budgets tried."""
        hits, cut = self._budget_hits, self._cut_verdicts
        tried = f"={self._rules.budget_tokens}"
        if self._escalations:
            tried = f" from {self._start} up to {self._budget}"
        if cut:
            cuts = (
                f": {cut} cut after writing a verdict, which a reply cut at the budget does not "
                "count as"
            )
            if hits > cut:
                cuts += f", {hits - cut} without emitting one"
        else:
            cuts = " without emitting a verdict"
        return (
            f" ({hits} of them exhausted max_output_tokens{tried}{cuts}; raise the budget or "
            "constrain the judge's reasoning)"
        )

    def _usage(self) -> Usage | None:
        if self._tokens is None:
            return None
        return Usage(self._tokens[0], self._tokens[1], self._budget_hits > 0)

    def _retry(self, cause: str, why: str) -> None:
        self._rules.events.retried(cause)
        log.debug(
            "judge attempt %d/%d for pair %s (judge %d) failed (%s); retrying",
            self._n,
            self._rules.attempts,
            self._pair,
            self._judge_pass,
            one_line(why),
        )
