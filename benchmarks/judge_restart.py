"""A judge restart with groups in flight (issue #28 item 2; docs/benchmarks.md, "A judge restart").

Real processes on 127.0.0.1: `genrm-trio sim-judge` (one, or a fleet of `--replicas` of them)
with a realistic per-call latency behind `genrm-trio serve` (the shipped genrm_compare.yaml
values with `cohort_evaluation_timeout_s: 300`). `--groups` groups of `--size` rollouts are POSTed
to `/verify` at once; `--kill-at-s` after the first judge call reached a judge, every judge is
killed with SIGKILL (`kill -9`), left down for `--down-s` and started again on the same port.
Per scenario it reports:

- masked rollouts (from the `/verify` replies' `mask_sample`) and groups wholly masked;
- `genrm_trio_judge_unreachable_seconds_total` from the server's `/metrics` (absent before the
  outage wait: `null`);
- `/readyz`'s answers, sampled every `--readyz-every-s` (status and reason, by phase: before the
  kill, during the outage, after the restart);
- the server's log lines about the judge going and coming back (`judge unreachable: ...`,
  `judge is back after ...`), and how many WARNING lines it logged in all;
- the time from the restart (the first restarted judge's `listening on` line) to the first
  comparison a restarted judge answered (its `/stats`, polled every 50 ms).

`--server-src DIR` serves another checkout (a `git worktree add DIR COMMIT`), as
benchmarks/run_suite.py does, for the figures before the outage wait (8b8154f). The judges and
this load generator are always this checkout's. Every process is stopped by its PID; each
scenario is bounded by `--timeout-s`.

    python benchmarks/judge_restart.py                          # 1 replica, then a fleet of 2
    git worktree add /tmp/before 8b8154f && python benchmarks/judge_restart.py \\
        --server-src /tmp/before --out benchmarks/results/judge-restart-before-8b8154f.json
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

import httpx
import trio

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run_suite  # benchmarks/ is not a package
from bench_common import post_verify

from genrm_trio.app import bench
from genrm_trio.app.top_frame import parse_metrics
from genrm_trio.testing.procs import Proc

ROOT: Final = Path(__file__).resolve().parent.parent
DEFAULT_OUT: Final = ROOT / "benchmarks" / "results" / "judge-restart.json"
GONE_LINE: Final = "judge unreachable: "
BACK_LINE: Final = "judge is back after "
POLL_S: Final = 0.05


@dataclass(slots=True)
class Scenario:
    replicas: int
    groups: int
    size: int
    latency_ms: float
    jitter_ms: float
    kill_at_s: float
    down_s: float
    evaluation_timeout_s: float
    outage_probe_s: float | None
    readyz_every_s: float
    timeout_s: float


@dataclass(slots=True)
class Result:
    replicas: int
    rollouts: int
    replied: int = 0
    masked_rollouts: int = 0
    masked_groups: int = 0  # every rollout of the group masked
    partly_masked_groups: int = 0
    failure_reasons: dict[str, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)  # /verify not 200, or no reply
    calls_before_kill: int = 0  # judge calls received before the kill
    in_flight_at_kill: int = 0
    outage_s: float = 0.0  # from the kill to the first restarted judge's listening line
    unreachable_seconds_total: float | None = None
    masked_rollouts_metric: float | None = None
    readyz: dict[str, dict[str, int]] = field(default_factory=dict)  # phase -> "status" -> n
    readyz_reasons: list[str] = field(default_factory=list)  # a non-200's reasons, numbers as N
    readyz_samples: list[tuple[float, int, str]] = field(default_factory=list)  # (t - kill, ..)
    log_lines: list[str] = field(default_factory=list)  # the judge gone / back lines
    warnings: int = 0
    first_warnings: list[str] = field(default_factory=list)
    restart_to_first_call_s: float | None = None
    restart_to_first_judged_s: float | None = None
    calls_after_restart: int = 0
    last_reply_after_restart_s: float | None = None  # negative: every reply came before it
    duration_s: float = 0.0
    target_met: bool = False  # no rollout masked


def _judge_args(scenario: Scenario, index: int, port: int) -> list[str]:
    return [
        "sim-judge",
        *("--port", str(port)),
        *("--latency-ms", str(scenario.latency_ms)),
        *("--jitter-ms", str(scenario.jitter_ms)),
        *("--seed", str(index)),
    ]


def start_judge(scenario: Scenario, log_dir: Path, index: int, port: int) -> Proc:
    return run_suite.start(
        _judge_args(scenario, index, port),
        log_dir / f"judge{index}.log",
        cpu=run_suite.LOAD_CPU,
    )


def server_overrides(scenario: Scenario) -> dict[str, Any]:
    judge: dict[str, Any] = {"api": "responses"}  # Gym's protocol, read by older checkouts too
    if scenario.outage_probe_s is not None:
        judge["outage_probe_s"] = scenario.outage_probe_s
    return {
        "num_rollouts_per_prompt": scenario.size,
        "cohort_evaluation_timeout_s": scenario.evaluation_timeout_s,
        # what serve advises beside a 300 s group deadline (the shipped 1800 s warns)
        "judge_request_timeout_s": min(50.0, scenario.evaluation_timeout_s / 6),
        "judge": judge,
    }


def _phase(at: float, kill: float | None, restart: float | None) -> str:
    if kill is None or at < kill:
        return "before_kill"
    if restart is None or at < restart:
        return "outage"
    return "after_restart"


async def _stats(client: httpx.AsyncClient, judge: Proc) -> dict[str, Any] | None:
    try:
        reply = await client.get(judge.url + "/stats", timeout=2.0)
    except httpx.HTTPError:
        return None
    stats: dict[str, Any] = reply.json()
    return stats


async def drive(scenario: Scenario, judges: list[Proc], server: Proc, log_dir: Path) -> Result:
    """The groups, the kill, the restart and the samples; `judges` is updated in place."""
    result = Result(scenario.replicas, scenario.groups * scenario.size)
    ports = [judge.port for judge in judges]
    bench.raise_fd_limit(result.rollouts + 64)
    pool = bench.HttpPool(server.url, scenario.timeout_s, {})
    run_id = time.monotonic_ns()  # fresh group ids
    rows: list[list[dict[str, Any] | None]] = [
        [None] * scenario.size for _ in range(scenario.groups)
    ]
    marks: dict[str, float] = {}
    done = trio.Event()  # every rollout has its reply
    outage_over = trio.Event()  # restarted, and a restarted judge answered (or nothing left)
    start = trio.current_time()

    async def send(group: int, rollout: int) -> None:
        row = await post_verify(
            pool,
            result.errors,
            group=group,
            rollout=rollout,
            group_id=f"restart-{run_id}-{group}",
            prompt=f"Restart prompt {group}: explain the result step by step.",
            answer_chars=1000,
        )
        if row is None:
            return
        rows[group][rollout] = row
        marks["last_reply"] = trio.current_time()

    async def rollouts() -> None:
        async with trio.open_nursery() as nursery:
            for group in range(scenario.groups):
                for rollout in range(scenario.size):
                    nursery.start_soon(send, group, rollout)
        done.set()

    async def outage(client: httpx.AsyncClient) -> None:
        try:
            await kill_and_restart(client)
        finally:
            outage_over.set()

    async def kill_and_restart(client: httpx.AsyncClient) -> None:
        while True:  # groups in flight: the first judge call reached a judge
            stats = [await _stats(client, judge) for judge in judges]
            if any(s is not None and s["calls"] > 0 for s in stats):
                break
            await trio.sleep(POLL_S)
        await trio.sleep(scenario.kill_at_s)
        stats = [await _stats(client, judge) for judge in judges]
        result.calls_before_kill = sum(s["calls"] for s in stats if s is not None)
        result.in_flight_at_kill = sum(s["in_flight"] for s in stats if s is not None)
        for judge in judges:
            judge.signal(signal.SIGKILL)  # kill -9, groups in flight
        marks["kill"] = trio.current_time()
        for judge in judges:
            await trio.to_thread.run_sync(judge.close)  # reaped, its pipe closed
        await trio.sleep_until(marks["kill"] + scenario.down_s)

        async def restart(index: int, port: int) -> None:  # on the same port
            judges[index] = await trio.to_thread.run_sync(
                start_judge, scenario, log_dir, index, port
            )
            marks.setdefault("restart", trio.current_time())  # the judge is back: one replica

        async with trio.open_nursery() as nursery:
            for index, port in enumerate(ports):
                nursery.start_soon(restart, index, port)
        result.outage_s = marks["restart"] - marks["kill"]
        while True:
            last = done.is_set()  # one more look once every reply is in
            stats = [await _stats(client, judge) for judge in judges]
            calls = sum(s["calls"] for s in stats if s is not None)
            answered = sum(s["calls"] - s["in_flight"] for s in stats if s is not None)
            now = trio.current_time()
            if calls > 0 and "first_call" not in marks:
                marks["first_call"] = now
            if answered > 0 and "first_judged" not in marks:
                marks["first_judged"] = now
            if "first_judged" in marks or last:
                return
            await trio.sleep(POLL_S)

    async def readyz(client: httpx.AsyncClient) -> None:
        while not (done.is_set() and outage_over.is_set()):
            at = trio.current_time()
            try:
                reply = await client.get(server.url + "/readyz", timeout=2.0)
                status, reason = reply.status_code, str(reply.json().get("reason", ""))
            except (httpx.HTTPError, ValueError) as exc:
                status, reason = 0, type(exc).__name__
            kill = marks.get("kill")
            result.readyz_samples.append((round(at - (kill or at), 2), status, reason))
            phase = result.readyz.setdefault(_phase(at, kill, marks.get("restart")), {})
            phase[str(status)] = phase.get(str(status), 0) + 1
            shape = re.sub(r"\d+(\.\d+)?", "N", reason)  # "unreachable for 12s" -> "Ns"
            if status != 200 and shape not in result.readyz_reasons:
                result.readyz_reasons.append(shape)
            await trio.sleep(scenario.readyz_every_s)

    async with httpx.AsyncClient() as client:
        try:
            with trio.fail_after(scenario.timeout_s):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(rollouts)
                    nursery.start_soon(outage, client)
                    nursery.start_soon(readyz, client)
        finally:
            await pool.aclose()
        series = parse_metrics((await client.get(server.url + "/metrics")).text)
        for judge in judges:
            stats = await _stats(client, judge)
            result.calls_after_restart += stats["calls"] if stats is not None else 0
    result.duration_s = trio.current_time() - start
    result.unreachable_seconds_total = series.total("genrm_trio_judge_unreachable_seconds_total")
    result.masked_rollouts_metric = series.total("genrm_trio_masked_rollouts_total")
    if "restart" in marks:
        for key, name in (("first_call", "call"), ("first_judged", "judged")):
            if key in marks:
                setattr(result, f"restart_to_first_{name}_s", marks[key] - marks["restart"])
        if "last_reply" in marks:
            result.last_reply_after_restart_s = marks["last_reply"] - marks["restart"]
    reasons: Counter[str] = Counter()
    for group_rows in rows:
        masked = [row for row in group_rows if row is not None and row.get("mask_sample")]
        result.replied += sum(row is not None for row in group_rows)
        result.masked_rollouts += len(masked)
        if len(masked) == scenario.size:
            result.masked_groups += 1
        elif masked:
            result.partly_masked_groups += 1
        reasons.update(str(row.get("failure_reason"))[:160] for row in masked)
    result.failure_reasons = dict(reasons.most_common(5))
    result.target_met = result.replied == result.rollouts and result.masked_rollouts == 0
    return result


def read_log(result: Result, text: str) -> None:
    for line in text.splitlines():
        if GONE_LINE in line or BACK_LINE in line:
            result.log_lines.append(line.strip())
        if "WARNING" in line:
            result.warnings += 1
            if len(result.first_warnings) < 3:
                result.first_warnings.append(line.strip()[:300])


def run_scenario(scenario: Scenario, log_dir: Path) -> Result:
    scenario_dir = log_dir / f"replicas{scenario.replicas}"
    scenario_dir.mkdir(parents=True, exist_ok=True)
    judges: list[Proc] = []
    try:
        for index in range(scenario.replicas):
            judges.append(start_judge(scenario, scenario_dir, index, 0))
        urls = [judge.url + "/v1" for judge in judges]
        extra = [arg for url in urls[1:] for arg in ("--judge-url", url)]
        server = run_suite.start_server(
            scenario_dir, "server", urls[0], server_overrides(scenario), extra
        )
        try:
            result = trio.run(drive, scenario, judges, server, scenario_dir)
        finally:
            server.stop()
        read_log(result, server.log())
        return result
    finally:
        for judge in judges:
            judge.stop()


def _figure(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def table(results: Sequence[Result]) -> str:
    lines = [
        "replicas  masked rollouts  masked groups  unreachable s  /readyz in outage  "
        "restart->judged s  warnings"
    ]
    for r in results:
        unreachable = (
            "-" if r.unreachable_seconds_total is None else f"{r.unreachable_seconds_total:.1f}"
        )
        judged = (
            "-" if r.restart_to_first_judged_s is None else f"{r.restart_to_first_judged_s:.2f}"
        )
        lines.append(
            f"{r.replicas:>8}  {r.masked_rollouts:>7}/{r.rollouts:<7}  "
            f"{r.masked_groups + r.partly_masked_groups:>13}  {unreachable:>13}  "
            f"{json.dumps(r.readyz.get('outage', {})):>17}  {judged:>17}  {r.warnings:>8}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--replicas", type=int, nargs="+", default=[1, 2], help="one run each")
    parser.add_argument("--groups", type=int, default=12)
    parser.add_argument("--size", type=int, default=16, help="rollouts per group")
    parser.add_argument("--latency-ms", type=float, default=1000.0, help="per judge call")
    parser.add_argument("--jitter-ms", type=float, default=1000.0, help="uniform extra latency")
    parser.add_argument(
        "--kill-at-s", type=float, default=1.5, help="after the first judge call reached a judge"
    )
    parser.add_argument("--down-s", type=float, default=30.0, help="from the kill to the restart")
    parser.add_argument("--evaluation-timeout-s", type=float, default=300.0)
    parser.add_argument(
        "--outage-probe-s", type=float, help="judge.outage_probe_s (default: the server's)"
    )
    parser.add_argument("--readyz-every-s", type=float, default=1.0)
    parser.add_argument("--timeout-s", type=float, default=180.0, help="bound of one scenario")
    parser.add_argument("--server-src", type=Path, help="serve this checkout (git worktree)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    if args.server_src is not None:
        run_suite.SERVER_PYTHONPATH = str(args.server_src.resolve())
    log_dir = Path(tempfile.mkdtemp(prefix="genrm-judge-restart-"))
    results: list[Result] = []
    scenarios = []
    for replicas in args.replicas:
        scenario = Scenario(
            replicas=replicas,
            groups=args.groups,
            size=args.size,
            latency_ms=args.latency_ms,
            jitter_ms=args.jitter_ms,
            kill_at_s=args.kill_at_s,
            down_s=args.down_s,
            evaluation_timeout_s=args.evaluation_timeout_s,
            outage_probe_s=args.outage_probe_s,
            readyz_every_s=args.readyz_every_s,
            timeout_s=args.timeout_s,
        )
        scenarios.append(scenario)
        results.append(run_scenario(scenario, log_dir))
        print(f"replicas={replicas}: done in {results[-1].duration_s:.1f}s", file=sys.stderr)
    print(table(results))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    report = {
        "benchmark": "judge_restart",
        "command": ["python", "benchmarks/judge_restart.py", *(argv or sys.argv[1:])],
        "commit": run_suite._git_head(),
        "server_src": run_suite.SERVER_PYTHONPATH,
        "logs": str(log_dir),
        "scenarios": [asdict(s) for s in scenarios],
        "results": [asdict(r) for r in results],
    }
    args.out.write_text(json.dumps(report, indent=1, allow_nan=False) + "\n")
    print(f"wrote {args.out}")
    return 0 if all(r.replied == r.rollouts for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
