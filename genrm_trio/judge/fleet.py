"""A fleet of judge replicas behind one `Judge`: routing, failover, ejection, stall detection,
per-replica stats.

`judge.base_url` makes a `JudgeFleet` of one `HttpJudge` per URL (each with its own keep-alive
pool); a single URL is a fleet of one replica, so that one judge and several are built, routed and
reported one way. With one replica nothing below changes one judge's behaviour: a failure is not
"retried elsewhere" (the `Comparator` retries a replica's failures only with two replicas or
more), a `Retry-After` is waited out (`held_back_for`), no replica can stall (that needs another
one answering), and ejecting it takes no attempt away from it in a fleet nothing watches (all
ejected: attempts still go out); under an engine, which watches the fleet, every replica out is
an outage and comparisons wait for a probe (`wait_reachable`). Every attempt goes to one replica:

- **routing**: the replica with the fewest attempts in flight, ties broken round robin, skipping
  ejected replicas, replicas at `judge.max_concurrency_per_replica`, and, while another can take
  the attempt, replicas holding back after a `Retry-After` they sent (D44). With that cap the
  fleet tells the judge queue how many attempts it can place now (`capacity`: the replicas in
  service, and a trial of each ejected one due it), so attempts wait for a replica in the queue,
  by priority, outside their attempt deadline; an attempt that still finds every replica full
  (one ejected between its slot and its choice) waits here for a finished call;
- **failover**: an attempt whose `JudgeCall.avoid_replica` names a replica (the `Comparator`
  sets it after a failure there) goes to another one when any is available;
- **ejection**: a replica whose last `judge.eject_after_failures` finished attempts all failed
  retryably (transport error, 408, 429, 5xx, its attempt deadline) is taken out for
  `judge.eject_backoff_s`; then one trial attempt at a time may go to it (`due_a_trial`, the
  one place that rule is written): a failed trial doubles the back-off (capped at
  `EJECT_BACKOFF_MAX_S`). While ejected it gets no traffic, however few attempts it has in
  flight, so a replica that fails fast cannot attract calls. When every replica is ejected,
  attempts still go out, to the least recently failed replica, rather than failing untried;
  those are no trials: a failure neither doubles nor extends a back-off. Any answer (a trial's
  or not) brings a replica back at once;
- **request faults**: an HTTP 5xx that the same comparison's previous attempt also got, from
  another replica, is the request's fault (a prompt the judge cannot take), not the replicas':
  it is not counted, and the previous one is taken back (with the ejection or failed trial it
  caused); a call sent again because it never reached a server is the same attempt
  (`AttemptTicket.not_sent`). A 5xx followed by an answer elsewhere stays counted;
- **stall detection** (`judge.replica_stall_s`, off by default): a replica that has had attempts
  in flight and finished none of them for that long, while another replica answered (a reply or
  an HTTP status, not a broken connection) in that time, is stalled: it is taken out as an
  ejected one is, and its attempts in flight are cancelled (`JudgeStalled`, retryable, so each
  is retried elsewhere as an attempt of its comparison).

Why an attempt ended the fleet is told, not guessed: an answer or a failure it sees; its own
deadline the `Comparator` reports through the attempt's `AttemptTicket` (a hung replica is then
failed and ejected like one that refuses); any other cancellation (the group's deadline, a
disconnect) counts neither as an answer nor as a failure. Retries, pacing and deadlines stay in
`judge.attempts` (one shared budget per comparison); the fleet adds no attempts of its own.

The stall clock is a cancel scope per attempt, of which one per replica carries the deadline
`quiet_since + replica_stall_s`, set only once another replica has answered since `quiet_since`:
when it fires, the condition holds by construction, and keeping it costs O(1) per answer.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from functools import partial
from typing import Final, final

import trio

from genrm_trio.config import JUDGE_API_CHOICES, ConfigError, Settings, endpoint_of
from genrm_trio.judge.answers import AnswerCheck, unread_fix
from genrm_trio.judge.base import (
    AttemptTicket,
    Judge,
    JudgeAttemptError,
    JudgeCall,
    JudgeHTTPError,
    JudgeReply,
    JudgeStalled,
    JudgeTransportError,
    Probing,
    ReplicaStats,
    one_line,
)
from genrm_trio.judge.client import make_http_judge
from genrm_trio.judge.network import NetworkBackend
from genrm_trio.judge.probe import PROBE_LIMIT_S

log = logging.getLogger("genrm_trio.judge")

__all__ = ["EJECT_BACKOFF_MAX_S", "OUTAGE_PROBE_FIRST_S", "JudgeFleet", "make_judge"]

EJECT_BACKOFF_MAX_S: Final = 60.0
"""The longest back-off of an ejected replica whose trial attempts keep failing."""

OUTAGE_PROBE_FIRST_S: Final = 0.5
"""The first probe of a replica that cannot be reached comes this long after it went (or
`judge.outage_probe_s` if shorter); each failed probe doubles the wait, up to that setting."""


@final
class _Replica:
    __slots__ = (
        "answers",
        "armed",
        "attempts",
        "backoff",
        "calls",
        "consecutive",
        "eject_until",
        "ejected",
        "ejected_at",
        "ejections",
        "failures",
        "hold_until",
        "in_flight",
        "index",
        "input_tokens",
        "judge",
        "label",
        "last_error",
        "last_failure",
        "latency_count",
        "latency_sum",
        "output_tokens",
        "probing",
        "quiet_since",
        "reasoning_tokens",
        "stalling",
        "stalls",
        "streak",
        "unreachable",
        "url",
        "watch",
    )

    def __init__(self, index: int, label: str, url: str, judge: Judge) -> None:
        self.index = index
        self.label = label
        self.url = url
        self.judge = judge
        self.in_flight = 0
        self.calls = 0
        self.failures = 0
        self.consecutive = 0
        self.streak = 0  # which run of consecutive failures `consecutive` counts
        self.ejected = False
        self.unreachable = False  # out because a call could not reach it (probed until it can)
        self.probing = False  # its probe loop runs
        self.ejections = 0
        self.ejected_at = 0.0
        self.eject_until = 0.0
        self.backoff = 0.0
        self.last_failure = -math.inf
        self.last_error: str | None = None
        self.latency_sum = 0.0
        self.latency_count = 0
        self.hold_until = -math.inf  # no new attempt before this (its Retry-After), if others can
        # stall detection (judge.replica_stall_s)
        self.stalls = 0
        self.quiet_since = 0.0  # since when it has had attempts in flight and finished none
        self.armed = False  # another replica answered since quiet_since
        self.attempts: set[trio.CancelScope] = set()  # the scopes of its attempts in flight
        self.watch: trio.CancelScope | None = None  # the one carrying the stall deadline
        self.stalling = False  # a stall was declared; its attempts are being cancelled
        # usage it reported, and whether its prompt tokens show the answers read (answers.py)
        self.input_tokens = 0
        self.output_tokens = 0
        self.reasoning_tokens = 0
        self.answers = AnswerCheck()


def replica_labels(urls: Sequence[str]) -> list[str]:
    """Labels for replicas: `host:port`, or the whole base URL where a `host:port` repeats."""
    endpoints = [endpoint_of(url) for url in urls]
    return [
        endpoint if endpoints.count(endpoint) == 1 else url
        for url, endpoint in zip(urls, endpoints, strict=True)
    ]


def due_a_trial(replica: _Replica, now: float) -> bool:
    """The trial rule, the one place it is written: an ejected replica whose back-off has run
    out and that has no attempt in flight may take one trial attempt."""
    return replica.ejected and now >= replica.eject_until and replica.in_flight == 0


@final
class JudgeFleet:
    """A `Judge` spreading attempts over several replicas (see the module docstring)."""

    def __init__(
        self,
        replicas: Sequence[tuple[str, Judge]],
        *,
        max_in_flight_per_replica: int | None = None,
        eject_after_failures: int = 3,
        eject_backoff_s: float = 5.0,
        stall_after_s: float | None = None,
        outage_probe_s: float = 5.0,
        api: str | None = None,
    ) -> None:
        if not replicas:
            raise ValueError("a judge fleet needs at least one replica")
        urls = [url for url, _ in replicas]
        labels = replica_labels(urls)
        self._replicas: Final = [
            _Replica(index, label, url, judge)
            for index, (label, (url, judge)) in enumerate(zip(labels, replicas, strict=True))
        ]
        self._cap = max_in_flight_per_replica
        self._threshold = eject_after_failures
        self._backoff = eject_backoff_s
        self._stall_after = stall_after_s
        self._api = api  # `judge.api`, named in the "does not read the answers" line
        self._next = 0  # where the round robin starts looking
        self._lot = trio.lowlevel.ParkingLot()
        self._path = replicas[0][1].path
        self._endpoint = ",".join(labels)
        self._closed = False
        # the outage (module docstring): no replica in service
        self._probe_max = outage_probe_s
        self._watch: trio.Nursery | None = None  # where the probe loops run (keep_watch)
        self._down_since: float | None = None
        self._down_total = 0.0  # seconds of outages that are over
        self._back_event = trio.Event()  # set when an outage ends (a new one per outage)
        self._capacity_watchers: list[Callable[[], None]] = []  # the judge queue's
        # whether the judge's rate limits hold a replica now (judge/limits.py): routed around
        self._rate_closed: Callable[[str, float], bool] | None = None

    def __repr__(self) -> str:
        return f"JudgeFleet({[replica.url for replica in self._replicas]!r})"

    @property
    def endpoint(self) -> str:
        """Every replica's label, comma-separated (a failed comparison names its replica)."""
        return self._endpoint

    @property
    def path(self) -> str:
        return self._path

    @property
    def replicas(self) -> list[str]:
        """The replicas' labels, in configuration order."""
        return [replica.label for replica in self._replicas]

    # --- routing --------------------------------------------------------------------------

    def _pick(
        self, avoid: str | None, now: float, prefer: str | None = None
    ) -> tuple[_Replica, bool] | None:
        """(replica, is a trial of an ejected replica), or None when every replica is full."""
        replicas = self._replicas
        count = len(replicas)
        best: _Replica | None = None
        best_key = (True, True, 0)
        fallback: _Replica | None = None
        fallback_key = (True, math.inf)
        cap = self._cap
        in_service = False
        closed = self._rate_closed
        for offset in range(count):
            replica = replicas[(self._next + offset) % count]
            in_service = in_service or not replica.ejected
            if cap is not None and replica.in_flight >= cap:
                continue
            held = replica.label != prefer and (
                replica.hold_until > now or (closed is not None and closed(replica.label, now))
            )
            if replica.ejected:
                if due_a_trial(replica, now):
                    key = (held, replica.label == avoid, 0)
                    if best is None or key < best_key:
                        best, best_key = replica, key
                else:
                    fkey = (replica.label == avoid, replica.last_failure)
                    if fallback is None or fkey < fallback_key:
                        fallback, fallback_key = replica, fkey
                continue
            key = (held, replica.label == avoid, replica.in_flight)
            if best is None or key < best_key:
                best, best_key = replica, key
        # Only when every replica is ejected does an attempt go to one still backing off; such
        # an attempt is no trial: its failure neither doubles nor extends the back-off.
        if best is not None:
            chosen, trial = best, best.ejected
        elif not in_service and fallback is not None:
            chosen, trial = fallback, False
        else:
            return None
        self._next = (chosen.index + 1) % count
        return chosen, trial

    async def _choose(self, avoid: str | None, prefer: str | None) -> tuple[_Replica, bool]:
        while True:
            picked = self._pick(avoid, trio.current_time(), prefer)
            if picked is not None:
                return picked
            # Every replica is at judge.max_concurrency_per_replica: wait for a finished call.
            await self._lot.park()

    def capacity(self) -> int | None:
        """Attempts the fleet can place at once now: `max_concurrency_per_replica` for each
        replica in service and one for each ejected replica due a trial (every replica's when
        all are ejected: attempts still go out then); None without a cap. The judge queue hands
        out no more slots than this, so that an attempt never waits here for a replica."""
        cap = self._cap
        if cap is None:
            return None
        now = trio.current_time()
        serving = trials = 0
        for replica in self._replicas:
            if not replica.ejected:
                serving += 1
            elif due_a_trial(replica, now):
                trials += 1
        if not serving:
            return cap * len(self._replicas)
        return cap * serving + trials

    def watch_capacity(self, changed: Callable[[], None]) -> None:
        """Call `changed` when a replica is back in service: its slots are usable at once."""
        self._capacity_watchers.append(changed)

    def route_around(self, closed: Callable[[str, float], bool]) -> None:
        """Send new calls to the replicas the judge's rate limits leave open (`closed(label,
        now)` says which they hold; judge/limits.py) while another can take them."""
        self._rate_closed = closed

    def held_back_for(self) -> float | None:
        """Seconds until a replica may take a call again when every one an attempt could go to
        now (in service, or ejected and due a trial; every replica when all are backing off, as
        attempts still go out then) is holding back after its `Retry-After`; None when one can
        take it now. A fleet of one so waits out its `Retry-After` as one judge would (D13)."""
        now = trio.current_time()
        holds = [
            replica.hold_until
            for replica in self._replicas
            if not replica.ejected or due_a_trial(replica, now)
        ] or [replica.hold_until for replica in self._replicas]
        held = min(holds) - now
        return held if held > 0 else None

    # --- the attempt ----------------------------------------------------------------------

    async def attempt(self, call: JudgeCall) -> JudgeReply:
        if self._closed:
            raise RuntimeError("JudgeFleet is closed")
        replica, trial = await self._choose(call.avoid_replica, call.prefer_replica)
        started = trio.current_time()
        replica.in_flight += 1
        replica.calls += 1
        if replica.in_flight == 1:
            replica.quiet_since = started
        if call.ticket is not None:
            # its own deadline (the Comparator says so): the replica took all of it, a failure
            call.ticket.went_to(replica.label, partial(self._failed, replica, trial))
        try:
            if self._stall_after is None:
                reply = await replica.judge.attempt(call)
            else:
                reply = await self._watched(replica, call)
        except JudgeStalled as error:  # cancelled by its replica's stall: no answer, a failure
            error.replica = replica.label
            self._left(replica)
            self._failed(replica, trial, error)
            raise
        except JudgeAttemptError as error:
            error.replica = replica.label
            # An HTTP status is an answer; a broken or refused connection is not (no evidence
            # that the replicas are serving, which a stall of another one needs).
            self._finished(replica, started, answered=not isinstance(error, JudgeTransportError))
            if not error.reached:
                self._unreachable(replica, trial, error)
            elif isinstance(error, JudgeHTTPError) and error.status == 429:
                # throttled is serving: held by the rate limits (judge/limits.py), never ejected
                self._answered(replica, trial)
                if error.retry_after is not None:
                    replica.hold_until = trio.current_time() + error.retry_after
            elif error.retryable or error.retry_elsewhere:
                if isinstance(error, JudgeHTTPError) and error.status >= 500:
                    self._server_error(replica, trial, error, call.ticket)
                else:
                    self._failed(replica, trial, error)
                if isinstance(error, JudgeHTTPError) and error.retry_after is not None:
                    replica.hold_until = trio.current_time() + error.retry_after
            else:  # it answered (a 4xx, a body that is not JSON): alive
                self._answered(replica, trial)
            raise
        except BaseException:
            # Cancelled: by the attempt's own deadline (the Comparator says so through the
            # ticket, `_failed`) or from outside (neither an answer nor a failure).
            self._left(replica)
            raise
        self._finished(replica, started, answered=True)
        self._answered(replica, trial)
        self._usage(replica, call, reply)
        return reply

    def _usage(self, replica: _Replica, call: JudgeCall, reply: JudgeReply) -> None:
        """Count the usage `replica` reported, and check from its prompt tokens that the judge
        reads the answers (judge/answers.py): one ERROR, the first time it shows it does not."""
        if reply.input_tokens is None or reply.output_tokens is None:
            return
        replica.input_tokens += reply.input_tokens
        replica.output_tokens += reply.output_tokens
        if reply.reasoning_tokens is not None:
            replica.reasoning_tokens += reply.reasoning_tokens
        answers = (call.response_1, call.response_2)
        reason = replica.answers.observe(call.history, call.principle, answers, reply.input_tokens)
        if reason is not None:
            log.error(
                "the judge does not read the answers (replica %s): %s. Fix: %s",
                replica.label,
                reason,
                unread_fix(self._api),
            )

    async def _watched(self, replica: _Replica, call: JudgeCall) -> JudgeReply:
        """`replica.judge.attempt(call)` in a cancel scope the replica's stall cancels."""
        with trio.CancelScope() as scope:
            replica.attempts.add(scope)
            if replica.armed and replica.watch is None:
                self._arm(replica)
            try:
                return await replica.judge.attempt(call)
            finally:
                replica.attempts.discard(scope)
                if replica.watch is scope:
                    replica.watch = None
        # Only this scope's own cancellation ends up here: the stall deadline it carried (then
        # the replica stalls now), or the stall another of its attempts declared.
        if not replica.stalling:
            self._stall(replica)
        assert self._stall_after is not None
        raise JudgeStalled(
            f"judge replica {replica.label} finished none of its calls in flight for "
            f"{self._stall_after:g}s while other replicas answered"
        )

    def _left(self, replica: _Replica) -> None:
        """An attempt on `replica` ended without finishing (cancelled)."""
        replica.in_flight -= 1
        self._lot.unpark_all()
        if replica.in_flight == 0:
            replica.armed = False
            replica.stalling = False
        elif replica.armed and replica.watch is None:
            self._arm(replica)  # the stall deadline moves to another of its attempts

    def _finished(self, replica: _Replica, started: float, *, answered: bool) -> None:
        now = trio.current_time()
        replica.in_flight -= 1
        replica.latency_sum += now - started
        replica.latency_count += 1
        self._lot.unpark_all()
        if self._stall_after is None:
            return
        # It finished one: its silence, if any, is over; and if that was an answer, every other
        # busy replica's silence now has an answer beside it (the condition of a stall).
        replica.quiet_since = now
        replica.armed = False
        if replica.watch is not None:
            replica.watch.deadline = math.inf
            replica.watch = None
        if replica.in_flight == 0:
            replica.stalling = False
        if not answered:
            return
        for other in self._replicas:
            if other is not replica and other.in_flight and not other.armed:
                other.armed = True
                self._arm(other)

    def _arm(self, replica: _Replica) -> None:
        """Put `replica`'s stall deadline on one of its attempts in flight."""
        assert self._stall_after is not None
        if replica.attempts and replica.watch is None:
            watch = next(iter(replica.attempts))
            watch.deadline = replica.quiet_since + self._stall_after
            replica.watch = watch

    def _stall(self, replica: _Replica) -> None:
        """`replica` stalled: out of rotation, its other attempts in flight cancelled."""
        now = trio.current_time()
        replica.stalling = True
        replica.armed = False
        for scope in replica.attempts:
            scope.cancel()
        if replica.ejected:
            return  # a trial attempt stalled: it fails as a trial (the back-off doubles)
        replica.stalls += 1
        self._eject(replica, now)
        log.warning(
            "judge replica %s stalled: %d calls in flight, none finished for %gs while other "
            "replicas answered; they are retried elsewhere; a trial attempt in %gs; %d of %d "
            "replicas in service",
            replica.label,
            replica.in_flight,
            self._stall_after,
            self._backoff,
            self._serving(),
            len(self._replicas),
        )
        self._check_outage(replica, now)

    def _answered(self, replica: _Replica, trial: bool, what: str | None = None) -> None:
        """It answered (`what`: a probe, else an attempt): in service at once, whatever it
        answered."""
        replica.consecutive = 0
        replica.streak += 1
        if replica.ejected:
            self._back(replica, what or ("a trial attempt" if trial else "an attempt"))

    def _back(self, replica: _Replica, what: str) -> None:
        now = trio.current_time()
        replica.ejected = False
        replica.unreachable = False
        for changed in self._capacity_watchers:
            changed()
        if self._down_since is None:
            # good news, as the judge's own return below: INFO (its leaving was the WARNING)
            log.info(
                "judge replica %s is back after %.1fs out (it answered %s)",
                replica.label,
                now - replica.ejected_at,
                what,
            )
            return
        gone = now - self._down_since
        self._down_total += gone
        self._down_since = None
        self._back_event.set()
        log.info(
            "judge is back after %.1fs unreachable (replica %s answered %s)",
            gone,
            replica.label,
            what,
        )

    # --- outages: no replica can be reached ---------------------------------------------------

    def _unreachable(self, replica: _Replica, trial: bool, error: JudgeAttemptError) -> None:
        """A call could not reach `replica` (its connection could not be opened): it is out at
        once, and probed until it can be reached (or a trial reaches it)."""
        now = trio.current_time()
        self._noted(replica, error)
        replica.consecutive += 1
        replica.last_failure = now
        replica.unreachable = True
        if replica.ejected:
            if trial:
                self._trial_failed(replica, now)
        else:
            self._eject(replica, now)
            serving = self._serving()
            if serving:  # else the outage's own line says it
                log.warning(
                    "judge replica %s cannot be reached (%s); out until a probe or a trial "
                    "reaches it; %d of %d replicas in service",
                    replica.label,
                    one_line(error.describe(), 200),
                    serving,
                    len(self._replicas),
                )
            self._check_outage(replica, now)
        self._probe_soon(replica)

    def _check_outage(self, replica: _Replica, now: float) -> None:
        """After `replica` was taken out: when no replica is left in service, the judge is
        unreachable from now on (one WARNING), and every replica is probed."""
        if self._down_since is not None or self._serving():
            return
        self._down_since = now
        self._back_event = trio.Event()
        log.warning(
            "judge unreachable: no replica can be reached (%s: %s); %s",
            replica.label,
            one_line(replica.last_error or "taken out", 200),
            "comparisons wait for it within their deadlines; probing GET /models"
            if self._watch is not None
            else "calls still go to the least recently failed replica",
        )
        for other in self._replicas:
            self._probe_soon(other)

    def _probe_soon(self, replica: _Replica) -> None:
        if self._watch is not None and not replica.probing:
            replica.probing = True
            self._watch.start_soon(self._probe_loop, replica)

    async def _probe_loop(self, replica: _Replica) -> None:
        """The one probe loop of `replica`: while it is out because it could not be reached, or
        while no replica can be reached, probe it with a doubling wait; an answer brings it back
        (and the judge, if it was unreachable)."""
        wait = min(OUTAGE_PROBE_FIRST_S, self._probe_max)
        try:
            while self._wants_probe(replica):
                await trio.sleep(wait)
                if not self._wants_probe(replica):
                    return  # a trial reached it meanwhile, or the others are back
                problem = await self._probe(replica)
                if problem is None:
                    # back unless an attempt brought it back during the probe
                    self._answered(replica, False, "a probe")
                    return
                log.debug("judge replica %s probe failed: %s", replica.label, problem)
                wait = min(2.0 * wait, self._probe_max)
        finally:
            replica.probing = False

    def _wants_probe(self, replica: _Replica) -> bool:
        return replica.ejected and (replica.unreachable or self._down_since is not None)

    async def _probe(self, replica: _Replica) -> str | None:
        """None when `replica` answered its probe; else why not. A judge that cannot be probed
        (not `Probing`) counts as answering: its next call tells."""
        judge = replica.judge
        if not isinstance(judge, Probing):
            return None
        problem: str | None = f"no reply within {PROBE_LIMIT_S:g}s"
        with trio.move_on_after(PROBE_LIMIT_S):
            problem = await judge.probe()
        return problem

    @property
    def watched(self) -> bool:
        return self._watch is not None

    async def keep_watch(self) -> None:
        """Run the probe loops (docs/reliability.md, "A judge restart") until cancelled; the
        engine runs it in its nursery. Unwatched, a fleet sends calls to the least recently
        failed replica during an outage instead of making them wait. Returns at once when
        another caller watches it already."""
        if self._watch is not None:
            return  # one watcher at a time: the first keeps it
        async with trio.open_nursery() as nursery:
            self._watch = nursery
            try:
                for replica in self._replicas:
                    if self._wants_probe(replica):
                        self._probe_soon(replica)
                await trio.sleep_forever()
            finally:
                self._watch = None

    async def wait_reachable(self) -> None:
        while self._down_since is not None and self._watch is not None:
            await self._back_event.wait()

    def unreachable_for(self) -> float | None:
        if self._down_since is None:
            return None
        return trio.current_time() - self._down_since

    def unreachable_seconds(self) -> float:
        return self._down_total + (self.unreachable_for() or 0.0)

    def _server_error(
        self,
        replica: _Replica,
        trial: bool,
        error: JudgeHTTPError,
        ticket: AttemptTicket | None,
    ) -> None:
        """An HTTP 5xx. When the same comparison's previous attempt got one from another
        replica, the request, not the replicas, is at fault (a prompt the model's template
        rejects, a context the server cannot take): this one is not counted against the
        replica, and the previous one is taken back. Otherwise it counts as any failure."""
        if ticket is None:
            self._failed(replica, trial, error)
            return
        previous = ticket.previous
        ticket.server_error = True
        if previous is not None and previous.server_error and previous.replica != replica.label:
            self._noted(replica, error)
            if previous.forgive is not None:
                previous.forgive()
                previous.forgive = None
            return
        streak, ejections = replica.streak, replica.ejections
        self._failed(replica, trial, error)
        # What to undo: its count in this run of failures, and the ejection or the failed trial
        # it caused (a 5xx is an answer: the replica is alive).
        took_out = replica.ejected and (trial or replica.ejections != ejections)
        ticket.forgive = partial(self._forgive, replica, streak, took_out, replica.ejections)

    def _forgive(self, replica: _Replica, streak: int, took_out: bool, ejections: int) -> None:
        """A 5xx counted against `replica` was the request's fault (`_server_error`)."""
        if replica.streak != streak:
            return  # it answered since: that run of failures is already forgotten
        replica.consecutive = max(0, replica.consecutive - 1)
        if took_out and replica.ejected and replica.ejections == ejections:
            replica.backoff = self._backoff
            self._back(
                replica, "with a server error that the request caused on another replica too"
            )

    def _noted(self, replica: _Replica, error: JudgeAttemptError) -> None:
        """A retryable failure in its counters and last error, not counted for ejection."""
        replica.failures += 1
        replica.last_error = error.describe()[:200]

    def _failed(self, replica: _Replica, trial: bool, error: JudgeAttemptError) -> None:
        now = trio.current_time()
        self._noted(replica, error)
        replica.consecutive += 1
        replica.last_failure = now
        if replica.ejected:
            if trial:
                self._trial_failed(replica, now)
            # Any other attempt on an ejected replica (every replica was out) is no trial: it
            # neither doubles nor extends the back-off.
            return
        if replica.consecutive >= self._threshold:
            self._eject(replica, now)
            log.warning(
                "judge replica %s ejected after %d consecutive failed attempts (last: %s); "
                "a trial attempt in %gs; %d of %d replicas in service",
                replica.label,
                replica.consecutive,
                one_line(error.describe(), 200),
                self._backoff,
                self._serving(),
                len(self._replicas),
            )
            self._check_outage(replica, now)

    def _trial_failed(self, replica: _Replica, now: float) -> None:
        """A trial attempt of ejected `replica` failed: it stays out, twice as long."""
        replica.backoff = min(max(EJECT_BACKOFF_MAX_S, self._backoff), replica.backoff * 2)
        replica.eject_until = now + replica.backoff

    def _serving(self) -> int:
        """How many replicas are in service (not ejected)."""
        return sum(1 for r in self._replicas if not r.ejected)

    def _eject(self, replica: _Replica, now: float) -> None:
        replica.ejected = True
        replica.ejections += 1
        replica.ejected_at = now
        replica.backoff = self._backoff
        replica.eject_until = now + self._backoff

    # --- observability --------------------------------------------------------------------

    def replica_stats(self) -> list[ReplicaStats]:
        now = trio.current_time()
        return [
            ReplicaStats(
                replica=r.label,
                url=r.url,
                calls=r.calls,
                failures=r.failures,
                in_flight=r.in_flight,
                ejected=r.ejected,
                ejections=r.ejections,
                consecutive_failures=r.consecutive,
                stalls=r.stalls,
                back_in_s=max(0.0, r.eject_until - now) if r.ejected else None,
                latency_sum_s=r.latency_sum,
                latency_count=r.latency_count,
                last_error=r.last_error,
                input_tokens=r.input_tokens,
                output_tokens=r.output_tokens,
                reasoning_tokens=r.reasoning_tokens,
                answers_unread=r.answers.finding,
                prompts_unread=r.answers.prompts_unread,
            )
            for r in self._replicas
        ]

    async def aclose(self) -> None:
        """Close every replica's judge. Idempotent."""
        if self._closed:
            return
        self._closed = True
        for replica in self._replicas:
            # bounded: a replica's close drops idle connections; one second caps it anyway
            with trio.CancelScope(shield=True, deadline=trio.current_time() + 1.0):
                await replica.judge.aclose()


def make_judge(settings: Settings, *, backend: NetworkBackend | None = None) -> JudgeFleet:
    """The judge `settings.judge` describes: a `JudgeFleet` of one `HttpJudge` per base URL,
    one replica for a single URL (so that one URL and a list are built, routed and reported one
    way); `backend` opens their connections (tests; else real TCP)."""
    judge = settings.judge
    if judge.base_url is None:
        raise ConfigError("settings", "judge.base_url", "required for an HTTP judge")
    if not judge.api_chosen:
        # the default (Gym's protocol) sent to a plain OpenAI server judges answers the model
        # never sees: a URL needs its API named (docs/configuration.md, "Which judge.api")
        raise ConfigError(
            "settings", "judge.api", f"required with judge.base_url: {JUDGE_API_CHOICES}"
        )
    return JudgeFleet(
        [
            (url, make_http_judge(settings, base_url=url, backend=backend))
            for url in judge.base_urls
        ],
        max_in_flight_per_replica=judge.max_concurrency_per_replica,
        eject_after_failures=judge.eject_after_failures,
        eject_backoff_s=judge.eject_backoff_s,
        stall_after_s=judge.replica_stall_s,
        outage_probe_s=judge.outage_probe_s,
        api=judge.api,
    )
