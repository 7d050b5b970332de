"""A judge's rate limits: configured token buckets, pacing from the replies' headers, and the
holds a 429 puts on its replica (docs/configuration.md, "A judge with rate limits").

Every judge call is admitted here before it takes its `judge.max_concurrency` slot
(`Comparator._attempt`). A call costs one request and its tokens: its prompt-token estimate
(the prompt's characters times a tokens-per-character ratio corrected from every reply's usage)
plus its output budget. It is admitted when

- the configured buckets (`judge.requests_per_minute`, `judge.tokens_per_minute`; shared by
  every replica, as a hosted API's account is) hold its cost, and
- some replica is open: not held by a 429, not waiting for the answer of the one call sent
  after a hold ended, and, when its replies carry `x-ratelimit-*` headers, with room in the
  buckets those headers describe (synchronised with every reply).

A 429 holds its replica until its `retry-after-ms`, `retry-after` or spent budget's
`x-ratelimit-reset-*` says, else for an exponential back-off (`HOLD_FIRST_S` doubling up to
`HOLD_MAX_S`); when the hold ends, one call goes first and the rest follow its answer, so a storm
of bare 429s costs one 429 per back-off, not one per waiting call. A 429 is no attempt of its
comparison and no failure of its replica: throttled is serving.

Waiting calls are admitted in the judge queue's order (complete groups first, then by
readiness; judge/queue.py). A wait is bounded by the caller's deadlines, as the outage wait is;
a wait that is known not to fit (a hold whose end plus the replica's last round trip, the time
its last answered call took, reaches the deadline) fails the comparison at once with that reason
(`RateLimitBeyondDeadline`): the call sent when the hold ends would still be out at the
deadline, which would end its group rather than its pair.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final, Protocol, final, runtime_checkable

import trio

from genrm_trio.config import Settings
from genrm_trio.domain.ratelimit import CallBuckets, RateLimitHeaders, TokenBucket
from genrm_trio.judge.base import JudgeCall
from genrm_trio.judge.queue import QueueTicket
from genrm_trio.metrics import Metrics

__all__ = [
    "HOLD_FIRST_S",
    "HOLD_MAX_S",
    "JudgeLimits",
    "LimitsStatistics",
    "Permit",
    "RateLimitBeyondDeadline",
    "RoutesAroundLimits",
    "judge_limits",
]

HOLD_FIRST_S: Final = 1.0
"""The hold after a 429 that says nothing of when to come back; each further one doubles it."""
HOLD_MAX_S: Final = 32.0
"""The longest such hold."""
TOKENS_PER_CHAR: Final = 0.25
"""The first prompt-token estimate per character (about 4 characters a token, in English); each
reply's usage corrects it (`_RATIO_WEIGHT`)."""
_RATIO_WEIGHT: Final = 0.2


@runtime_checkable
class RoutesAroundLimits(Protocol):
    """A judge of several replicas that sends new calls to those the limits leave open."""

    def route_around(self, closed: Callable[[str, float], bool]) -> None:
        """`closed(label, now)`: whether the limits hold replica `label` now."""
        ...


class RateLimitBeyondDeadline(Exception):
    """The judge's rate limit holds the call past its deadline: the comparison fails now."""


@final
class Permit:
    """One admitted call: the replica it was charged to and what it cost there."""

    __slots__ = (
        "admitted_at",
        "charged_requests",
        "charged_tokens",
        "holds",
        "replica",
        "tokens",
        "trial",
    )

    def __init__(self, replica: _Replica | None, tokens: int, admitted_at: float = 0.0) -> None:
        self.replica = replica
        self.tokens = tokens
        self.admitted_at = admitted_at  # its replica's round trip is measured from here
        self.trial = False  # the one call sent after its replica's hold ended
        # its replica's holds before it was sent: a 429 to a call sent before the latest hold
        # began says nothing new (a wave of them is one hold, not a back-off per reply)
        self.holds = 0 if replica is None else replica.holds
        # its replica's charge counters just after this call's charge (header synchronisation)
        self.charged_requests = 0
        self.charged_tokens = 0

    @property
    def label(self) -> str | None:
        """The replica it was admitted to (None: any; nothing limits the call)."""
        return None if self.replica is None else self.replica.label


_FREE: Final = Permit(None, 0)
"""The permit of a call that nothing limits (no configuration, no headers, no hold)."""


@final
class _Replica:
    __slots__ = (
        "backoff",
        "buckets",
        "charged_requests",
        "charged_tokens",
        "hold_until",
        "holds",
        "label",
        "rate_limited",
        "round_trip_s",
        "trial_due",
        "trial_out",
    )

    def __init__(self, label: str | None) -> None:
        self.label = label
        self.hold_until = -math.inf
        self.holds = 0  # holds begun
        self.backoff = HOLD_FIRST_S
        self.trial_due = False  # held by a 429: the next call goes alone
        self.trial_out = False  # that call is out
        self.buckets = CallBuckets()  # learned from its x-ratelimit-* headers
        self.charged_requests = 0
        self.charged_tokens = 0
        self.rate_limited = 0  # 429 replies
        self.round_trip_s = 0.0  # its last answered call's, admission to answer (429s too)

    def wait(self, tokens: int, now: float) -> float:
        """Seconds until it may take a call of `tokens` (0: its tokens are not counted; inf:
        until an answer comes)."""
        if self.trial_out:
            return math.inf
        return max(self.hold_until - now, self.buckets.wait(tokens or None, now))


@final
@dataclass(frozen=True, slots=True)
class LimitsStatistics:
    throttled: int  # calls waiting for a rate limit now
    held_replicas: int  # replicas held by a 429 now
    rate_limited: int  # 429 replies since the start
    throttled_seconds: float  # seconds calls waited for a rate limit, summed
    cost: float  # judge.price_per_million_* x the usage replies reported
    tokens_per_char: float  # the prompt-token estimate's ratio now


@final
class _Waiter:
    __slots__ = ("event", "ticket", "tokens")

    def __init__(self, ticket: QueueTicket, tokens: int) -> None:
        self.ticket = ticket
        self.tokens = tokens
        self.event = trio.Event()


def _seconds(value: float) -> str:
    """Seconds for a reason: whole from 10 s up (never in exponent form), else 3 digits."""
    return f"{value:.0f}" if value >= 10 else f"{value:.3g}"


def _prompt_chars(call: JudgeCall) -> int:
    return (
        sum(len(message.get("content", "")) for message in call.history)
        + len(call.principle or "")
        + len(call.response_1)
        + len(call.response_2)
    )


@final
class JudgeLimits:
    """The rate limits every judge call is admitted under (module docstring)."""

    def __init__(
        self,
        metrics: Metrics,
        *,
        requests_per_minute: int | None = None,
        tokens_per_minute: int | None = None,
        output_budget: int | None = None,
        price_per_million_input_tokens: float | None = None,
        price_per_million_output_tokens: float | None = None,
        replicas: Sequence[str] = (),
    ) -> None:
        now = -math.inf  # full at the first call, whenever it comes (built outside trio too)
        self._metrics = metrics
        self._configured = CallBuckets(
            None
            if requests_per_minute is None
            else TokenBucket.per_minute(requests_per_minute, now),
            None if tokens_per_minute is None else TokenBucket.per_minute(tokens_per_minute, now),
        )
        self._budget = output_budget or 0
        self._price_in = (price_per_million_input_tokens or 0.0) / 1e6
        self._price_out = (price_per_million_output_tokens or 0.0) / 1e6
        self._replicas: dict[str | None, _Replica] = {label: _Replica(label) for label in replicas}
        if not self._replicas:
            self._replicas[None] = _Replica(None)
        self._ratio = TOKENS_PER_CHAR
        self._waiting: list[_Waiter] = []
        # nothing limits a call until a configured bucket, a header or a 429 says otherwise
        configured = self._configured
        self._active = configured.requests is not None or configured.tokens is not None
        self._rate_limited = 0
        self._throttled_s = 0.0
        self._cost = 0.0
        metrics.judge_throttled.set_function(lambda: len(self._waiting))

    # --- admission ----------------------------------------------------------------------------

    def estimate(self, call: JudgeCall) -> int:
        """The tokens a call is charged: its prompt-token estimate plus its output budget."""
        budget = call.max_output_tokens if call.max_output_tokens is not None else self._budget
        return math.ceil(_prompt_chars(call) * self._ratio) + budget

    def try_admit(self, call: JudgeCall) -> Permit | None:
        """A permit now, or None: the call waits (`admit`). The fast path, without a
        checkpoint: while nothing limits the judge it allocates nothing."""
        if not self._active:
            return _FREE
        if self._waiting:
            return None
        return self._grant(self.estimate(call) if self._counts_tokens() else 0, trio.current_time())

    async def admit(self, call: JudgeCall, ticket: QueueTicket) -> Permit:
        """Wait, in the judge queue's order, until the limits admit `call`. Raises
        `RateLimitBeyondDeadline` when its replicas are held past the enclosing deadline."""
        permit = self.try_admit(call)
        if permit is not None:
            await trio.lowlevel.checkpoint()
            return permit
        waiter = _Waiter(ticket, self.estimate(call) if self._counts_tokens() else 0)
        self._waiting.append(waiter)
        started = trio.current_time()
        try:
            while True:
                now = trio.current_time()
                self._check_deadline(now)
                if self._head() is waiter:
                    wait = self._wait(waiter.tokens, now)
                    if wait <= 0.0:
                        permit = self._grant(waiter.tokens, now)
                        assert permit is not None
                        return permit
                else:
                    wait = math.inf
                await self._sleep(waiter, wait)
                waiter.event = trio.Event()
        finally:
            self._waiting.remove(waiter)
            waited = trio.current_time() - started
            self._throttled_s += waited
            self._metrics.judge_throttled_seconds.inc(waited)
            self._kick()

    @staticmethod
    async def _sleep(waiter: _Waiter, wait: float) -> None:
        """Until `wait` is over or `waiter` is kicked; and, while its group collects, until the
        group completes, whose deadline (set then) the hold is checked against again."""
        group = waiter.ticket.group
        with trio.move_on_after(wait):
            if group.complete:
                await waiter.event.wait()
                return
            async with trio.open_nursery() as nursery:

                async def completed() -> None:
                    await group.wait_complete()
                    nursery.cancel_scope.cancel()

                nursery.start_soon(completed)
                await waiter.event.wait()
                nursery.cancel_scope.cancel()

    def _counts_tokens(self) -> bool:
        replicas = self._replicas.values()
        return self._configured.tokens is not None or any(
            r.buckets.tokens is not None for r in replicas
        )

    def _head(self) -> _Waiter:
        """The waiter the judge queue would serve first (complete groups first, then by
        readiness; a group's promotion counts at once)."""

        def key(waiter: _Waiter) -> tuple[int, int, int]:
            ticket = waiter.ticket
            complete = ticket.group.complete_seq
            if complete is None:
                return (1, ticket.ready_seq, 0)
            return (0, complete, ticket.ready_seq)

        return min(self._waiting, key=key)

    def _kick(self) -> None:
        """Something changed (an answer, a hold, a call admitted or gone): the head looks
        again."""
        if self._waiting:
            self._head().event.set()

    def _wait(self, tokens: int, now: float) -> float:
        """Seconds until a call of `tokens` may be admitted (inf: until an answer)."""
        return self._open(tokens, now)[1]

    def _open(self, tokens: int, now: float) -> tuple[_Replica, float]:
        """The replica with the most room for a call of `tokens` (the first on ties; one
        replica: that one), and the seconds until the call may be admitted there."""
        replica: _Replica | None = None
        wait = math.inf
        for candidate in self._replicas.values():
            candidate_wait = candidate.wait(tokens, now)
            if replica is None or candidate_wait < wait:
                replica, wait = candidate, candidate_wait
        assert replica is not None  # there is always one (None: the judge's only one)
        return replica, max(wait, self._configured.wait(tokens or None, now))

    def _check_deadline(self, now: float) -> None:
        replicas = self._replicas.values()
        held = min(replica.hold_until for replica in replicas)
        if held <= now:
            return
        # the first answer a call sent when a hold ends could bring: its round trip later
        answer = min(max(replica.hold_until, now) + replica.round_trip_s for replica in replicas)
        deadline = trio.current_effective_deadline()
        if answer >= deadline:
            trip = answer - held
            round_trip = f" and an answer takes {_seconds(trip)}s" if trip > 0.0 else ""
            raise RateLimitBeyondDeadline(
                f"the judge's rate limit holds its calls for {_seconds(held - now)}s (after a "
                f"429){round_trip}, past the deadline in {_seconds(deadline - now)}s"
            )

    def _grant(self, tokens: int, now: float) -> Permit | None:
        replica, wait = self._open(tokens, now)  # each replica's buckets looked at once
        if wait > 0.0:
            return None
        self._configured.take(tokens, now)
        permit = Permit(replica, tokens, now)
        if replica.trial_due:
            replica.trial_out = True
            permit.trial = True
        replica.buckets.take(tokens, now)
        replica.charged_requests += 1
        replica.charged_tokens += tokens
        permit.charged_requests = replica.charged_requests
        permit.charged_tokens = replica.charged_tokens
        return permit

    def closed(self, label: str, now: float) -> bool:
        """Whether replica `label` should take no new call now (a fleet routes elsewhere)."""
        if not self._active:
            return False
        replica = self._replicas.get(label)
        return replica is not None and replica.wait(0, now) > 0.0

    # --- what the judge answered ----------------------------------------------------------

    def _replica(self, permit: Permit, label: str | None) -> _Replica:
        replica = self._replicas.get(label) if label is not None else None
        if replica is None:
            replica = permit.replica if permit.replica is not None else self._replicas[None]
        return replica

    def answered(
        self,
        permit: Permit,
        label: str | None,
        headers: RateLimitHeaders | None,
        call: JudgeCall,
        input_tokens: int | None,
        output_tokens: int | None,
    ) -> None:
        """A reply (any status but 429) from replica `label`: its hold is over, its headers
        synchronise its buckets, its usage corrects the estimate and adds to the cost."""
        if input_tokens is not None:
            chars = _prompt_chars(call)
            if chars:
                observed = input_tokens / chars
                self._ratio += _RATIO_WEIGHT * (observed - self._ratio)
            cost = input_tokens * self._price_in + (output_tokens or 0) * self._price_out
            if cost:
                self._cost += cost
                self._metrics.judge_cost.inc(cost)
        if not self._active and headers is None:
            return
        replica = self._replica(permit, label)
        self._timed(replica, permit)
        if permit.trial or replica.trial_due:
            replica.trial_due = replica.trial_out = False
            permit.trial = False
        replica.backoff = HOLD_FIRST_S
        if headers is not None:
            self._learn(replica, permit, headers)
        self._kick()

    def rejected(self, permit: Permit, label: str | None, headers: RateLimitHeaders | None) -> None:
        """A 429 from replica `label`: hold it until its headers say, else for its back-off."""
        now = trio.current_time()
        replica = self._replica(permit, label)
        self._timed(replica, permit)
        self._active = True
        self._rate_limited += 1
        replica.rate_limited += 1
        self._metrics.judge_rate_limited.inc()
        hold: float | None = None
        if headers is not None:
            hold = headers.retry_after_s
            if hold is None:
                hold = headers.exhausted_for()
            self._learn(replica, permit, headers)
        fresh = permit.holds == replica.holds  # sent after the latest hold began, if any
        if hold is None:
            if not fresh:
                hold = 0.0  # the hold its wave began covers it
            else:
                hold = replica.backoff
                replica.backoff = min(HOLD_MAX_S, replica.backoff * 2.0)
        if fresh:
            replica.holds += 1
        replica.hold_until = max(replica.hold_until, now + hold)
        replica.trial_due = True
        if permit.trial:
            replica.trial_out = False
            permit.trial = False
        # every waiter looks again: one whose deadline the hold now outlasts fails at once
        for waiter in self._waiting:
            waiter.event.set()

    @staticmethod
    def _timed(replica: _Replica, permit: Permit) -> None:
        if permit.replica is not None:  # admitted by `_grant`, which set `admitted_at`
            replica.round_trip_s = trio.current_time() - permit.admitted_at

    def release(self, permit: Permit) -> None:
        """The call is over, whatever its end (a timeout, a broken connection, a cancel): a
        trial call that got no answer lets the next call be the trial."""
        if permit.trial:
            permit.trial = False
            if permit.replica is not None:
                permit.replica.trial_out = False
            self._kick()

    def _learn(self, replica: _Replica, permit: Permit, headers: RateLimitHeaders) -> None:
        """Synchronise `replica`'s buckets with what its reply says was left when the server
        took the call, less what was charged to it since."""
        now = trio.current_time()
        self._active = True
        buckets = replica.buckets
        buckets.requests = self._synced(
            buckets.requests,
            headers.limit_requests,
            headers.remaining_requests,
            headers.reset_requests_s,
            replica.charged_requests - permit.charged_requests,
            now,
        )
        buckets.tokens = self._synced(
            buckets.tokens,
            headers.limit_tokens,
            headers.remaining_tokens,
            headers.reset_tokens_s,
            replica.charged_tokens - permit.charged_tokens,
            now,
        )

    @staticmethod
    def _synced(
        bucket: TokenBucket | None,
        limit: int | None,
        remaining: int | None,
        reset_s: float | None,
        since: int,
        now: float,
    ) -> TokenBucket | None:
        if remaining is None:
            return bucket
        if limit is None:  # not said: at least what was left, plus this call
            limit = max(remaining + 1, int(bucket.capacity) if bucket is not None else 0)
        if limit <= 0:
            return bucket
        # refilled to the limit in reset_s: the rate at which the server gives budget back
        rate = (limit - remaining) / reset_s if reset_s and limit > remaining else limit / 60.0
        # (the server refuses a call rather than go below empty: never less than nothing left)
        left: float = max(0, remaining - since)
        if bucket is None:
            bucket = TokenBucket(limit, rate, now)
        else:
            bucket.refill(now)
            bucket.capacity = limit
            bucket.rate = rate
            # Concurrent calls reach the server in another order than they were admitted in, so
            # a reply can tell of a fuller bucket than the one the calls after it found: it
            # only ever lowers the level (the refill raises it; a 429 says when it was too high).
            left = min(left, bucket.level)
        bucket.set_level(left, now)
        return bucket

    # --- observability ------------------------------------------------------------------------

    @property
    def throttled(self) -> int:
        """Calls waiting for the rate limit now (no clock: readable outside trio too)."""
        return len(self._waiting)

    @property
    def rate_limited(self) -> int:
        """429 replies since the start."""
        return self._rate_limited

    def statistics(self) -> LimitsStatistics:
        now = trio.current_time()
        return LimitsStatistics(
            throttled=len(self._waiting),
            held_replicas=sum(1 for r in self._replicas.values() if r.hold_until > now),
            rate_limited=self._rate_limited,
            throttled_seconds=self._throttled_s,
            cost=self._cost,
            tokens_per_char=self._ratio,
        )


def judge_limits(settings: Settings, metrics: Metrics, replicas: Sequence[str] = ()) -> JudgeLimits:
    """The limits `settings.judge` configures, over the judge's replicas (their labels)."""
    judge = settings.judge
    return JudgeLimits(
        metrics,
        requests_per_minute=judge.requests_per_minute,
        tokens_per_minute=judge.tokens_per_minute,
        output_budget=settings.output_budget,
        price_per_million_input_tokens=judge.price_per_million_input_tokens,
        price_per_million_output_tokens=judge.price_per_million_output_tokens,
        replicas=replicas,
    )
