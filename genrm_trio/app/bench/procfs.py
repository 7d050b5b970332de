"""The one /proc reader of bench and the benchmarks: a process's CPU time, memory, descriptors,
threads and identity, and how busy the whole box is (Linux; each reader returns None, or 0 where
a count is wanted, for a process that is gone or a system without /proc).

`wait_for_quiet` holds a measurement back until the rest of the box is quiet, and `CpuMeter`
splits one interval's CPU between a server, its judge, the load generator and everything else:
the benchmarks share their machine with other work, and their figures are only comparable from
quiet runs.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import NamedTuple

__all__ = [
    "CpuMeter",
    "ProcStat",
    "cmdline",
    "cpu_s",
    "cpu_ticks",
    "open_fds",
    "pids",
    "rss_mb",
    "runqueue_wait_s",
    "stat",
    "status_field",
    "system_busy_s",
    "task_cpu_ns",
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


def _schedstat(pid: int) -> tuple[int, int]:
    """(ns run on a CPU, ns runnable but waiting for one), summed over a PID's threads
    (/proc/PID/task/*/schedstat); (0, 0) once it is gone."""
    run = wait = 0
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0, 0
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat") as f:
                fields = f.read().split()
        except OSError:
            continue  # a thread that ended meanwhile
        run, wait = run + int(fields[0]), wait + int(fields[1])
    return run, wait


def task_cpu_ns(pid: int) -> int:
    """Nanoseconds of CPU all of a PID's threads have run: finer than `cpu_s`'s clock ticks,
    for intervals of a few milliseconds (0 once it is gone)."""
    return _schedstat(pid)[0]


def runqueue_wait_s(pid: int) -> float:
    """Seconds a PID's threads spent runnable but waiting for a CPU: other processes held the
    cores (0.0 once it is gone)."""
    return _schedstat(pid)[1] / 1e9


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


class CpuMeter:
    """CPU of a server, its judge, this process (the load generator) and everything else on
    the box over one interval: started at construction, read by `stop`."""

    def __init__(self, server_pid: int, judge_pid: int | None) -> None:
        self._server, self._judge = server_pid, judge_pid
        self._t0 = self._read()

    def _read(self) -> tuple[float, float, float, float, float]:
        server = cpu_s(self._server) or 0.0
        judge = (cpu_s(self._judge) or 0.0) if self._judge else 0.0
        return time.monotonic(), server, judge, time.process_time(), system_busy_s()

    def stop(self, groups: int) -> dict[str, float | bool | None]:
        """Per-group CPU of each side, core utilisation, and the foreign CPU the interval saw
        (`contaminated` above 0.1 core: a figure not to compare)."""
        t1 = self._read()
        wall, server, judge, load, busy = (b - a for a, b in zip(self._t0, t1, strict=True))
        foreign = max(0.0, busy - server - judge - load)
        per = 1000 / groups if groups else 0.0
        return {
            "foreign_cores": round(foreign / wall, 3) if wall else 0.0,
            "server_cpu_ms_per_group": round(server * per, 2),
            "judge_cpu_ms_per_group": round(judge * per, 2),
            "load_cpu_ms_per_group": round(load * per, 2),
            "server_core_utilisation": round(server / wall, 3) if wall else None,
            "load_core_utilisation": round((judge + load) / wall, 3) if wall else None,
            "foreign_cpu_s": round(foreign, 2),
            "contaminated": foreign > 0.1 * wall,
        }
