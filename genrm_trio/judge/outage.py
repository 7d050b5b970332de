"""A judge fleet's outage (judge/fleet.py): replicas that cannot be reached, their probe loops,
and the wait of comparisons while none can be.

Only a replica whose connection could not be opened (`JudgeAttemptError.reached` false: refused,
reset while connecting, a name that does not resolve), or whose start-up probe could not connect,
is **unreachable**: it is out at once and probed (`GET /models`, a doubling wait from
`OUTAGE_PROBE_FIRST_S` up to `judge.outage_probe_s`) until a probe or a trial reaches it. A
replica ejected for what it answered (5xx) or for its timeouts or a stall can be reached: it
keeps the trial back-off of judge/routing.py, and is probed only during an outage.

The judge is **down** (an outage: one WARNING, `unreachable_for`, `/readyz` 503) while every
replica is unreachable. Watched (`keep_watch`, which each engine runs), comparisons then wait
(`wait_reachable`) instead of spending attempts. Several engines may watch one fleet: the watch is
reference-counted, the probe loops run in one watcher's nursery and move to another's when that
one ends, and when the last watcher leaves the waiters are woken (they find the fleet unwatched
and send their calls, as an unwatched fleet does).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Final, final

import trio

from genrm_trio.judge.base import PROBE_LIMIT_S, JudgeAttemptError, Probing, one_line
from genrm_trio.judge.routing import Replica, Router

log = logging.getLogger("genrm_trio.judge")

__all__ = ["OUTAGE_PROBE_FIRST_S", "Outage"]

OUTAGE_PROBE_FIRST_S: Final = 0.5
"""The first probe of a replica that cannot be reached comes this long after it went (or
`judge.outage_probe_s` if shorter); each failed probe doubles the wait, up to that setting."""


@final
class Outage:
    """The unreachable replicas of a fleet, their probes and the outage (module docstring)."""

    def __init__(self, replicas: Sequence[Replica], router: Router, *, probe_max_s: float) -> None:
        self._replicas = replicas
        self._router = router
        self._probe_max = probe_max_s
        self._watch: trio.Nursery | None = None  # where the probe loops run
        self._watchers = 0  # keep_watch calls running
        self._host_left = trio.Event()  # set when the watcher hosting the probe loops ends
        self._down_since: float | None = None
        self._down_total = 0.0  # seconds of outages that are over
        # set (and replaced) when an outage ends or the last watcher leaves: wakes the waiters
        self._wake = trio.Event()

    # --- what the fleet reports -----------------------------------------------------------

    def unreachable(self, replica: Replica, trial: bool, error: JudgeAttemptError) -> None:
        """A call could not reach `replica` (its connection could not be opened): it is out at
        once, and probed until it can be reached (or a trial reaches it)."""
        now = trio.current_time()
        replica.consecutive += 1
        replica.last_failure = now
        replica.unreachable = True
        if replica.ejected:
            if trial:
                self._router.trial_failed(replica, now)
        else:
            self._router.eject(replica, now)
            if not self._all_unreachable():  # else the outage's own line says it
                log.warning(
                    "judge replica %s cannot be reached (%s); out until a probe or a trial "
                    "reaches it; %d of %d replicas in service",
                    replica.label,
                    one_line(error.describe(), 200),
                    self._router.serving(),
                    len(self._replicas),
                )
        self._check(replica, one_line(error.describe(), 200), now, waiting=self.watched)
        self._probe_soon(replica)

    def down_from_start(self, replica: Replica, why: str) -> None:
        """`replica`'s start-up probe could not connect: unreachable from the first second
        (called before the engine that will watch the fleet opens)."""
        now = trio.current_time()
        replica.unreachable = True
        replica.last_failure = now
        if not replica.ejected:
            self._router.eject(replica, now)
        self._check(replica, why, now, waiting=True)
        self._probe_soon(replica)

    def ended(self, replica: Replica, what: str) -> None:
        """`replica` is back in service (it answered `what`): the outage, if any, is over."""
        now = trio.current_time()
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
        self._wake_waiters()
        log.info(
            "judge is back after %.1fs unreachable (replica %s answered %s)",
            gone,
            replica.label,
            what,
        )

    def _all_unreachable(self) -> bool:
        return all(r.ejected and r.unreachable for r in self._replicas)

    def _check(self, replica: Replica, why: str, now: float, *, waiting: bool) -> None:
        """After `replica` became unreachable: when every replica is, the judge is unreachable
        from now on (one WARNING, saying whether comparisons wait: `waiting`), and every
        replica is probed."""
        if self._down_since is not None or not self._all_unreachable():
            return
        self._down_since = now
        log.warning(
            "judge unreachable: no replica can be reached (%s: %s); %s",
            replica.label,
            why,
            "comparisons wait for it within their deadlines; probing GET /models"
            if waiting
            else "calls still go to the least recently failed replica",
        )
        for other in self._replicas:
            self._probe_soon(other)

    # --- the probe loops ------------------------------------------------------------------

    def _probe_soon(self, replica: Replica) -> None:
        if self._watch is not None and not replica.probing:
            replica.probing = True
            self._watch.start_soon(self._probe_loop, replica)

    async def _probe_loop(self, replica: Replica) -> None:
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
                    self._router.answered(replica, False, "a probe")
                    return
                log.debug("judge replica %s probe failed: %s", replica.label, problem)
                wait = min(2.0 * wait, self._probe_max)
        finally:
            replica.probing = False

    def _wants_probe(self, replica: Replica) -> bool:
        return replica.ejected and (replica.unreachable or self._down_since is not None)

    async def _probe(self, replica: Replica) -> str | None:
        """None when `replica` answered its probe; else why not. A judge that cannot be probed
        (not `Probing`) counts as answering: its next call tells."""
        judge = replica.judge
        if not isinstance(judge, Probing):
            return None
        problem: str | None = f"no reply within {PROBE_LIMIT_S:g}s"
        with trio.move_on_after(PROBE_LIMIT_S):
            problem = await judge.probe()
        return problem

    # --- the watch ------------------------------------------------------------------------

    @property
    def watched(self) -> bool:
        return self._watchers > 0

    async def keep_watch(self) -> None:
        """Run the probe loops until cancelled (each engine runs it in its nursery). One
        watcher hosts them; when it ends, another takes over; when the last ends, the waiters
        of `wait_reachable` are woken."""
        self._watchers += 1
        try:
            while True:
                if self._watch is not None:
                    await self._host_left.wait()  # the host ended: take the loops over
                    continue
                async with trio.open_nursery() as nursery:
                    self._watch = nursery
                    self._host_left = trio.Event()
                    try:
                        for replica in self._replicas:
                            if self._wants_probe(replica):
                                self._probe_soon(replica)
                        await trio.sleep_forever()
                    finally:
                        self._watch = None
                        self._host_left.set()
        finally:
            self._watchers -= 1
            if not self._watchers:
                self._wake_waiters()

    async def wait_reachable(self) -> None:
        """Return once a replica can be reached (at once when one can, or when unwatched)."""
        while self._down_since is not None and self._watchers:
            await self._wake.wait()

    def _wake_waiters(self) -> None:
        self._wake.set()
        self._wake = trio.Event()

    def unreachable_for(self) -> float | None:
        if self._down_since is None:
            return None
        return trio.current_time() - self._down_since

    def unreachable_seconds(self) -> float:
        return self._down_total + (self.unreachable_for() or 0.0)
