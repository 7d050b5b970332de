"""One comparison's shared retry budget: attempts, pacing, parsing, usage (docs/configuration.md,
"Verdicts and retries").

A `Comparator` turns one `JudgeCall` into a `ComparisonResult` or a `JudgeError`. Every attempt
takes a `judge.max_concurrency` slot (waiting for it is never a failed attempt), runs under its
own `trio.fail_after(judge_request_timeout_s)`, and gives the slot back before any retry sleep.
All A = `genrm_parse_retries + 1` attempts share one budget across transport errors, retryable
HTTP statuses, unusable replies and parse failures. Sleeps are plain `trio.sleep` calls under the
caller's cancel scope, so a group or `/compare` deadline ends them.

With a fleet of several replicas (`judge.fleet.JudgeFleet`), a failure that belongs to the replica
rather than to the request (the attempt's deadline, a certificate the replica's TLS trust
rejects, a stall) is retried too, on another replica (D43); each attempt carries an
`AttemptTicket`, through which the fleet says where it went and the Comparator says when its own
deadline ended it. A `Retry-After` holds back only the replica that sent it: the retry waits only
when every replica is holding back (D44).

Every attempt carries its output budget (`JudgeCall.max_output_tokens`, the configured one when
it is an integer). With `judge.budget_escalation` set, an attempt that ran out of it makes the
comparison's next attempt ask for `min(ceil(budget x factor), cap)`: retrying a reasoning judge
with the same budget fails again about as often as the first time (docs/scoring.md, section 6).
Other failures leave the budget where it is; the number of attempts is unchanged.
"""

from __future__ import annotations

import dataclasses
import logging
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, final

import trio

from genrm_trio.config import Settings
from genrm_trio.domain.ratelimit import RateLimitHeaders
from genrm_trio.domain.verdict import Verdict, VerdictParseError, parse_overall, parse_rubric
from genrm_trio.judge.base import (
    AttemptTicket,
    ComparisonResult,
    Judge,
    JudgeAttemptError,
    JudgeBadJSON,
    JudgeCall,
    JudgeError,
    JudgeHTTPError,
    JudgeReply,
    JudgeStalled,
    JudgeTimeout,
    JudgeTransportError,
    ReplicaReporting,
    ReplyStatus,
    Usage,
    one_line,
)
from genrm_trio.judge.limits import (
    JudgeLimits,
    RateLimitBeyondDeadline,
    RoutesAroundLimits,
    judge_limits,
)
from genrm_trio.judge.queue import JudgeQueue, QueueTicket, judge_queue
from genrm_trio.metrics import Metrics

log = logging.getLogger("genrm_trio.judge")

__all__ = ["MAX_BACKOFF_S", "RETRY_AFTER_JITTER", "Comparator", "ComparatorStatistics"]

MAX_BACKOFF_S: Final = 30.0
"""Cap of one exponential-backoff sleep (docs/differences.md, D13)."""

RETRY_AFTER_JITTER: Final = 0.1
"""A `Retry-After` wait is stretched by up to this fraction of itself, at random (D44), so that
the comparisons one 429 held back do not all come back in the same millisecond."""


@final
@dataclass(frozen=True, slots=True)
class ComparatorStatistics:
    """A snapshot of the comparator's work, for `Engine.statistics()` and `/cohorts`."""

    max_concurrency: int
    in_flight: int  # attempts holding a slot now
    queued: int  # attempts waiting for a slot now
    comparisons_active: int
    calls: int  # attempts started since the start
    retries: int
    comparisons: int  # comparisons finished (success or fallback)
    fallbacks: int  # comparisons that ended in the default-score fallback
    failures: int  # comparisons that ended in a JudgeError
    escalations: int  # attempts started with an escalated output budget
    unreached: int  # calls that reached no judge server (no attempts: the judge was down)


def _outcome(error: JudgeAttemptError) -> tuple[str, str]:
    """(metric outcome, retry cause) of a failed attempt."""
    if isinstance(error, JudgeHTTPError):
        return "http_error", "http"
    if isinstance(error, JudgeTimeout):
        return "timeout", "timeout"
    if isinstance(error, JudgeBadJSON):
        return "bad_json", "bad_json"
    if isinstance(error, JudgeStalled):
        return "stalled", "stall"
    if isinstance(error, JudgeTransportError):
        return "transport_error", "transport"
    return "transport_error", "transport"


class _JudgeDown(Exception):
    """No judge replica can be reached now: the call waits for one (`Comparator._reach`)."""


class _Throttled(Exception):
    """The judge answered 429: its replica is held (judge/limits.py) and the call goes again
    once the limits admit it; no attempt (`Comparator._reach`)."""

    def __init__(self, replica: str | None) -> None:
        super().__init__(replica)
        self.replica = replica


@final
class Comparator:
    """Runs comparisons against one judge with the settings' retry budget and pacing."""

    def __init__(
        self,
        judge: Judge,
        settings: Settings,
        metrics: Metrics,
        *,
        queue: JudgeQueue | None = None,
        limits: JudgeLimits | None = None,
        rng: random.Random | None = None,
    ) -> None:
        """`queue`: the judge queue every attempt takes a slot of, which `open_engine` builds
        and shares (None: one of its own, `judge_queue`, for a comparator used alone);
        `limits`: the judge's rate limits every attempt is admitted under (None: those
        `settings.judge` configures, `judge_limits`)."""
        self._judge = judge
        # A fleet: attempts carry tickets, and with several replicas a failure of the replica
        # (not of the request) is worth another attempt elsewhere.
        self._fleet = judge if isinstance(judge, ReplicaReporting) else None
        self._elsewhere = self._fleet is not None and len(self._fleet.replicas) > 1
        self._settings = settings
        self._metrics = metrics
        self._rng = rng if rng is not None else random.Random()
        self._queue = queue if queue is not None else judge_queue(judge, settings, metrics)
        if limits is None:
            replicas = self._fleet.replicas if self._fleet is not None else ()
            limits = judge_limits(settings, metrics, replicas)
        self._limits = limits
        if isinstance(judge, RoutesAroundLimits):
            # a fleet routes new calls away from the replicas a 429 holds
            judge.route_around(limits.closed)
        self._timeout = settings.judge_request_timeout_s
        self._attempts = settings.attempts
        params = settings.judge_create_params
        self._budget_tokens = params.get("max_output_tokens", params.get("max_tokens"))
        self._budget = settings.output_budget  # every comparison's first attempt asks for this
        self._escalation = settings.judge.budget_escalation
        self._rubric = settings.score_source == "rubric_mean"
        self._defaults = Verdict(
            settings.default_score, settings.default_score, settings.default_ranking
        )
        self._active = 0
        self._calls = 0
        self._retries = 0
        self._done = 0
        self._fallbacks = 0
        self._failures = 0
        self._escalations = 0
        self._unreached = 0

    @property
    def queue(self) -> JudgeQueue:
        """The `judge.max_concurrency` slots every attempt takes one of (judge/queue.py)."""
        return self._queue

    def statistics(self) -> ComparatorStatistics:
        queue = self._queue.statistics()
        return ComparatorStatistics(
            max_concurrency=queue.total,
            in_flight=queue.in_use,
            queued=queue.waiting,
            comparisons_active=self._active,
            calls=self._calls,
            retries=self._retries,
            comparisons=self._done,
            fallbacks=self._fallbacks,
            failures=self._failures,
            escalations=self._escalations,
            unreached=self._unreached,
        )

    # --- one attempt ----------------------------------------------------------------------

    async def _reach(self, call: JudgeCall, ticket: QueueTicket) -> JudgeReply:
        """One attempt that reached a judge server. While a watched fleet has no replica that
        can be reached it waits, holding no slot, for the fleet's probes to find one (bounded
        only by the caller's deadlines); a call whose connection could not be opened is no
        attempt: it is sent again, elsewhere or once the judge is back (docs/reliability.md,
        "A judge restart")."""
        fleet = self._fleet
        while True:
            if fleet is not None:
                await fleet.wait_reachable()
            try:
                return await self._attempt(call, ticket)
            except _JudgeDown:
                continue  # it went down while this call waited for its slot: not sent
            except _Throttled as throttled:
                # a 429 is no attempt: sent again once the limits admit it (judge/limits.py)
                if call.ticket is not None:
                    call.ticket.not_sent()
                if self._elsewhere:
                    call = dataclasses.replace(call, avoid_replica=throttled.replica)
                continue
            except JudgeAttemptError as error:
                if error.reached or fleet is None or not fleet.watched:
                    raise
                self._unreached += 1
                log.debug("judge call not sent (%s); not an attempt", one_line(error.describe()))
                if call.ticket is not None:
                    # the same attempt, sent again: it keeps its link to the attempt before it
                    call.ticket.not_sent()
                call = dataclasses.replace(call, avoid_replica=error.replica)

    def unreachable_for(self) -> float | None:
        """Seconds since no judge replica could be reached, or None (a judge that is not a
        fleet is never known to be unreachable)."""
        return None if self._fleet is None else self._fleet.unreachable_for()

    @property
    def limits(self) -> JudgeLimits:
        """The judge's rate limits every attempt is admitted under (judge/limits.py)."""
        return self._limits

    async def _attempt(self, call: JudgeCall, ticket: QueueTicket) -> JudgeReply:
        """One judge call admitted by the rate limits, then holding a concurrency slot, under
        the per-attempt deadline."""
        limits = self._limits
        permit = limits.try_admit(call)
        if permit is None:
            permit = await limits.admit(call, ticket)  # by priority too; no slot held
        if self._elsewhere and permit.label is not None:
            call = dataclasses.replace(call, prefer_replica=permit.label)
        try:
            await self._queue.acquire(ticket)  # by priority: complete groups first
            try:
                fleet = self._fleet
                if fleet is not None and fleet.watched and fleet.unreachable_for() is not None:
                    raise _JudgeDown
                reply = await self._timed_attempt(call)
            finally:
                self._queue.release()
        except JudgeHTTPError as error:
            if error.status == 429:
                said = error.rate_limit
                if said is None and error.retry_after is not None:
                    said = RateLimitHeaders(retry_after_s=error.retry_after)
                limits.rejected(permit, error.replica, said)
                raise _Throttled(error.replica) from error
            limits.answered(permit, error.replica, error.rate_limit, call, None, None)
            raise
        except JudgeBadJSON as error:
            limits.answered(permit, error.replica, None, call, None, None)
            raise
        finally:
            limits.release(permit)
        where = call.ticket.replica if call.ticket is not None else None
        limits.answered(
            permit, where, reply.rate_limit, call, reply.input_tokens, reply.output_tokens
        )
        return reply

    async def _timed_attempt(self, call: JudgeCall) -> JudgeReply:
        """The attempt itself (its slot held), under `judge_request_timeout_s`."""
        metrics = self._metrics
        started = trio.current_time()
        self._calls += 1
        try:
            with trio.fail_after(self._timeout):
                reply = await self._judge.attempt(call)
        except trio.TooSlowError:
            error: JudgeAttemptError = JudgeTimeout(self._timeout)
            metrics.judge_calls.labels(outcome="timeout").inc()
            if call.ticket is not None:  # a fleet: which replica hung, and that it did
                error.replica = call.ticket.replica
                call.ticket.deadline_expired(error)
            raise error from None
        except JudgeAttemptError as exc:
            metrics.judge_calls.labels(outcome=_outcome(exc)[0]).inc()
            raise
        else:
            metrics.judge_calls.labels(outcome=reply.status.value).inc()
            return reply
        finally:
            metrics.judge_attempt_seconds.observe(trio.current_time() - started)

    # --- pacing ---------------------------------------------------------------------------

    async def _sleep(self, retry: int, retry_after: float | None, ticket: QueueTicket) -> None:
        """The sleep before retry number `retry`, sized against the enclosing deadline, and
        sized again when the group's deadline, set during it (its last member arrived while an
        eager comparison slept), comes before the sleep's chosen end: a sleep never outlives a
        deadline set while it runs, so eager starts leave the rows as they would be without
        them (D48)."""
        if retry_after is not None and self._fleet is not None:
            # Held back is the replica that sent it: wait only when every replica is.
            retry_after = self._fleet.held_back_for()
        start = trio.current_time()
        wake = start + self._pause(retry, retry_after, trio.current_effective_deadline() - start)
        group = ticket.group
        if group.complete:
            await trio.sleep_until(wake)
            return
        with trio.move_on_at(wake) as sleep:
            await group.wait_complete()
        if sleep.cancelled_caught:
            return  # slept as chosen: the group was still collecting
        # read outside the sleep's own scope, whose deadline is `wake`
        deadline = trio.current_effective_deadline()
        if wake >= deadline:  # chosen before this deadline existed, and does not fit it
            wake = start + self._pause(retry, retry_after, deadline - start)
        await trio.sleep_until(wake)

    def _pause(self, retry: int, retry_after: float | None, left: float) -> float:
        """Seconds to sleep before retry number `retry` (1 = the first retry; D13, D44), with
        `left` seconds to the enclosing deadline: a `Retry-After` is honoured only if it fits."""
        if retry_after is not None:
            stretched = retry_after * (1.0 + self._rng.uniform(0.0, RETRY_AFTER_JITTER))
            if stretched < left:
                return stretched
            if retry_after < left:
                return retry_after
            log.debug("Retry-After %.3fs does not fit before the deadline; ignored", retry_after)
        base = self._settings.genrm_parse_retry_sleep_s
        if self._settings.retry_backoff == "exponential":
            return self._rng.uniform(0.0, min(MAX_BACKOFF_S, base * 2.0 ** (retry - 1)))
        return base

    # --- the comparison -------------------------------------------------------------------

    async def compare(
        self,
        call: JudgeCall,
        *,
        pair: tuple[int, int],
        judge_pass: int,
        expected_rubric_ids: Sequence[int] | None = None,
        ticket: QueueTicket | None = None,
    ) -> ComparisonResult:
        """Judge one pair within the shared budget; raise JudgeError when the comparison fails.

        Every attempt waits for its slot with ``ticket``, the comparison's place in the judge
        queue (None: one of a fresh complete group; `/compare` passes its batch's)."""
        if self._rubric and expected_rubric_ids is None:
            raise ValueError("score_source=rubric_mean requires expected_rubric_ids")
        self._active += 1
        try:
            place = ticket if ticket is not None else self._queue.ticket()
            result = await self._compare(call, pair, judge_pass, expected_rubric_ids, place)
        except JudgeError:
            self._failures += 1
            self._metrics.judge_comparisons.inc()
            raise
        finally:
            self._active -= 1
        self._done += 1
        self._metrics.judge_comparisons.inc()
        return result

    async def _compare(
        self,
        call: JudgeCall,
        pair: tuple[int, int],
        judge_pass: int,
        rubric_ids: Sequence[int] | None,
        ticket: QueueTicket,
    ) -> ComparisonResult:
        settings = self._settings
        total = self._attempts
        tokens_in = tokens_out = 0
        usage_seen = False
        budget_hits = 0
        cut_verdicts = 0  # of those, replies cut after they had written a verdict
        completed_seen = False
        retry_after: float | None = None
        avoid: str | None = None  # the replica whose failure caused this retry (failover)
        previous: AttemptTicket | None = None  # the last attempt's, in a fleet
        last_overall: Verdict | None = None  # parsed overall of the final attempt, if any
        # this attempt's output budget: the caller's, else the configured one
        budget = call.max_output_tokens if call.max_output_tokens is not None else self._budget
        start = budget
        raised: int | None = None  # the next attempt's escalated budget, once decided
        escalations = 0

        def usage() -> Usage | None:
            if not usage_seen:
                return None
            return Usage(tokens_in, tokens_out, budget_hits > 0)

        for n in range(1, total + 1):
            if n > 1:
                await self._sleep(n - 1, retry_after, ticket)
            retry_after = None
            last_overall = None
            if raised is not None:
                # counted and logged when the escalated attempt really starts, not when decided
                log.info(
                    "GenRM output budget escalated for pair %s (judge %d): attempt %d/%d asks "
                    "for max_output_tokens %d -> %d",
                    pair,
                    judge_pass,
                    n,
                    total,
                    budget,
                    raised,
                )
                budget, raised = raised, None
                escalations += 1
                self._escalations += 1
                self._metrics.judge_budget_escalations.inc()
            attempt_call = call
            if (
                (budget is not None and budget != call.max_output_tokens)
                or avoid is not None
                or self._fleet is not None
            ):
                attempt_call = dataclasses.replace(
                    call,
                    max_output_tokens=budget if budget is not None else call.max_output_tokens,
                    avoid_replica=avoid,
                    ticket=AttemptTicket(previous) if self._fleet is not None else None,
                )
                previous = attempt_call.ticket
            try:
                reply = await self._reach(attempt_call, ticket)
            except RateLimitBeyondDeadline as held:
                raise JudgeError(
                    f"GenRM judge {self._judge.endpoint} {self._judge.path} pair={pair}: {held}",
                    usage=usage(),
                    attempts=n - 1,
                    escalations=escalations,
                ) from None
            except JudgeAttemptError as error:
                retryable = error.retryable or (error.retry_elsewhere and self._elsewhere)
                if retryable and n < total:
                    cause = _outcome(error)[1]
                    self._retry(cause, pair, judge_pass, n, error.describe())
                    if isinstance(error, JudgeHTTPError):
                        retry_after = error.retry_after
                    avoid = error.replica
                    continue
                server = error.replica or self._judge.endpoint
                message = (
                    f"GenRM judge {server} {self._judge.path} pair={pair} "
                    f"deadline={self._timeout}s: {error.describe()}"
                )
                raise JudgeError(
                    message, usage=usage(), attempts=n, escalations=escalations
                ) from error

            avoid = None
            if reply.input_tokens is not None and reply.output_tokens is not None:
                usage_seen = True
                tokens_in += reply.input_tokens
                tokens_out += reply.output_tokens

            if reply.status is ReplyStatus.BUDGET_EXHAUSTED:
                budget_hits += 1
                # A cut reply is never a completed answer (the reference's rule), even when it
                # holds a verdict; the line says which it was.
                holds = self._holds_verdict(reply.partial)
                cut_verdicts += holds
                log.warning(
                    "GenRM output budget exhausted for pair %s (attempt %d/%d, "
                    "max_output_tokens=%s): %s and %s",
                    pair,
                    n,
                    total,
                    budget if budget is not None else self._budget_tokens,
                    reply.cut_by or "response is incomplete (reason=max_output_tokens)",
                    "holds a verdict, which a reply cut at the budget does not count as"
                    if holds
                    else "contains no verdict",
                )
                cause = "budget"
                if self._escalation is not None and budget is not None and n < total:
                    after = self._escalation.next_budget(budget)
                    raised = after if after > budget else None  # at the cap: retry as it is
            elif reply.status is ReplyStatus.UNUSABLE:
                cause = "unusable"
            else:
                completed_seen = True
                try:
                    overall = parse_overall(
                        reply.text,
                        default_score=settings.default_score,
                        default_ranking=settings.default_ranking,
                        validate_range=settings.validate_verdict_range,
                    )
                except VerdictParseError:
                    overall = None
                if not self._rubric:
                    if overall is not None:
                        return ComparisonResult(
                            overall, overall, usage(), False, False, n, escalations
                        )
                else:
                    assert rubric_ids is not None
                    last_overall = overall
                    try:
                        selected = parse_rubric(
                            reply.text,
                            expected_ids=rubric_ids,
                            validate_range=settings.validate_verdict_range,
                        )
                    except VerdictParseError:
                        pass
                    else:
                        return ComparisonResult(
                            selected,
                            overall if overall is not None else self._defaults,
                            usage(),
                            overall is None,
                            False,
                            n,
                            escalations,
                        )
                cause = "parse"

            if n < total:
                self._retry(cause, pair, judge_pass, n, cause)

        if completed_seen:
            self._fallbacks += 1
            log.warning(
                "GenRM %s parse failed for pair %s after %d attempts; using defaults",
                settings.score_source,
                pair,
                total,
            )
            overall_verdict = last_overall if last_overall is not None else self._defaults
            return ComparisonResult(
                selected=self._defaults,
                overall=overall_verdict,
                usage=usage(),
                overall_parse_failed=last_overall is None,
                rubric_parse_failed=self._rubric,
                attempts=total,
                escalations=escalations,
            )
        message = f"Judge returned no completed answer after {total} attempts"
        if budget_hits:
            # the reference's text; with escalation it names the range of budgets tried
            tried = f"={self._budget_tokens}"
            if escalations:
                tried = f" from {start} up to {budget}"
            if cut_verdicts:
                cuts = (
                    f": {cut_verdicts} cut after writing a verdict, which a reply cut at the "
                    "budget does not count as"
                )
                if budget_hits > cut_verdicts:
                    cuts += f", {budget_hits - cut_verdicts} without emitting one"
            else:
                cuts = " without emitting a verdict"
            message += (
                f" ({budget_hits} of them exhausted max_output_tokens{tried}{cuts}; raise the "
                "budget or constrain the judge's reasoning)"
            )
        raise JudgeError(message, usage=usage(), attempts=total, escalations=escalations)

    def _holds_verdict(self, text: str) -> bool:
        """Whether a cut reply's text parses as an overall verdict."""
        if not text.strip():
            return False
        settings = self._settings
        try:
            parse_overall(
                text,
                default_score=settings.default_score,
                default_ranking=settings.default_ranking,
                validate_range=settings.validate_verdict_range,
            )
        except VerdictParseError:
            return False
        return True

    def _retry(self, cause: str, pair: tuple[int, int], judge_pass: int, n: int, why: str) -> None:
        self._retries += 1
        self._metrics.judge_retries.labels(cause=cause).inc()
        log.debug(
            "judge attempt %d/%d for pair %s (judge %d) failed (%s); retrying",
            n,
            self._attempts,
            pair,
            judge_pass,
            one_line(why),
        )
