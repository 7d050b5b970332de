#!/usr/bin/env python3
"""The stop under load (issue #25 item 3): SIGINT to `genrm-trio serve` while groups are judged.

Each trial starts a fresh `genrm-trio serve` (N = `--rollouts`, the shipped circular config)
against one `genrm-trio sim-judge` answering after `--judge-latency-ms`, sends `--groups` groups
of N `/verify` requests (every one waits: its group is being judged), waits until the judge holds
every comparison, then `--signal-after-s` later sends SIGINT and times the exit. Per trial:

- signal → exit (the server's exit seen through a pidfd), exit code;
- the server's CPU from the signal to its exit (`/proc/PID/schedstat` before, `wait4`'s rusage
  after): CPU seconds, which contention does not inflate, against wall seconds, which it does;
- the requests answered (HTTP status, 503 expected) and when, and those cut off without a reply.

`--load K` runs K busy-looping processes beside it for the whole run (a stand-in for NeMo Gym
stopping its other servers at the same moment on the same cores); `--load 0` measures a quiet
stop. Prints p50/p95/max of signal → exit and of the stop's CPU, and exits 1 if a trial lost a
request, exited non-zero, or (with `--max-p95-s`) the p95 is over the bound. Everything listens
on 127.0.0.1; every process started here is stopped by its PID.

    python benchmarks/stop_under_load.py --trials 20 --load 2 --json stop.json
    python benchmarks/stop_under_load.py --trials 3 --profile /tmp/stop-prof   # py-spy, per trial
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import IO, Any

import httpx
import trio
import yaml

from genrm_trio.app.bench import answer_text, procfs, verify_body
from genrm_trio.domain.scoring import percentile
from genrm_trio.judge.pool import KeepAlivePool
from genrm_trio.testing.procs import Proc, command, start, terminate

LOOPBACK = "127.0.0.1"


# --- processes: genrm_trio.testing.procs; CPU: genrm_trio.app.bench.procfs ---------------------


def _spawn(argv: Sequence[str], log: IO[bytes]) -> subprocess.Popen[bytes]:
    """A helper process (a busy loop, py-spy) in its own session, its stderr to `log`."""
    return subprocess.Popen(
        list(argv), stdin=subprocess.DEVNULL, stderr=log, start_new_session=True
    )


@contextmanager
def cpu_load(count: int, log: IO[bytes]) -> Iterator[None]:
    """`count` busy-looping processes beside the trial (stopped by PID afterwards)."""
    loops = [_spawn([sys.executable, "-c", "while True: pass"], log) for _ in range(count)]
    try:
        yield
    finally:
        for popen in loops:
            terminate(popen, timeout=10)


# --- one trial ----------------------------------------------------------------------------------


@dataclass
class Trial:
    exit_s: float
    exit_code: int
    stop_cpu_s: float
    answered: int
    cut_off: int
    statuses: dict[str, int]
    last_answer_s: float | None  # after the signal
    judge_in_flight: int  # when the signal was sent


async def _judge_in_flight(client: httpx.AsyncClient, judge_port: int) -> int:
    reply = await client.get(f"http://{LOOPBACK}:{judge_port}/stats")
    return int(reply.json()["in_flight"])


async def _trial(args: argparse.Namespace, judge_port: int, config: Path, logs: Path) -> Trial:
    program = shlex.split(args.serve_command) if args.serve_command else command()
    argv = ["serve", "--config", str(config), "--port", "0"]
    started = partial(start, argv, logs / "serve.log", program=program, timeout=60.0)
    server: Proc = await trio.to_thread.run_sync(started)
    spy: subprocess.Popen[bytes] | None = None
    try:
        port = server.port
        pid = server.pid
        groups = args.groups
        n = args.rollouts
        pool = KeepAlivePool(httpx.URL(f"http://{LOOPBACK}:{port}"), keepalive_expiry=math.inf)
        run = time.time_ns()
        bodies = [
            json.dumps(
                verify_body(
                    task=g,
                    rollout=r,
                    group_id=f"stop-{run}-{g}",
                    attempt=0,
                    prompt=f"Stop prompt {g}",
                    answer=answer_text(g, r, args.answer_chars),
                )
            ).encode()
            for g in range(groups)
            for r in range(n)
        ]
        statuses: Counter[str] = Counter()
        answered_at: list[float] = []
        signalled = math.inf
        all_done = trio.Event()

        async def one(body: bytes) -> None:
            headers = [
                (b"host", f"{LOOPBACK}:{port}".encode()),
                (b"content-type", b"application/json"),
                (b"content-length", b"%d" % len(body)),
            ]
            try:
                status, _, _ = await pool.exchange((b"POST", b"/verify", headers, body))
            except httpx.HTTPError as exc:
                statuses[type(exc).__name__] += 1
            else:
                statuses[f"HTTP {status}"] += 1
                answered_at.append(time.perf_counter() - signalled)
            if sum(statuses.values()) == len(bodies):
                all_done.set()

        async with httpx.AsyncClient(timeout=10) as client, trio.open_nursery() as nursery:
            for body in bodies:
                nursery.start_soon(one, body)
            # every comparison of every group is at the judge (circular: N per group)
            wanted = groups * n
            with trio.fail_after(30):
                while await _judge_in_flight(client, judge_port) < wanted:  # noqa: ASYNC110
                    await trio.sleep(0.02)  # another process's counter: polled
            if args.profile:
                # attached now, so that the profile holds the stop and not the start
                record = args.profile / f"stop-{time.time_ns()}.txt"
                spy_argv = ["py-spy", "record", "--rate", "1000", "--format", "raw", "--pid"]
                with (logs / "serve.log").open("ab") as log:
                    spy = _spawn([*spy_argv, str(pid), "-o", str(record)], log)
            await trio.sleep(args.signal_after_s)
            in_flight = await _judge_in_flight(client, judge_port)
            pidfd = os.pidfd_open(pid)
            try:
                cpu_before = procfs.task_cpu_ns(pid)
                signalled = time.perf_counter()
                os.kill(pid, signal.SIGINT)
                with trio.fail_after(args.exit_timeout_s):
                    await trio.lowlevel.wait_readable(pidfd)
                exit_s = time.perf_counter() - signalled
            finally:
                os.close(pidfd)
            # the replies (or resets) arrive with the exit at the latest
            with trio.move_on_after(5):
                await all_done.wait()
            nursery.cancel_scope.cancel()
        await pool.aclose()
        # it has exited (the pidfd said so): wait4 only reaps it and reads its CPU time
        _, status, usage = os.wait4(server.pid, 0)  # noqa: ASYNC222
        server.popen.returncode = os.waitstatus_to_exitcode(status)
        code, cpu_after = server.popen.returncode, usage.ru_utime + usage.ru_stime
        answered = sum(count for key, count in statuses.items() if key.startswith("HTTP "))
        return Trial(
            exit_s=exit_s,
            exit_code=code,
            stop_cpu_s=cpu_after - cpu_before / 1e9,
            answered=answered,
            cut_off=len(bodies) - answered,
            statuses=dict(statuses),
            last_answer_s=max(answered_at) if answered_at else None,
            judge_in_flight=in_flight,
        )
    finally:
        if spy is not None:
            terminate(spy, timeout=10)
        server.stop(timeout=10)
        server.close()


# --- the run ------------------------------------------------------------------------------------


def _config(path: Path, args: argparse.Namespace, judge_port: int) -> Path:
    config = {
        "host": LOOPBACK,
        "num_rollouts_per_prompt": args.rollouts,
        "comparison_strategy": "circular",
        "judge_request_timeout_s": 300,
        "genrm_responses_create_params": {
            "input": [],
            "max_output_tokens": 16384,
            "temperature": 0.6,
            "top_p": 0.95,
        },
        # `responses`: Gym's protocol by its earlier name, which older --serve-command read too
        "judge": {"base_url": f"http://{LOOPBACK}:{judge_port}/v1", "api": "responses"},
    }
    path.write_text(yaml.safe_dump(config))
    return path


def _summary(values: Sequence[float]) -> dict[str, float]:
    return {
        "p50": round(percentile(values, 0.5), 4),
        "p95": round(percentile(values, 0.95), 4),
        "max": round(max(values), 4),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--load", type=int, default=2, help="busy-looping processes beside it")
    parser.add_argument("--groups", type=int, default=2, help="groups being judged at the signal")
    parser.add_argument("--rollouts", type=int, default=16, help="N, rollouts per group")
    parser.add_argument("--answer-chars", type=int, default=1000)
    parser.add_argument("--judge-latency-ms", type=float, default=3000.0)
    parser.add_argument(
        "--signal-after-s", type=float, default=1.0, help="after every comparison is at the judge"
    )
    parser.add_argument("--exit-timeout-s", type=float, default=20.0)
    parser.add_argument("--max-p95-s", type=float, default=None, help="fail above this p95")
    parser.add_argument("--profile", type=Path, help="run each server under py-spy (raw output)")
    parser.add_argument(
        "--serve-command",
        help="the server's command instead of this venv's genrm-trio (e.g. another checkout's "
        "venv/bin/genrm-trio): before/after comparisons",
    )
    parser.add_argument("--logs", type=Path, help="keep the servers' logs here")
    parser.add_argument("--json", type=Path, help="write the trials and the summary here")
    args = parser.parse_args(argv)
    if args.judge_latency_ms / 1000 <= args.signal_after_s + 1:
        parser.error("--judge-latency-ms must leave the groups judging at the signal")
    if args.profile:
        args.profile.mkdir(parents=True, exist_ok=True)

    logs = args.logs or Path(tempfile.mkdtemp(prefix="stop-under-load-"))
    logs.mkdir(parents=True, exist_ok=True)
    trials: list[Trial] = []
    judge_argv = ["sim-judge", "--port", "0", "--latency-ms", f"{args.judge_latency_ms}"]
    judge = start(judge_argv, logs / "sim-judge.log")
    with (logs / "sim-judge.log").open("ab") as judge_log:
        try:
            config = _config(logs / "serve.yaml", args, judge.port)
            with cpu_load(args.load, judge_log):
                for number in range(args.trials):
                    trial = trio.run(_trial, args, judge.port, config, logs)
                    trials.append(trial)
                    print(
                        f"trial {number + 1}/{args.trials}: exit {trial.exit_s * 1000:.0f} ms "
                        f"(code {trial.exit_code}), stop CPU {trial.stop_cpu_s * 1000:.0f} ms, "
                        f"answered {trial.answered} {trial.statuses}, judge in flight "
                        f"{trial.judge_in_flight}",
                        flush=True,
                    )
        finally:
            judge.stop(timeout=10)
            judge.close()
    lost = [t for t in trials if t.cut_off or t.exit_code != 0]
    exits = [t.exit_s for t in trials]
    cpus = [t.stop_cpu_s for t in trials if not math.isnan(t.stop_cpu_s)]
    summary: dict[str, Any] = {
        "trials": len(trials),
        "load_processes": args.load,
        "cores": os.cpu_count(),
        "groups": args.groups,
        "rollouts": args.rollouts,
        "waiting_requests": args.groups * args.rollouts,
        "signal_to_exit_s": _summary(exits),
        "stop_cpu_s": _summary(cpus) if cpus else None,
        "trials_with_lost_requests_or_bad_exit": len(lost),
        "loadavg_1m_at_end": round(os.getloadavg()[0], 2),
    }
    print(json.dumps(summary, indent=2))
    if args.json:
        args.json.write_text(
            json.dumps({"summary": summary, "trials": [asdict(t) for t in trials]}, indent=2)
        )
    if args.logs is None:
        shutil.rmtree(logs, ignore_errors=True)
    failed = bool(lost)
    if args.max_p95_s is not None and summary["signal_to_exit_s"]["p95"] > args.max_p95_s:
        print(f"FAIL p95 {summary['signal_to_exit_s']['p95']}s > {args.max_p95_s}s")
        failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
