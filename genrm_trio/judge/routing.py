"""Routing and ejection of a judge fleet's replicas (judge/fleet.py): which replica takes the
next attempt, and which are out.

- **routing**: the replica with the fewest attempts in flight, ties broken round robin, skipping
  ejected replicas, replicas at `judge.max_concurrency_per_replica`, and, while another can take
  the attempt, replicas holding back after a `Retry-After` they sent (D44); a call whose
  `JudgeCall.avoid_replica` names a replica goes elsewhere when it can (failover). With that cap
  the router tells the judge queue how many attempts it can place now (`capacity`);
- **ejection**: a replica whose last `judge.eject_after_failures` finished attempts all failed
  retryably is taken out for `judge.eject_backoff_s`; then one trial attempt at a time may go to
  it (`due_a_trial`, the one place that rule is written): a failed trial doubles the back-off
  (capped at `EJECT_BACKOFF_MAX_S`). When every replica is ejected, attempts still go out, to the
  least recently failed replica; those are no trials. Any answer brings a replica back at once;
- **request faults**: an HTTP 5xx that the same comparison's previous attempt also got from
  another replica is the request's fault: it is not counted, and the previous one is taken back
  (`server_error`, `_forgive`).

An ejection keeps the trial back-off whatever caused it (5xx, timeouts, a stall; a 429 never
ejects: judge/limits.py); only a replica whose connections cannot be opened is `unreachable`,
which the outage (judge/outage.py) probes.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from functools import partial
from typing import Final, final

import trio

from genrm_trio.config import endpoint_of
from genrm_trio.judge.base import AttemptTicket, Judge, JudgeAttemptError, JudgeHTTPError, one_line

log = logging.getLogger("genrm_trio.judge")

__all__ = ["EJECT_BACKOFF_MAX_S", "Replica", "Router", "due_a_trial", "replica_labels"]

EJECT_BACKOFF_MAX_S: Final = 60.0
"""The longest back-off of an ejected replica whose trial attempts keep failing."""


@final
class Replica:
    """One replica's place in the fleet: what routing and ejection decide by. Its counters are
    the ledger's (judge/ledger.py), its stall state the stall watch's (judge/stall.py)."""

    __slots__ = (
        "backoff",
        "consecutive",
        "eject_until",
        "ejected",
        "ejected_at",
        "ejections",
        "hold_until",
        "in_flight",
        "index",
        "judge",
        "label",
        "last_failure",
        "probing",
        "streak",
        "unreachable",
        "url",
    )

    def __init__(self, index: int, label: str, url: str, judge: Judge) -> None:
        self.index = index
        self.label = label
        self.url = url
        self.judge = judge
        self.in_flight = 0
        self.consecutive = 0
        self.streak = 0  # which run of consecutive failures `consecutive` counts
        self.ejected = False
        self.unreachable = False  # out because a call could not reach it (probed until it can)
        self.probing = False  # its probe loop runs (judge/outage.py)
        self.ejections = 0
        self.ejected_at = 0.0
        self.eject_until = 0.0
        self.backoff = 0.0
        self.last_failure = -math.inf
        self.hold_until = -math.inf  # no new attempt before this (its Retry-After), if others can


def replica_labels(urls: Sequence[str]) -> list[str]:
    """Labels for replicas: `host:port`, or the whole base URL where a `host:port` repeats."""
    endpoints = [endpoint_of(url) for url in urls]
    return [
        endpoint if endpoints.count(endpoint) == 1 else url
        for url, endpoint in zip(urls, endpoints, strict=True)
    ]


def due_a_trial(replica: Replica, now: float) -> bool:
    """The trial rule, the one place it is written: an ejected replica whose back-off has run
    out and that has no attempt in flight may take one trial attempt."""
    return replica.ejected and now >= replica.eject_until and replica.in_flight == 0


@final
class Router:
    """Routing and ejection over `replicas` (module docstring). `on_back(replica, what)` is
    called when an ejected replica is back in service."""

    def __init__(
        self,
        replicas: list[Replica],
        *,
        max_in_flight_per_replica: int | None,
        eject_after_failures: int,
        eject_backoff_s: float,
        on_back: Callable[[Replica, str], None],
    ) -> None:
        self.replicas: Final = replicas
        self.cap = max_in_flight_per_replica
        self.threshold = eject_after_failures
        self.backoff = eject_backoff_s
        self._on_back = on_back
        self._next = 0  # where the round robin starts looking
        self._lot = trio.lowlevel.ParkingLot()
        # whether the judge's rate limits hold a replica now (judge/limits.py): routed around
        self.rate_closed: Callable[[str, float], bool] | None = None

    # --- routing --------------------------------------------------------------------------

    def pick(
        self, avoid: str | None, now: float, prefer: str | None = None
    ) -> tuple[Replica, bool] | None:
        """(replica, is a trial of an ejected replica), or None when every replica is full.
        `prefer`: the replica the rate limits admitted the attempt to (not held for it)."""
        replicas = self.replicas
        count = len(replicas)
        best: Replica | None = None
        best_key = (True, True, 0)
        fallback: Replica | None = None
        fallback_key = (True, math.inf)
        cap = self.cap
        in_service = False
        closed = self.rate_closed
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

    async def choose(self, avoid: str | None, prefer: str | None = None) -> tuple[Replica, bool]:
        while True:
            picked = self.pick(avoid, trio.current_time(), prefer)
            if picked is not None:
                return picked
            # Every replica is at judge.max_concurrency_per_replica: wait for a finished call.
            await self._lot.park()

    def slot_freed(self) -> None:
        """An attempt left a replica: one parked in `choose` may find a place."""
        self._lot.unpark_all()

    def capacity(self) -> int | None:
        """Attempts the fleet can place at once now: `max_concurrency_per_replica` for each
        replica in service and one for each ejected replica due a trial (every replica's when
        all are ejected: attempts still go out then); None without a cap."""
        cap = self.cap
        if cap is None:
            return None
        now = trio.current_time()
        serving = trials = 0
        for replica in self.replicas:
            if not replica.ejected:
                serving += 1
            elif due_a_trial(replica, now):
                trials += 1
        if not serving:
            return cap * len(self.replicas)
        return cap * serving + trials

    def held_back_for(self) -> float | None:
        """Seconds until a replica may take a call again when every one an attempt could go to
        now (in service, or ejected and due a trial; every replica when all are backing off, as
        attempts still go out then) is holding back after its `Retry-After`; None when one can
        take it now. A fleet of one so waits out its `Retry-After` as one judge would (D13)."""
        now = trio.current_time()
        holds = [
            replica.hold_until
            for replica in self.replicas
            if not replica.ejected or due_a_trial(replica, now)
        ] or [replica.hold_until for replica in self.replicas]
        held = min(holds) - now
        return held if held > 0 else None

    def serving(self) -> int:
        """How many replicas are in service (not ejected)."""
        return sum(1 for r in self.replicas if not r.ejected)

    # --- ejection -------------------------------------------------------------------------

    def answered(self, replica: Replica, trial: bool, what: str | None = None) -> None:
        """It answered (`what`: a probe, else an attempt): in service at once, whatever it
        answered."""
        replica.consecutive = 0
        replica.streak += 1
        if replica.ejected:
            self.back(replica, what or ("a trial attempt" if trial else "an attempt"))

    def back(self, replica: Replica, what: str) -> None:
        replica.ejected = False
        replica.unreachable = False
        self._on_back(replica, what)

    def failed(self, replica: Replica, trial: bool, error: JudgeAttemptError) -> bool:
        """A retryable failure counted against `replica`; True when it ejected it now."""
        now = trio.current_time()
        replica.consecutive += 1
        replica.last_failure = now
        if replica.ejected:
            if trial:
                self.trial_failed(replica, now)
            # Any other attempt on an ejected replica (every replica was out) is no trial: it
            # neither doubles nor extends the back-off.
            return False
        if replica.consecutive < self.threshold:
            return False
        self.eject(replica, now)
        log.warning(
            "judge replica %s ejected after %d consecutive failed attempts (last: %s); "
            "a trial attempt in %gs; %d of %d replicas in service",
            replica.label,
            replica.consecutive,
            one_line(error.describe(), 200),
            self.backoff,
            self.serving(),
            len(self.replicas),
        )
        return True

    def trial_failed(self, replica: Replica, now: float) -> None:
        """A trial attempt of ejected `replica` failed: it stays out, twice as long."""
        replica.backoff = min(max(EJECT_BACKOFF_MAX_S, self.backoff), replica.backoff * 2)
        replica.eject_until = now + replica.backoff

    def eject(self, replica: Replica, now: float) -> None:
        replica.ejected = True
        replica.ejections += 1
        replica.ejected_at = now
        replica.backoff = self.backoff
        replica.eject_until = now + self.backoff

    # --- request faults -------------------------------------------------------------------

    def server_error(
        self,
        replica: Replica,
        trial: bool,
        error: JudgeHTTPError,
        ticket: AttemptTicket | None,
    ) -> bool:
        """An HTTP 5xx; False when it is not counted against `replica`. When the same
        comparison's previous attempt got one from another replica, the request, not the
        replicas, is at fault (a prompt the model's template rejects, a context the server
        cannot take): this one is not counted, and the previous one is taken back."""
        if ticket is None:
            self.failed(replica, trial, error)
            return True
        previous = ticket.previous
        ticket.server_error = True
        if previous is not None and previous.server_error and previous.replica != replica.label:
            if previous.forgive is not None:
                previous.forgive()
                previous.forgive = None
            return False
        streak, ejections = replica.streak, replica.ejections
        self.failed(replica, trial, error)
        # What to undo: its count in this run of failures, and the ejection or the failed trial
        # it caused (a 5xx is an answer: the replica is alive).
        took_out = replica.ejected and (trial or replica.ejections != ejections)
        ticket.forgive = partial(self._forgive, replica, streak, took_out, replica.ejections)
        return True

    def _forgive(self, replica: Replica, streak: int, took_out: bool, ejections: int) -> None:
        """A 5xx counted against `replica` was the request's fault (`server_error`)."""
        if replica.streak != streak:
            return  # it answered since: that run of failures is already forgotten
        replica.consecutive = max(0, replica.consecutive - 1)
        if took_out and replica.ejected and replica.ejections == ejections:
            replica.backoff = self.backoff
            self.back(replica, "with a server error that the request caused on another replica too")
