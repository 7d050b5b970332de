"""A fleet of judge replicas behind one `Judge`: the one judge path.

Every judge the engine uses is a `JudgeFleet`: `judge.base_url` makes one `HttpJudge` replica
per URL (each with its own keep-alive pool; `make_judge`, judge/factory.py), and `open_engine`
wraps any other `Judge` (an in-process one, such as the simulated judge) in a fleet of one
(`as_fleet`), which reports no replicas. With one replica nothing below changes one judge's
behaviour: a failure is not "retried elsewhere" (the `Comparator` retries a replica's failures
only with two replicas or more), a `Retry-After` is waited out, no replica can stall (that needs
another one answering), and an ejected replica still takes the attempts (every replica out: they
go to the least recently failed one). Only a judge that cannot be reached is waited for.

The fleet is a facade over one module per job:

- judge/routing.py: which replica takes an attempt (fewest in flight, round robin, the per-replica
  cap, `Retry-After` holds, failover), ejection with its trial back-off, and 5xx forgiveness;
- judge/outage.py: replicas that cannot be reached, their probe loops, the outage and
  `wait_reachable`, and the reference-counted watch (`keep_watch`);
- judge/stall.py: the stall watch (`judge.replica_stall_s`);
- judge/ledger.py: the reply observer (`ReplyObserver`, `observe`) and the per-replica ledger fed
  by it: calls, failures, latency, usage, the answer check and the prompt check;
- judge/answer_probe.py: with `answer_probe`, one comparison sent to each replica when it is first
  watched and whenever it comes back, whose prompt tokens say whether it reads the answers.

Why an attempt ended the fleet is told, not guessed: an answer or a failure it sees; its own
deadline the `Comparator` reports through the attempt's `AttemptTicket` (a hung replica is then
failed and ejected like one that refuses); any other cancellation (the group's deadline, a
disconnect) counts neither as an answer nor as a failure. Retries, pacing and deadlines stay in
`judge.attempts` (one shared budget per comparison); the fleet adds no attempts of its own.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from functools import partial
from typing import TypeVar, final

import trio

from genrm_trio.judge.answer_probe import ProbeFailed, probe_answers
from genrm_trio.judge.base import (
    Judge,
    JudgeAttemptError,
    JudgeCall,
    JudgeHTTPError,
    JudgeReply,
    JudgeStalled,
    JudgeTransportError,
    ReplicaStats,
)
from genrm_trio.judge.ledger import ReplicaLedger, ReplyObserver
from genrm_trio.judge.outage import OUTAGE_PROBE_FIRST_S, Outage
from genrm_trio.judge.routing import EJECT_BACKOFF_MAX_S, Replica, Router, replica_labels
from genrm_trio.judge.stall import StallWatch

__all__ = [
    "CLOSE_S",
    "EJECT_BACKOFF_MAX_S",
    "OUTAGE_PROBE_FIRST_S",
    "JudgeFleet",
    "as_fleet",
]

CLOSE_S = 1.0
"""`JudgeFleet.aclose` closes every replica at once within this long (a close drops idle
connections; a TLS close to a judge that stopped reading must not hold a shutdown)."""

_T = TypeVar("_T")


def _join(members: list[_T], member: _T) -> Callable[[], None]:
    """Add `member` to `members`; returns the call that takes it out again (if still in)."""
    members.append(member)

    def leave() -> None:
        if member in members:
            members.remove(member)

    return leave


@final
class JudgeFleet:
    """A `Judge` spreading attempts over several replicas (see the module docstring).

    `report_replicas` False: an in-process judge wrapped by `as_fleet`, which has no replicas to
    report (`replica_stats` is empty, `GET /judge/replicas` answers `[]`) and no ledger."""

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
        labels: Sequence[str] | None = None,
        report_replicas: bool = True,
        sends_roles: bool = False,
        answer_probe_s: float | None = None,
        instruct_twins: Sequence[Judge] = (),
    ) -> None:
        """`sends_roles`: the replicas are sent the GenRM roles (the ledger watches whether they
        take them); `answer_probe_s`: probe each replica's reading of the answers, bounded by
        this (None: not probed); `instruct_twins`: each replica again with `judge.prompt:
        instruct`, with which the probe tells a refusal of the roles (closed with the fleet)."""
        if not replicas:
            raise ValueError("a judge fleet needs at least one replica")
        urls = [url for url, _ in replicas]
        names = list(labels) if labels is not None else replica_labels(urls)
        self._replicas = [
            Replica(index, label, url, judge)
            for index, (label, (url, judge)) in enumerate(zip(names, replicas, strict=True))
        ]
        self._router = Router(
            self._replicas,
            max_in_flight_per_replica=max_in_flight_per_replica,
            eject_after_failures=eject_after_failures,
            eject_backoff_s=eject_backoff_s,
            on_back=self._on_back,
        )
        self._outage = Outage(self._replicas, self._router, probe_max_s=outage_probe_s)
        self._stall = StallWatch(self._replicas, self._router, stall_after_s)
        self._ledger = (
            ReplicaLedger(len(self._replicas), api, sends_roles=sends_roles)
            if report_replicas
            else None
        )
        self._answer_probe_s = answer_probe_s if self._ledger is not None else None
        self._twins = list(instruct_twins)
        # replicas whose answer probe is due: each at the first watch, again when it is back
        self._to_probe = list(self._replicas) if self._answer_probe_s is not None else []
        self._probe_wanted = trio.Event()
        self._observers: list[ReplyObserver] = [] if self._ledger is None else [self._ledger]
        self._path = replicas[0][1].path
        self._endpoint = ",".join(names)
        self._closed = False
        self._capacity_watchers: list[Callable[[], None]] = []  # the judge queues'

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

    # --- what the judge queue and the Comparator ask -------------------------------------

    def capacity(self) -> int | None:
        """Attempts the fleet can place at once now (judge/routing.py), or None: no cap. The
        judge queue hands out no more slots than this, so that an attempt never waits here for
        a replica."""
        return self._router.capacity()

    def watch_capacity(self, changed: Callable[[], None]) -> Callable[[], None]:
        """Call `changed` when a replica is back in service (its slots are usable at once);
        returns the call that stops it (a judge queue's `close`)."""
        return _join(self._capacity_watchers, changed)

    def route_around(self, closed: Callable[[str, float], bool]) -> None:
        """Send new calls to the replicas the judge's rate limits leave open (`closed(label,
        now)` says which they hold; judge/limits.py) while another can take them."""
        self._router.rate_closed = closed

    def held_back_for(self) -> float | None:
        """Seconds until a replica may take a call again when every one the next attempt could
        go to holds back after its `Retry-After`; None when one can take it now."""
        return self._router.held_back_for()

    def observe(self, observer: ReplyObserver) -> Callable[[], None]:
        """Tell `observer` what becomes of every attempt on every replica (judge/ledger.py);
        returns the call that stops it."""
        return _join(self._observers, observer)

    # --- the outage (judge/outage.py) -----------------------------------------------------

    @property
    def watched(self) -> bool:
        """Some engine runs `keep_watch`: a call that reaches no replica is then no attempt,
        and comparisons wait out an outage (`wait_reachable`)."""
        return self._outage.watched

    async def keep_watch(self) -> None:
        """Probe the replicas that cannot be reached until they answer, and each replica's
        reading of the answers when due; runs until cancelled (each engine runs it in its
        nursery; several may: judge/outage.py; a due answer probe is sent by one of them)."""
        if self._answer_probe_s is None:
            await self._outage.keep_watch()
            return
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._answer_probes)
            await self._outage.keep_watch()

    async def _answer_probes(self) -> None:
        """Send each due answer probe, as they fall due."""
        async with trio.open_nursery() as nursery:
            while True:
                while self._to_probe:
                    nursery.start_soon(self._probe_answers, self._to_probe.pop(0))
                await self._probe_wanted.wait()

    async def _probe_answers(self, replica: Replica) -> None:
        ledger, limit = self._ledger, self._answer_probe_s
        assert ledger is not None and limit is not None
        twin = self._twins[replica.index] if self._twins else None
        with trio.move_on_after(limit):
            ledger.probed(replica, await probe_answers(replica.judge, instruct=twin))
            return
        ledger.probed(replica, ProbeFailed(f"no reply within {limit:g}s"))

    def _answer_probe_due(self, replica: Replica) -> None:
        if self._answer_probe_s is None or replica in self._to_probe:
            return
        self._to_probe.append(replica)
        wanted, self._probe_wanted = self._probe_wanted, trio.Event()
        wanted.set()

    async def wait_reachable(self) -> None:
        """Return once a replica can be reached (at once when one can, or when not watched)."""
        await self._outage.wait_reachable()

    def unreachable_for(self) -> float | None:
        """Seconds since no replica could be reached, or None when one can."""
        return self._outage.unreachable_for()

    def unreachable_seconds(self) -> float:
        """Seconds, in all, during which no replica could be reached."""
        return self._outage.unreachable_seconds()

    def down_from_start(self, base_urls: Iterable[str], why: str) -> None:
        """The replicas of `base_urls` could not be connected to by the start-up probe
        (judge/probe.py): unreachable from the first second, probed while watched."""
        down = set(base_urls)
        for replica in self._replicas:
            if replica.url in down:
                self._outage.down_from_start(replica, why)

    # --- the attempt ----------------------------------------------------------------------

    async def attempt(self, call: JudgeCall) -> JudgeReply:
        if self._closed:
            raise RuntimeError("JudgeFleet is closed")
        replica, trial = await self._router.choose(call.avoid_replica, call.prefer_replica)
        started = trio.current_time()
        replica.in_flight += 1
        self._stall.started(replica, started)
        observers = self._observers
        for observer in observers:
            observer.sent(replica)
        ticket = call.ticket
        if ticket is not None:
            # its own deadline (the Comparator says so): the replica took all of it, a failure
            ticket.went_to(replica.label, partial(self._failed, replica, trial))
        try:
            reply = await self._stall.attempt(replica, call)
        except JudgeStalled as error:  # cancelled by its replica's stall: no answer, a failure
            error.replica = replica.label
            self._left(replica)
            self._failed(replica, trial, error)
            raise
        except JudgeAttemptError as error:
            error.replica = replica.label
            self._errored(replica, trial, call, started, error)
            raise
        except BaseException:
            # Cancelled: by the attempt's own deadline (the Comparator says so through the
            # ticket, `_failed`) or from outside (neither an answer nor a failure).
            self._left(replica)
            raise
        now = trio.current_time()
        replica.in_flight -= 1
        self._router.slot_freed()
        self._stall.finished(replica, now, answered=True)
        self._router.answered(replica, trial)
        for observer in observers:
            observer.finished(replica, call, now - started, reply, None)
        return reply

    def _errored(
        self,
        replica: Replica,
        trial: bool,
        call: JudgeCall,
        started: float,
        error: JudgeAttemptError,
    ) -> None:
        """The attempt on `replica` came back with `error`."""
        now = trio.current_time()
        replica.in_flight -= 1
        self._router.slot_freed()
        # An HTTP status is an answer; a broken or refused connection is not (no evidence
        # that the replicas are serving, which a stall of another one needs).
        self._stall.finished(replica, now, answered=not isinstance(error, JudgeTransportError))
        observers = self._observers
        if not error.reached and self._outage.watched:
            for observer in observers:
                observer.not_sent(replica, error)  # no attempt: it goes out again
            self._outage.unreachable(replica, trial, error)
            return
        for observer in observers:
            observer.finished(replica, call, now - started, None, error)
        if not error.reached:
            for observer in observers:
                observer.failed(replica, error)
            self._outage.unreachable(replica, trial, error)
        elif isinstance(error, JudgeHTTPError) and error.status == 429:
            # throttled is serving: the rate limits hold it (judge/limits.py); never a failure
            self._router.answered(replica, trial)
            if error.retry_after is not None:
                replica.hold_until = now + error.retry_after
        elif error.retryable or error.retry_elsewhere:
            for observer in observers:
                observer.failed(replica, error)
            if isinstance(error, JudgeHTTPError) and error.status >= 500:
                self._router.server_error(replica, trial, error, call.ticket)
            else:
                self._router.failed(replica, trial, error)
            if isinstance(error, JudgeHTTPError) and error.retry_after is not None:
                replica.hold_until = now + error.retry_after
        else:  # it answered (a 4xx, a body that is not JSON): alive
            self._router.answered(replica, trial)

    def _failed(self, replica: Replica, trial: bool, error: JudgeAttemptError) -> None:
        """A retryable failure of `replica` that it did not answer (a stall, its deadline)."""
        for observer in self._observers:
            observer.failed(replica, error)
        self._router.failed(replica, trial, error)

    def _left(self, replica: Replica) -> None:
        """An attempt on `replica` ended without finishing (cancelled)."""
        replica.in_flight -= 1
        self._router.slot_freed()
        self._stall.left(replica)

    def _on_back(self, replica: Replica, what: str) -> None:
        """`replica` is back in service: its slots are usable, and an outage is over."""
        for changed in tuple(self._capacity_watchers):
            changed()
        self._outage.ended(replica, what)
        self._answer_probe_due(replica)

    # --- observability --------------------------------------------------------------------

    def replica_stats(self) -> list[ReplicaStats]:
        ledger = self._ledger
        if ledger is None:
            return []
        now = trio.current_time()
        stats = []
        for r, counts in zip(self._replicas, ledger.counts, strict=True):
            stats.append(
                ReplicaStats(
                    replica=r.label,
                    url=r.url,
                    calls=counts.calls,
                    failures=counts.failures,
                    in_flight=r.in_flight,
                    ejected=r.ejected,
                    ejections=r.ejections,
                    consecutive_failures=r.consecutive,
                    stalls=self._stall.stalls(r),
                    back_in_s=max(0.0, r.eject_until - now) if r.ejected else None,
                    latency_sum_s=counts.latency_sum,
                    latency_count=counts.latency_count,
                    last_error=counts.last_error,
                    input_tokens=counts.input_tokens,
                    output_tokens=counts.output_tokens,
                    reasoning_tokens=counts.reasoning_tokens,
                    answers_unread=counts.answers.finding,
                    prompts_unread=counts.answers.prompts_unread,
                    roles_refused=counts.prompt.finding,
                    context_overflows=counts.context_overflows,
                )
            )
        return stats

    async def aclose(self) -> None:
        """Close every replica's judge, all at once, within `CLOSE_S` in all. Idempotent."""
        if self._closed:
            return
        self._closed = True
        with trio.CancelScope(shield=True, deadline=trio.current_time() + CLOSE_S):
            async with trio.open_nursery() as nursery:
                for judge in [replica.judge for replica in self._replicas] + self._twins:
                    nursery.start_soon(judge.aclose)


def as_fleet(judge: Judge) -> JudgeFleet:
    """`judge` when it is a fleet, else a fleet of one around it: an in-process judge (the
    simulated one, a test's), labelled by its `endpoint` and reporting no replicas. The one
    place a judge's type is asked: every consumer sees a fleet."""
    if isinstance(judge, JudgeFleet):
        return judge
    return JudgeFleet([(judge.endpoint, judge)], labels=[judge.endpoint], report_replicas=False)
