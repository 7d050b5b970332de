"""Judge fleet failover: how long a dead replica keeps receiving attempts, and what share of the
attempts a replica that fails fast receives.

Starts delay servers (benchmarks/judge_client.py's, one process each, on 127.0.0.1) and runs
comparisons through the real `Comparator` (shared retry budget, 0.2 s retry sleep) and a
`JudgeFleet` of `HttpJudge`s, `--in-flight` comparisons at a time:

- **death**: three healthy replicas (200 ms); after a warm-up replica 0 is SIGKILLed. Reported:
  the time from the kill to its ejection, the attempts it received after the kill, and the
  comparisons that failed (would have masked two rollouts each).
- **share**: replica 1 answers 500 at once to everything, the two others are healthy; for
  `--seconds` the attempts per replica are counted, with ejection on (the fleet) and off (a
  least-in-flight router without ejection, for contrast: a replica that fails fast always has
  the fewest calls in flight).

    python benchmarks/fleet.py [--in-flight 64] [--seconds 20] [--latency 0.2]
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent))
from judge_client import start_server

from genrm_trio.config import Settings, settings_from_mapping
from genrm_trio.judge.attempts import Comparator
from genrm_trio.judge.base import JudgeCall, JudgeError
from genrm_trio.judge.client import make_http_judge
from genrm_trio.judge.fleet import JudgeFleet
from genrm_trio.metrics import Metrics
from genrm_trio.testing.procs import terminate

CALL = JudgeCall(
    history=[{"role": "user", "content": "What is 2 + 2? " * 20}],
    response_1="four " * 100,
    response_2="4 " * 100,
    principle=None,
)


def settings(urls: list[str], in_flight: int) -> Settings:
    return settings_from_mapping(
        {
            "genrm_parse_retries": 3,
            "genrm_parse_retry_sleep_s": 0.2,
            "judge_request_timeout_s": 30.0,
            "judge": {"api": "genrm_model", "base_url": urls, "max_concurrency": in_flight},
        }
    )


def fleet(config: Settings, *, eject: bool) -> JudgeFleet:
    judge = config.judge
    return JudgeFleet(
        [(url, make_http_judge(config, base_url=url)) for url in judge.base_urls],
        eject_after_failures=judge.eject_after_failures if eject else 10**9,
        eject_backoff_s=judge.eject_backoff_s,
    )


class Load:
    """`in_flight` comparisons at a time, each one after another, until cancelled."""

    def __init__(self, comparator: Comparator) -> None:
        self.comparator = comparator
        self.done = 0
        self.failed = 0

    async def worker(self) -> None:
        while True:
            try:
                await self.comparator.compare(CALL, pair=(0, 1), judge_pass=0)
                self.done += 1
            except JudgeError:
                self.failed += 1

    async def run(self, nursery: trio.Nursery, in_flight: int) -> None:
        for _ in range(in_flight):
            nursery.start_soon(self.worker)


async def death(urls: list[str], procs: list[subprocess.Popen[bytes]], in_flight: int) -> None:
    config = settings(urls, in_flight)
    judge = fleet(config, eject=True)
    load = Load(Comparator(judge, config, Metrics()))
    async with trio.open_nursery() as nursery:
        await load.run(nursery, in_flight)
        await trio.sleep(3.0)
        before = judge.replica_stats()[0].calls
        in_flight_at_kill = judge.replica_stats()[0].in_flight
        killed = time.perf_counter()
        os.kill(procs[0].pid, signal.SIGKILL)
        while not judge.replica_stats()[0].ejected:  # noqa: ASYNC110 - polls the fleet
            await trio.sleep(0.0005)
        ejected = time.perf_counter()
        at_ejection = judge.replica_stats()[0].calls
        await trio.sleep(3.0)
        after = judge.replica_stats()[0].calls
        nursery.cancel_scope.cancel()
    await judge.aclose()
    print(
        f"death, {in_flight} comparisons in flight ({in_flight_at_kill} on the killed replica): "
        f"ejected {(ejected - killed) * 1000:.1f} ms after SIGKILL; it received "
        f"{at_ejection - before} new attempts before and "
        f"{after - at_ejection} in the 3 s after its ejection; {load.done} comparisons, "
        f"{load.failed} failed"
    )


async def share(urls: list[str], in_flight: int, seconds: float, *, eject: bool) -> None:
    config = settings(urls, in_flight)
    judge = fleet(config, eject=eject)
    load = Load(Comparator(judge, config, Metrics()))
    async with trio.open_nursery() as nursery:
        await load.run(nursery, in_flight)
        await trio.sleep(seconds)
        nursery.cancel_scope.cancel()
    stats = judge.replica_stats()
    await judge.aclose()
    total = sum(s.calls for s in stats)
    healthy = [s for i, s in enumerate(stats) if i != 1]
    ok = sum(s.calls - s.failures for s in healthy)
    label = "with ejection" if eject else "without ejection"
    shares = ", ".join(f"{s.calls} ({s.calls / total * 100:.2f}%)" for s in stats)
    print(
        f"share {label}, {in_flight} in flight, {seconds:g} s: attempts per replica {shares}; "
        f"the healthy two split their answers {healthy[0].calls / max(ok, 1) * 100:.1f}% / "
        f"{healthy[1].calls / max(ok, 1) * 100:.1f}%; {load.done} comparisons, "
        f"{load.failed} failed, ejections {stats[1].ejections}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--in-flight", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--latency", type=float, default=0.2)
    args = parser.parse_args()
    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}")
    procs: list[subprocess.Popen[bytes]] = []

    def start(status: int = 200, latency: float = args.latency) -> str:
        proc, port = start_server(latency, status)
        procs.append(proc)
        return f"http://127.0.0.1:{port}/v1"

    try:
        for level in (args.in_flight, 1):
            urls = [start(), start(), start()]
            trio.run(death, urls, procs[-3:], level)
        urls = [start(), start(500, 0.0), start()]
        for eject in (True, False):
            trio.run(partial(share, urls, args.in_flight, args.seconds, eject=eject))
    finally:
        for proc in procs:
            terminate(proc, timeout=10)


if __name__ == "__main__":
    main()
