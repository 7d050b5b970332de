"""The one /proc reader of bench and the benchmarks: a process's CPU time, memory, descriptors,
threads and identity, and how busy the whole box is (Linux; each reader returns None, or 0 where
a count is wanted, for a process that is gone or a system without /proc).

`wait_for_quiet` holds a measurement back until the rest of the box is quiet: the benchmarks
share their machine with other work, and their figures are only comparable from quiet runs.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import NamedTuple

__all__ = [
    "ProcStat",
    "cmdline",
    "cpu_s",
    "cpu_ticks",
    "open_fds",
    "pids",
    "rss_mb",
    "stat",
    "status_field",
    "system_busy_s",
    "wait_for_quiet",
]


class ProcStat(NamedTuple):
    """The fields of /proc/PID/stat that the benchmarks read."""

    state: str  # R, S, D, Z, X, ...
    ppid: int
    session: int
    start_ticks: int  # start time after boot, in clock ticks (with the PID: the process's identity)
    cpu_ticks: int  # utime + stime


def stat(pid: int) -> ProcStat | None:
    """/proc/PID/stat, read after the command name (which may hold spaces and parentheses)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            raw = f.read()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2 :].split()
    return ProcStat(
        fields[0],
        int(fields[1]),
        int(fields[3]),
        int(fields[19]),
        int(fields[11]) + int(fields[12]),
    )


def cpu_ticks(pid: int) -> int:
    """utime + stime of a PID in clock ticks (0 once it is gone)."""
    found = stat(pid)
    return 0 if found is None else found.cpu_ticks


def cpu_s(pid: int) -> float | None:
    """CPU seconds (user + system) a PID has used, or None once it is gone."""
    found = stat(pid)
    return None if found is None else found.cpu_ticks / os.sysconf("SC_CLK_TCK")


def status_field(pid: int, name: str) -> int | None:
    """An integer field of /proc/PID/status (`VmRSS` in KiB, `Threads`, ...)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(name + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def rss_mb(pid: int) -> float | None:
    """Resident memory of a PID in MiB."""
    kib = status_field(pid, "VmRSS")
    return None if kib is None else kib / 1024


def open_fds(pid: int) -> int | None:
    """How many file descriptors a PID holds open."""
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


def pids() -> list[int]:
    """Every PID on the box."""
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def cmdline(pid: int) -> bytes | None:
    """A PID's command line (NUL-separated), or None once it is gone."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return None


def system_busy_s() -> float:
    """CPU seconds all cores spent busy since boot (/proc/stat: total minus idle and iowait)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:9]]
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def wait_for_quiet(
    max_wait_s: float,
    busy_cores: float = 0.15,
    window_s: float = 2.0,
    *,
    also_busy: Callable[[], bool] = lambda: False,
) -> float:
    """Wait (at most `max_wait_s`) until the box uses less than `busy_cores` over a `window_s`
    window and `also_busy()` is false; returns the busy cores of the last window (reported
    with the result)."""
    end = time.monotonic() + max_wait_s
    while True:
        busy0, t0 = system_busy_s(), time.monotonic()
        time.sleep(window_s)
        busy = (system_busy_s() - busy0) / (time.monotonic() - t0)
        if (busy < busy_cores and not also_busy()) or time.monotonic() >= end:
            return round(busy, 3)
