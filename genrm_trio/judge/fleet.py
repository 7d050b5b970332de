"""A fleet of judge replicas behind one `Judge`: routing, failover, ejection, per-replica stats.

`judge.base_url` as a list of URLs makes a `JudgeFleet` of one `HttpJudge` per replica (each with
its own keep-alive pool). Every attempt goes to one replica:

- **routing**: the replica with the fewest attempts in flight, ties broken round robin, skipping
  ejected replicas and replicas at `judge.max_concurrency_per_replica`;
- **failover**: an attempt whose `JudgeCall.avoid_replica` names a replica (the `Comparator`
  sets it after a retryable failure there) goes to another one when any is available;
- **ejection**: a replica whose last `judge.eject_after_failures` finished attempts all failed
  retryably (transport error, 408, 429, 5xx) is taken out for `judge.eject_backoff_s`; then one
  trial attempt at a time may go to it: an answer brings it back, a failure doubles the back-off
  (capped at `EJECT_BACKOFF_MAX_S`). While ejected it gets no traffic, however few attempts it
  has in flight, so a replica that fails fast cannot attract calls. When every replica is ejected,
  attempts still go out, to the least recently failed replica, rather than failing untried.
  An attempt that hung for the whole `judge_request_timeout_s` (`hang_after_s`) counts as a failed
  one here, so a replica that accepts calls and never answers is ejected like one that refuses
  them (the timed-out comparison itself is still not retried, D14).

Retries, pacing and deadlines stay in `judge.attempts` (one shared budget per comparison); the
fleet adds no attempts of its own. An attempt cancelled before `hang_after_s` (by its group, by a
group deadline, by a disconnect) counts neither as an answer nor as a failure.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from typing import Final, final

import trio

from genrm_trio.config import ConfigError, Settings, endpoint_of
from genrm_trio.judge.base import (
    Judge,
    JudgeAttemptError,
    JudgeCall,
    JudgeReply,
    JudgeTimeout,
    ReplicaStats,
    one_line,
)
from genrm_trio.judge.client import make_http_judge

log = logging.getLogger("genrm_trio.judge")

__all__ = ["EJECT_BACKOFF_MAX_S", "JudgeFleet", "make_judge"]

EJECT_BACKOFF_MAX_S: Final = 60.0
"""The longest back-off of an ejected replica whose trial attempts keep failing."""


@final
class _Replica:
    __slots__ = (
        "backoff",
        "calls",
        "consecutive",
        "eject_until",
        "ejected",
        "ejected_at",
        "ejections",
        "failures",
        "in_flight",
        "index",
        "judge",
        "label",
        "last_error",
        "last_failure",
        "latency_count",
        "latency_sum",
        "url",
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
        self.ejected = False
        self.ejections = 0
        self.ejected_at = 0.0
        self.eject_until = 0.0
        self.backoff = 0.0
        self.last_failure = -math.inf
        self.last_error: str | None = None
        self.latency_sum = 0.0
        self.latency_count = 0


def replica_labels(urls: Sequence[str]) -> list[str]:
    """Labels for replicas: `host:port`, or the whole base URL where a `host:port` repeats."""
    endpoints = [endpoint_of(url) for url in urls]
    return [
        endpoint if endpoints.count(endpoint) == 1 else url
        for url, endpoint in zip(urls, endpoints, strict=True)
    ]


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
        hang_after_s: float | None = None,
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
        self._hang_after = hang_after_s  # an attempt cancelled this late never answered
        self._next = 0  # where the round robin starts looking
        self._lot = trio.lowlevel.ParkingLot()
        self._path = replicas[0][1].path
        self._endpoint = ",".join(labels)
        self._closed = False

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

    def _pick(self, avoid: str | None, now: float) -> tuple[_Replica, bool] | None:
        """(replica, is a trial of an ejected replica), or None when every replica is full."""
        replicas = self._replicas
        count = len(replicas)
        best: _Replica | None = None
        best_key = (True, 0)
        fallback: _Replica | None = None
        fallback_key = (True, math.inf)
        cap = self._cap
        in_service = False
        for offset in range(count):
            replica = replicas[(self._next + offset) % count]
            in_service = in_service or not replica.ejected
            if cap is not None and replica.in_flight >= cap:
                continue
            if replica.ejected:
                # A back-off that ran out admits one trial attempt at a time.
                if now >= replica.eject_until and replica.in_flight == 0:
                    key = (replica.label == avoid, 0)
                    if best is None or key < best_key:
                        best, best_key = replica, key
                else:
                    fkey = (replica.label == avoid, replica.last_failure)
                    if fallback is None or fkey < fallback_key:
                        fallback, fallback_key = replica, fkey
                continue
            key = (replica.label == avoid, replica.in_flight)
            if best is None or key < best_key:
                best, best_key = replica, key
        # Only when every replica is ejected does an attempt go to one still backing off.
        chosen = best if best is not None or in_service else fallback
        if chosen is None:
            return None
        self._next = (chosen.index + 1) % count
        return chosen, chosen.ejected

    async def _choose(self, avoid: str | None) -> tuple[_Replica, bool]:
        while True:
            picked = self._pick(avoid, trio.current_time())
            if picked is not None:
                return picked
            # Every replica is at judge.max_concurrency_per_replica: wait for a finished call.
            await self._lot.park()

    # --- the attempt ----------------------------------------------------------------------

    async def attempt(self, call: JudgeCall) -> JudgeReply:
        if self._closed:
            raise RuntimeError("JudgeFleet is closed")
        replica, trial = await self._choose(call.avoid_replica)
        replica.in_flight += 1
        replica.calls += 1
        started = trio.current_time()
        try:
            reply = await replica.judge.attempt(call)
        except JudgeAttemptError as error:
            error.replica = replica.label
            self._finished(replica, started)
            if error.retryable:
                self._failed(replica, trial, error)
            else:  # it answered (a 4xx, a body that is not JSON): alive
                self._answered(replica, trial)
            raise
        except BaseException:
            replica.in_flight -= 1
            self._lot.unpark_all()
            hang = self._hang_after
            if hang is not None and trio.current_time() - started >= hang:
                # Cancelled by the attempt's own deadline: the replica took every second of it.
                self._failed(replica, trial, JudgeTimeout(hang))
            raise  # else cancelled early: neither an answer nor a failure
        self._finished(replica, started)
        self._answered(replica, trial)
        return reply

    def _finished(self, replica: _Replica, started: float) -> None:
        replica.in_flight -= 1
        replica.latency_sum += trio.current_time() - started
        replica.latency_count += 1
        self._lot.unpark_all()

    def _answered(self, replica: _Replica, trial: bool) -> None:
        replica.consecutive = 0
        if replica.ejected and trial:
            replica.ejected = False
            log.warning(
                "judge replica %s is back after %.1fs out (it answered a trial attempt)",
                replica.label,
                trio.current_time() - replica.ejected_at,
            )

    def _failed(self, replica: _Replica, trial: bool, error: JudgeAttemptError) -> None:
        now = trio.current_time()
        replica.failures += 1
        replica.consecutive += 1
        replica.last_failure = now
        replica.last_error = error.describe()[:200]
        if replica.ejected:
            if trial:  # the trial failed: stay out, twice as long
                replica.backoff = min(max(EJECT_BACKOFF_MAX_S, self._backoff), replica.backoff * 2)
                replica.eject_until = now + replica.backoff
            return
        if replica.consecutive >= self._threshold:
            replica.ejected = True
            replica.ejections += 1
            replica.ejected_at = now
            replica.backoff = self._backoff
            replica.eject_until = now + self._backoff
            others = sum(1 for r in self._replicas if not r.ejected)
            log.warning(
                "judge replica %s ejected after %d consecutive failed attempts (last: %s); "
                "a trial attempt in %gs; %d of %d replicas in service",
                replica.label,
                replica.consecutive,
                one_line(replica.last_error, 200),
                self._backoff,
                others,
                len(self._replicas),
            )

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
                back_in_s=max(0.0, r.eject_until - now) if r.ejected else None,
                latency_sum_s=r.latency_sum,
                latency_count=r.latency_count,
                last_error=r.last_error,
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


ReplicaSource = Callable[[], Sequence[ReplicaStats]]


def make_judge(settings: Settings) -> Judge:
    """The judge `settings.judge` describes: one `HttpJudge` for a base URL, a `JudgeFleet` of
    them for a list."""
    judge = settings.judge
    if judge.base_url is None:
        raise ConfigError("settings", "judge.base_url", "required for an HTTP judge")
    if not judge.fleet:
        return make_http_judge(settings)
    return JudgeFleet(
        [(url, make_http_judge(settings, base_url=url)) for url in judge.base_urls],
        max_in_flight_per_replica=judge.max_concurrency_per_replica,
        eject_after_failures=judge.eject_after_failures,
        eject_backoff_s=judge.eject_backoff_s,
        hang_after_s=settings.judge_request_timeout_s,
    )
