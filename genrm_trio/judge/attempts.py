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

What one comparison's attempts ask and what their replies mean is a `Comparison`
(judge/comparison.py); the Comparator drives it and owns slots, deadlines and sleeps. It parses
a reply longer than `READ_OFF_LOOP_CHARS` in a worker thread (`Comparator._read`), one at a time:
parsing is linear but costs up to about 0.6 s per MB of brace-dense text, and a reply may be
`judge.max_response_bytes` (4 MiB) long. Every count
(`statistics()` and the Prometheus series) is one `AttemptEvents` (judge/events.py).
"""

from __future__ import annotations

import dataclasses
import logging
import random
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import Final, assert_never, final

import trio

from genrm_trio.config import Settings
from genrm_trio.domain.ratelimit import RateLimitHeaders
from genrm_trio.judge.base import (
    AttemptTicket,
    ComparisonResult,
    Judge,
    JudgeAttemptError,
    JudgeBadJSON,
    JudgeCall,
    JudgeHTTPError,
    JudgeReply,
    JudgeTimeout,
    one_line,
)
from genrm_trio.judge.comparison import (
    READ_OFF_LOOP_CHARS,
    Comparison,
    ComparisonRules,
    ReplyReading,
    outcome_of,
)
from genrm_trio.judge.events import AttemptEvents
from genrm_trio.judge.fleet import as_fleet
from genrm_trio.judge.limits import JudgeLimits, RateLimitBeyondDeadline, judge_limits
from genrm_trio.judge.offload import score_off_loop
from genrm_trio.judge.queue import JudgeQueue, QueueTicket, judge_queue
from genrm_trio.metrics import Metrics

log = logging.getLogger("genrm_trio.judge")

__all__ = ["MAX_BACKOFF_S", "RETRY_AFTER_JITTER", "Comparator", "ComparatorStatistics"]

MAX_BACKOFF_S: Final = 30.0
"""Cap of one exponential-backoff sleep (docs/differences.md, D13)."""

RETRY_AFTER_JITTER: Final = 0.1
"""A `Retry-After` wait is stretched by up to this fraction of itself, at random (D44), so that
the comparisons one 503 held back do not all come back in the same millisecond (a 429 is a hold of
judge/limits.py instead, exact, one call first)."""


@final
@dataclass(frozen=True, slots=True)
class ComparatorStatistics:
    """A snapshot of the comparator's work, for `Engine.statistics()` and `/cohorts`."""

    max_concurrency: int
    in_flight: int  # attempts holding a slot now
    queued: int  # attempts waiting for a slot now
    comparisons_active: int
    calls: int  # attempts started since the start (a call not sent is none: `unreached`)
    retries: int
    comparisons: int  # comparisons finished (success or fallback)
    fallbacks: int  # comparisons that ended in the default-score fallback
    failures: int  # comparisons that ended in a JudgeError
    escalations: int  # attempts started with an escalated output budget
    unreached: int  # calls that reached no judge server (no attempts: the judge was down)
    throttled: int = 0  # calls waiting for the judge's rate limit now (judge/limits.py)
    rate_limited: int = 0  # 429 replies since the start (holds: no attempts)


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
        # every judge is a fleet (judge/fleet.py); with several replicas a failure of the
        # replica (not of the request) is worth another attempt elsewhere
        self._fleet = fleet = as_fleet(judge)
        self._elsewhere = len(fleet.replicas) > 1
        self._settings = settings
        self._rng = rng if rng is not None else random.Random()
        self._queue = queue if queue is not None else judge_queue(fleet, settings, metrics)
        if limits is None:
            limits = judge_limits(settings, metrics, fleet.replicas)
        self._limits = limits
        fleet.route_around(limits.closed)  # new calls go to the replicas a 429 does not hold
        self._timeout = settings.judge_request_timeout_s
        # the one count of attempts: statistics() and the Prometheus series read it
        self._events = AttemptEvents(metrics)
        self._rules = ComparisonRules(
            settings,
            self._events,
            elsewhere=len(fleet.replicas) > 1,
            endpoint=fleet.endpoint,
            path=fleet.path,
        )
        self._active = 0
        # long replies are parsed one at a time: threads would only share one GIL
        self._reading = trio.CapacityLimiter(1)

    def statistics(self) -> ComparatorStatistics:
        queue = self._queue.statistics()
        limits = self._limits
        events = self._events
        return ComparatorStatistics(
            max_concurrency=queue.total,
            in_flight=queue.in_use,
            queued=queue.waiting,
            comparisons_active=self._active,
            calls=events.calls,
            retries=events.retries,
            comparisons=events.comparisons,
            fallbacks=events.fallbacks,
            failures=events.failures,
            escalations=events.escalations,
            unreached=events.unreached,
            throttled=limits.throttled,
            rate_limited=limits.rate_limited,
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
                if error.reached or not fleet.watched:
                    raise
                log.debug("judge call not sent (%s); not an attempt", one_line(error.describe()))
                if call.ticket is not None:
                    # the same attempt, sent again: it keeps its link to the attempt before it
                    call.ticket.not_sent()
                call = dataclasses.replace(call, avoid_replica=error.replica)

    def unreachable_for(self) -> float | None:
        """Seconds since no judge replica could be reached, or None."""
        return self._fleet.unreachable_for()

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
                if fleet.watched and fleet.unreachable_for() is not None:
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
        """The attempt itself (its slot held), under `judge_request_timeout_s`; its events
        (judge/events.py) say how it ended."""
        events = self._events
        started = trio.current_time()
        events.started()
        try:
            with trio.fail_after(self._timeout):
                reply = await self._fleet.attempt(call)
        except trio.TooSlowError:
            error: JudgeAttemptError = JudgeTimeout(self._timeout)
            events.ended("timeout", trio.current_time() - started)
            if call.ticket is not None:  # which replica hung, and that it did
                error.replica = call.ticket.replica
                call.ticket.deadline_expired(error)
            raise error from None
        except JudgeAttemptError as exc:
            if not exc.reached and self._fleet.watched:
                events.not_sent(trio.current_time() - started)  # no attempt: `_reach`
            else:
                events.ended(outcome_of(exc)[0], trio.current_time() - started)
            raise
        except BaseException:
            events.ended(None, trio.current_time() - started)  # cancelled from outside
            raise
        events.ended(reply.status.value, trio.current_time() - started)
        return reply

    # --- pacing ---------------------------------------------------------------------------

    async def _sleep(self, retry: int, retry_after: float | None, ticket: QueueTicket) -> None:
        """The sleep before retry number `retry`, sized against the enclosing deadline, and
        sized again when the group's deadline, set during it (its last member arrived while an
        eager comparison slept), comes before the sleep's chosen end: a sleep never outlives a
        deadline set while it runs, so eager starts leave the rows as they would be without
        them (D48)."""
        if retry_after is not None and self._elsewhere:
            # Held back is the replica that sent it: wait only when every replica is (one
            # replica's Retry-After stands as it sent it, 0 included, as one judge's: D13).
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
        backoff = self._settings.retry_backoff
        match backoff:
            case "exponential":
                return self._rng.uniform(0.0, min(MAX_BACKOFF_S, base * 2.0 ** (retry - 1)))
            case "constant":
                return base
            case _:
                assert_never(backoff)

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
        if self._rules.rubric and expected_rubric_ids is None:
            raise ValueError("score_source=rubric_mean requires expected_rubric_ids")
        self._active += 1
        try:
            place = ticket if ticket is not None else self._queue.ticket()
            comparison = Comparison(self._rules, call, pair, judge_pass, expected_rubric_ids)
            return await self._attempts(comparison, place)
        finally:
            self._active -= 1

    async def _fitted(self, call: JudgeCall, ticket: QueueTicket) -> JudgeReply:
        """`_reach`, and when the judge refuses the attempt for its context window, the one
        resend with a budget that fits (part of the same attempt), else `JudgeContextOverflow`:
        an overflow is never retried unchanged (judge/context.py)."""
        context = self._rules.context
        try:
            return await self._reach(call, ticket)
        except JudgeAttemptError as error:
            overflow = context.overflowed(error, call.max_output_tokens)
            if overflow is None:
                raise
            resend = context.resend(overflow, call.max_output_tokens)
            if resend is None:
                failure = context.failure(overflow, call.max_output_tokens)
                failure.replica = error.replica
                raise failure from error
        log.info(
            "judge context window: %s; resending once with max_output_tokens %d",
            overflow.describe(),
            resend.budget,
        )
        retry = dataclasses.replace(
            call, max_output_tokens=resend.budget, ticket=AttemptTicket(call.ticket)
        )
        try:
            return await self._reach(retry, ticket)
        except JudgeAttemptError as error:
            again = context.overflowed(error, resend.budget)
            if again is None:
                raise
            failure = context.failure(again, resend.budget)
            failure.replica = error.replica
            raise failure from error

    async def _read(self, comparison: Comparison, reply: JudgeReply) -> ReplyReading:
        """`comparison.read(reply)`: inline for a short reply, in a worker thread for a long one
        (`READ_OFF_LOOP_CHARS`), so that /health and every other task go on meanwhile."""
        if len(reply.text) + len(reply.partial) <= READ_OFF_LOOP_CHARS:
            return comparison.read(reply)
        # Abandoned on cancel: the parse is pure and its result unwanted once the comparison is
        # cancelled (a group's deadline, a shutdown), so the comparison ends at its deadline
        # rather than up to ~15 s later (a 32 MiB reply); the thread finishes unwatched and
        # keeps the limiter until then, so the next long reply waits for it.
        return await score_off_loop(
            partial(comparison.read, reply), self._reading, abandon_on_cancel=True
        )

    async def _attempts(self, comparison: Comparison, ticket: QueueTicket) -> ComparisonResult:
        """`comparison`'s attempts, paced, until one gives its result or none is left."""
        for n in range(1, self._rules.attempts + 1):
            if n > 1:
                await self._sleep(n - 1, comparison.retry_after, ticket)
            call = comparison.next_call()
            try:
                reply = await self._fitted(call, ticket)
            except RateLimitBeyondDeadline as held:
                comparison.held_past_deadline(str(held))  # raises the JudgeError
                raise
            except JudgeAttemptError as error:
                comparison.on_error(error)  # raises the JudgeError when it ends the comparison
                continue
            result = comparison.on_reply(reply, await self._read(comparison, reply))
            if result is not None:
                return result
        return comparison.result()
