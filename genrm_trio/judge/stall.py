"""The stall watch of a judge fleet (judge/fleet.py; `judge.replica_stall_s`, off by default).

A replica that has had attempts in flight and finished none of them for `replica_stall_s`, while
another replica answered (a reply or an HTTP status, not a broken connection) in that time, is
stalled: it is taken out as an ejected one is (the trial back-off of judge/routing.py), and its
attempts in flight are cancelled (`JudgeStalled`, retryable, so each is retried elsewhere).

The stall clock is a cancel scope per attempt, of which one per replica carries the deadline
`quiet_since + replica_stall_s`, set only once another replica has answered since `quiet_since`:
when it fires, the condition holds by construction, and keeping it costs O(1) per answer.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import final

import trio

from genrm_trio.judge.base import JudgeCall, JudgeReply, JudgeStalled
from genrm_trio.judge.routing import Replica, Router

log = logging.getLogger("genrm_trio.judge")

__all__ = ["StallWatch"]


@final
class _Quiet:
    """One replica's stall state."""

    __slots__ = ("armed", "attempts", "quiet_since", "stalling", "stalls", "watch")

    def __init__(self) -> None:
        self.stalls = 0
        self.quiet_since = 0.0  # since when it has had attempts in flight and finished none
        self.armed = False  # another replica answered since quiet_since
        self.attempts: set[trio.CancelScope] = set()  # the scopes of its attempts in flight
        self.watch: trio.CancelScope | None = None  # the one carrying the stall deadline
        self.stalling = False  # a stall was declared; its attempts are being cancelled


@final
class StallWatch:
    """Stall detection over a fleet's replicas (module docstring); `stall_after_s` None: off,
    and then every method but `attempt` and `stalls` does nothing."""

    def __init__(
        self, replicas: Sequence[Replica], router: Router, stall_after_s: float | None
    ) -> None:
        self._replicas = replicas
        self._router = router
        self.stall_after = stall_after_s
        self._quiet = [_Quiet() for _ in replicas]

    def stalls(self, replica: Replica) -> int:
        """Times `replica` was taken out as stalled."""
        return self._quiet[replica.index].stalls

    def started(self, replica: Replica, now: float) -> None:
        """An attempt went to `replica` (its `in_flight` already counts it)."""
        if self.stall_after is not None and replica.in_flight == 1:
            self._quiet[replica.index].quiet_since = now

    async def attempt(self, replica: Replica, call: JudgeCall) -> JudgeReply:
        """`replica.judge.attempt(call)`, in a cancel scope the replica's stall cancels."""
        if self.stall_after is None:
            return await replica.judge.attempt(call)
        quiet = self._quiet[replica.index]
        with trio.CancelScope() as scope:
            quiet.attempts.add(scope)
            if quiet.armed and quiet.watch is None:
                self._arm(quiet)
            try:
                return await replica.judge.attempt(call)
            finally:
                quiet.attempts.discard(scope)
                if quiet.watch is scope:
                    quiet.watch = None
        # Only this scope's own cancellation ends up here: the stall deadline it carried (then
        # the replica stalls now), or the stall another of its attempts declared.
        if not quiet.stalling:
            self._stall(replica)
        raise JudgeStalled(
            f"judge replica {replica.label} finished none of its calls in flight for "
            f"{self.stall_after:g}s while other replicas answered"
        )

    def left(self, replica: Replica) -> None:
        """An attempt on `replica` ended without finishing (its `in_flight` already dropped)."""
        if self.stall_after is None:
            return
        quiet = self._quiet[replica.index]
        if replica.in_flight == 0:
            quiet.armed = False
            quiet.stalling = False
        elif quiet.armed and quiet.watch is None:
            self._arm(quiet)  # the stall deadline moves to another of its attempts

    def finished(self, replica: Replica, now: float, *, answered: bool) -> None:
        """An attempt on `replica` finished (its `in_flight` already dropped): its silence, if
        any, is over; and if that was an answer, every other busy replica's silence now has an
        answer beside it (the condition of a stall)."""
        if self.stall_after is None:
            return
        quiet = self._quiet[replica.index]
        quiet.quiet_since = now
        quiet.armed = False
        if quiet.watch is not None:
            quiet.watch.deadline = math.inf
            quiet.watch = None
        if replica.in_flight == 0:
            quiet.stalling = False
        if not answered:
            return
        for other in self._replicas:
            other_quiet = self._quiet[other.index]
            if other is not replica and other.in_flight and not other_quiet.armed:
                other_quiet.armed = True
                self._arm(other_quiet)

    def _arm(self, quiet: _Quiet) -> None:
        """Put the replica's stall deadline on one of its attempts in flight."""
        assert self.stall_after is not None
        if quiet.attempts and quiet.watch is None:
            watch = next(iter(quiet.attempts))
            watch.deadline = quiet.quiet_since + self.stall_after
            quiet.watch = watch

    def _stall(self, replica: Replica) -> None:
        """`replica` stalled: out of rotation, its other attempts in flight cancelled. Stalled
        is not unreachable: it keeps the trial back-off and starts no outage."""
        quiet = self._quiet[replica.index]
        quiet.stalling = True
        quiet.armed = False
        for scope in quiet.attempts:
            scope.cancel()
        if replica.ejected:
            return  # a trial attempt stalled: it fails as a trial (the back-off doubles)
        quiet.stalls += 1
        router = self._router
        router.eject(replica, trio.current_time())
        log.warning(
            "judge replica %s stalled: %d calls in flight, none finished for %gs while other "
            "replicas answered; they are retried elsewhere; a trial attempt in %gs; %d of %d "
            "replicas in service",
            replica.label,
            replica.in_flight,
            self.stall_after,
            router.backoff,
            router.serving(),
            len(self._replicas),
        )
