"""Open-file headroom at start (docs/configuration.md, "Start-up warnings"): how many descriptors
a full server may hold, raising the soft `RLIMIT_NOFILE` to the hard limit, and fitting the
default admission limit (`server.max_active_cohorts`) to what the limit holds. `serve` runs
`check_fd_headroom` once before it listens and serves with `with_admission`'s settings.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from dataclasses import dataclass
from typing import Final, final

from genrm_trio.config import Settings

__all__ = ["FD_RESERVE", "FdHeadroom", "check_fd_headroom", "fds_needed", "with_admission"]

log = logging.getLogger("genrm_trio.serve")  # a start-up check: the serve logger's lines

FD_RESERVE: Final = 64
"""Descriptors kept for everything else: the listening socket, logs, the state file, probes."""


@final
@dataclass(frozen=True, slots=True)
class FdHeadroom:
    """What the start-up file-descriptor check found (`check_fd_headroom`)."""

    soft: int | None  # RLIMIT_NOFILE soft limit after the raise attempt; None = unlimited/unknown
    hard: int | None
    raised_from: int | None  # the soft limit before it was raised, when it was
    open_now: int
    needed: int
    # the lower server.max_active_cohorts that fits the limit, when the default did not
    max_active_cohorts: int | None = None

    @property
    def enough(self) -> bool:
        return self.soft is None or self.soft - self.open_now >= self.needed


def fds_needed(settings: Settings) -> int:
    """Descriptors a full server may hold: one per waiting `/verify` request (every active cohort
    can hold N of them), one per judge connection, plus a fixed reserve."""
    requests = settings.server.max_active_cohorts * settings.num_rollouts_per_prompt
    if not settings.cohorting:
        requests = 0  # singletons are answered at once; nothing waits
    return requests + settings.judge.max_concurrency + FD_RESERVE


def _open_fds() -> int:
    for directory in ("/proc/self/fd", "/dev/fd"):
        try:
            return len(os.listdir(directory))
        except OSError:
            continue
    return 0


def check_fd_headroom(settings: Settings) -> FdHeadroom:
    """Raise the soft RLIMIT_NOFILE to the hard limit; fit the admission limit to it, or warn.

    A server at `server.max_active_cohorts` holds up to max_active_cohorts × N waiting
    connections plus `judge.max_concurrency` judge connections; running out of descriptors turns
    into refused connections and failed judge calls, far from the cause. The default of 4,096
    groups of 16 needs ~66,000 descriptors, more than most limits: when the key was left at its
    default, the result names the largest `max_active_cohorts` that fits (`serve` admits that
    many, so a new group past it gets the capacity 503, a clear answer at the cause) and one INFO
    line says so. A warning naming the numbers and the two remedies (`ulimit -n`, a lower
    `server.max_active_cohorts`) remains for what cannot be fitted: a value set explicitly, or a
    limit too low for even one group.
    """
    needed = fds_needed(settings)
    open_now = _open_fds()
    try:
        import resource
    except ImportError:  # not a POSIX system: nothing to check
        return FdHeadroom(None, None, None, open_now, needed)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    infinity = resource.RLIM_INFINITY
    raised_from: int | None = None
    if soft != infinity and (hard == infinity or hard > soft):
        target = hard
        if hard == infinity:
            try:
                with open("/proc/sys/fs/nr_open") as file:
                    target = int(file.read())
            except (OSError, ValueError):
                target = 1 << 20
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (OSError, ValueError) as exc:
            log.debug("cannot raise RLIMIT_NOFILE from %d to %d: %s", soft, target, exc)
        else:
            raised_from, soft = soft, target
            log.info("raised the open-file limit (RLIMIT_NOFILE) from %d to %d", raised_from, soft)
    result = FdHeadroom(
        None if soft == infinity else soft,
        None if hard == infinity else hard,
        raised_from,
        open_now,
        needed,
    )
    fitted = _fitted_admission(settings, result)
    if fitted is not None:
        log.info(
            "server.max_active_cohorts: %d, what the open-file limit %d allows (%d open now, "
            "%d judge connections, %d reserve, %d descriptors per group of "
            "num_rollouts_per_prompt); the default %d would need %d: raise the limit "
            "(ulimit -n %d) to admit more, or set the key",
            fitted,
            soft,
            open_now,
            settings.judge.max_concurrency,
            FD_RESERVE,
            settings.num_rollouts_per_prompt,
            settings.server.max_active_cohorts,
            needed,
            needed,
        )
        return dataclasses.replace(result, max_active_cohorts=fitted)
    if not result.enough:
        requests = needed - settings.judge.max_concurrency - FD_RESERVE
        log.warning(
            "open-file limit %d (hard limit %s, %d open now) leaves less than the %d descriptors "
            "a full server may need (%d waiting /verify requests: server.max_active_cohorts=%d x "
            "num_rollouts_per_prompt=%d; %d judge connections: judge.max_concurrency; %d "
            "reserve): raise the limit (ulimit -n %d) or lower server.max_active_cohorts",
            soft,
            "unlimited" if hard == infinity else hard,
            open_now,
            needed,
            requests,
            settings.server.max_active_cohorts,
            settings.num_rollouts_per_prompt,
            settings.judge.max_concurrency,
            FD_RESERVE,
            needed,
        )
    return result


def _fitted_admission(settings: Settings, headroom: FdHeadroom) -> int | None:
    """The largest max_active_cohorts the descriptors hold, when the default must be lowered
    to fit (None: it fits, it was set explicitly, or no group size would fit)."""
    if headroom.enough or headroom.soft is None or not settings.cohorting:
        return None
    if "max_active_cohorts" in settings.server.model_fields_set:
        return None  # the operator's value: warn, never override it
    spare = headroom.soft - headroom.open_now - settings.judge.max_concurrency - FD_RESERVE
    groups = spare // settings.num_rollouts_per_prompt
    return groups if groups >= 1 else None


def with_admission(settings: Settings, headroom: FdHeadroom) -> Settings:
    """`settings` with the admission limit `check_fd_headroom` fitted to the open-file limit."""
    if headroom.max_active_cohorts is None:
        return settings
    server = settings.server.model_copy(update={"max_active_cohorts": headroom.max_active_cohorts})
    return settings.model_copy(update={"server": server})
