"""Benchmark NeMo Gym 0.7.0's reference genrm_compare server against genrm-trio's simulated judge.

Run from the repository root with the dev venv (the reference runs in /tmp/ref-venv):

    . /tmp/probe/bin/activate
    python benchmarks/reference_bench.py --suite main            # the scenarios of the issue
    python benchmarks/reference_bench.py --mode verify -G 16 --latency-ms 200
    python benchmarks/reference_bench.py --mode verify -G 16 --fault-rate 0.01 --sticky-faults

Per scenario it starts a fresh simulated judge (`taskset -c 1 genrm-trio sim-judge`, this venv)
and a fresh reference server
(`taskset -c 0 /tmp/ref-venv/bin/python benchmarks/reference/run_reference_server.py`), pins
itself (the load generator) to core 1, records the server's idle RSS, runs a short pilot (which
also warms the server up) to size the measured run to about `--target-s` seconds, runs
`genrm_trio.app.bench.run_bench` with `server_pid`, and writes the BenchReport plus scenario
metadata to benchmarks/results/reference-<scenario>.json. Every process it starts is stopped by PID.
Only 127.0.0.1 is used. The processes, the /proc readers and the CPU accounting are the package's
(`genrm_trio.testing.procs`, `genrm_trio.app.bench.procfs`), as in run_suite.py; only the
reference server is started here, since it prints no `listening on` line: it is polled on
`/health` instead.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import trio

import genrm_trio.app.bench as bench
from genrm_trio.app.bench import procfs
from genrm_trio.testing import procs

ROOT = Path(__file__).resolve().parent.parent
REF_PYTHON = os.environ.get("REF_PYTHON", "/tmp/ref-venv/bin/python")
LAUNCHER = ROOT / "benchmarks" / "reference" / "run_reference_server.py"
RESULTS = ROOT / "benchmarks" / "results"
LOG_DIR = Path("/tmp/reference-bench-logs")
SERVER_CPU = 0
LOAD_CPU = 1


# --- scenarios -----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Scenario:
    mode: str = "verify"
    concurrency: int = 16
    latency_ms: float = 0.0
    rollouts: int = 16
    answer_chars: int = 1000
    fault_rate: float = 0.0
    fault_kind: str = "http_500"
    sticky_faults: bool = False
    target_s: float = 30.0  # measured run length aimed for (pilot-sized)
    max_groups: int = 4000
    pilot_groups: int | None = None  # default: 2 * concurrency (at least 4)
    timeout_s: float = 60.0  # per request, client side
    server_args: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        parts = [self.mode, f"G{self.concurrency}", f"lat{self.latency_ms:g}ms"]
        if self.rollouts != 16:
            parts.append(f"N{self.rollouts}")
        if self.fault_rate:
            sticky = "sticky-" if self.sticky_faults else ""
            parts.append(f"{sticky}{self.fault_kind}{self.fault_rate:g}")
        return "-".join(parts)


MAIN_SUITE: tuple[Scenario, ...] = (
    Scenario(mode="verify", concurrency=1, latency_ms=0),
    Scenario(mode="verify", concurrency=16, latency_ms=0),
    Scenario(mode="verify", concurrency=64, latency_ms=0),
    Scenario(mode="verify", concurrency=1, latency_ms=200),
    Scenario(mode="verify", concurrency=16, latency_ms=200),
    Scenario(mode="verify", concurrency=64, latency_ms=200),
    Scenario(mode="compare", concurrency=16, latency_ms=0),
    Scenario(mode="verify", concurrency=16, latency_ms=0, fault_rate=0.01, sticky_faults=True),
)


# --- processes -----------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_http(url: str, proc: subprocess.Popen[bytes], deadline_s: float = 60.0) -> None:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(
                f"process {proc.pid} exited with {proc.returncode} before {url} was up"
            )
        try:
            if httpx.get(url, timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{url} not up after {deadline_s} s")


def wait_for_quiet(max_wait_s: float) -> float:
    """Wait until the rest of the box is quiet (other work shares this machine); returns the
    busy cores measured in the last window (reported with the result)."""
    return procfs.wait_for_quiet(max_wait_s, window_s=3.0)


async def _measured_bench(
    cfg: bench.BenchConfig, limit_s: float, judge_pid: int
) -> tuple[bench.BenchReport | None, dict[str, Any]]:
    """run_bench plus the CPU of the server, the load generator, the judge and everything else
    on the box (`procfs.CpuMeter`, as run_suite.py measures ours)."""
    assert cfg.server_pid is not None
    loadavg = os.getloadavg()[0]
    meter = procfs.CpuMeter(cfg.server_pid, judge_pid)
    report = await _bounded_bench(cfg, limit_s)
    if report is None or not report.groups:
        return report, {}
    return report, {**meter.stop(report.groups), "loadavg_1m_before": loadavg}


# --- one scenario --------------------------------------------------------------------------------


def run_scenario(sc: Scenario, *, log_dir: Path, quiet_wait_s: float = 0.0) -> dict[str, Any]:
    busy_before = wait_for_quiet(quiet_wait_s) if quiet_wait_s > 0 else None
    server_port = _free_port()
    log_dir.mkdir(parents=True, exist_ok=True)
    server_log = open(log_dir / f"{sc.name}.server.log", "wb")  # noqa: SIM115 (closed in finally)
    judge: procs.Proc | None = None
    server: subprocess.Popen[bytes] | None = None
    try:
        judge_args = [
            "sim-judge",
            "--port",
            "0",
            "--latency-ms",
            str(sc.latency_ms),
            "--fault-rate",
            str(sc.fault_rate),
            "--fault-kind",
            sc.fault_kind,
            *(["--sticky-faults"] if sc.sticky_faults else []),
        ]
        judge = procs.start(
            judge_args,
            log_dir / f"{sc.name}.judge.log",
            prefix=["taskset", "-c", str(LOAD_CPU)],
            cwd=ROOT,
        )
        server_cmd = [
            "taskset",
            "-c",
            str(SERVER_CPU),
            REF_PYTHON,
            str(LAUNCHER),
            "--port",
            str(server_port),
            "--judge-url",
            f"127.0.0.1:{judge.port}",
            "--num-rollouts",
            str(sc.rollouts),
            *sc.server_args,
        ]
        server = subprocess.Popen(server_cmd, stdout=server_log, stderr=subprocess.STDOUT, cwd=ROOT)
        url = f"http://127.0.0.1:{server_port}"
        stats_url = f"{judge.url}/stats"
        started = time.monotonic()
        _wait_http(url + "/health", server)
        startup_s = time.monotonic() - started
        time.sleep(1.0)
        rss_fresh = procfs.rss_mb(server.pid)

        def cfg(groups: int) -> bench.BenchConfig:
            return bench.BenchConfig(
                url=url,
                mode=sc.mode,
                groups=groups,
                concurrency=sc.concurrency,  # type: ignore[arg-type]
                rollouts=sc.rollouts,
                answer_chars=sc.answer_chars,
                timeout_s=sc.timeout_s,
                server_pid=server.pid,
                judge_stats_url=stats_url,
            )

        # Pilot: warms the server up and sizes the measured run.
        pilot_groups = sc.pilot_groups or max(2 * sc.concurrency, 4)
        pilot, _ = trio.run(_measured_bench, cfg(pilot_groups), 3 * sc.timeout_s, judge.pid)
        if pilot is None or pilot.groups == 0:
            raise RuntimeError(f"pilot made no progress: {pilot}")
        rate = pilot.groups_per_s
        groups = int(min(sc.max_groups, max(2 * sc.concurrency, math.ceil(rate * sc.target_s))))
        report, cpu = trio.run(_measured_bench, cfg(groups), max(120.0, 3 * sc.target_s), judge.pid)
        if report is None:
            raise RuntimeError("measured run exceeded its time bound")
        time.sleep(1.0)
        rss_after = procfs.rss_mb(server.pid)
        judge_stats = httpx.get(stats_url, timeout=5).json()
        result: dict[str, Any] = {
            "label": f"reference-{sc.name}",
            "server": "nemo-gym 0.7.0 genrm_compare (uvicorn, 1 worker)",
            "scenario": dataclasses.asdict(sc),
            "pinning": {"server_cpu": SERVER_CPU, "load_and_judge_cpu": LOAD_CPU},
            "server_startup_s": round(startup_s, 2),
            "server_rss_fresh_mb": rss_fresh,
            "server_rss_after_run_mb": rss_after,
            "server_cpu_utilisation": (
                round(report.server_cpu_s / report.wall_s, 3)
                if report.server_cpu_s is not None and report.wall_s
                else None
            ),
            "server_capacity_groups_per_s": (
                round(1000 / report.server_cpu_ms_per_group, 1)
                if report.server_cpu_ms_per_group
                else None
            ),
            "cpu": cpu,
            "box_busy_cores_before": busy_before,
            # more than ~0.1 core of other work during the run makes throughput unreliable
            "contaminated": bool(cpu) and bool(cpu["contaminated"]),
            "judge_stats": judge_stats,
            "pilot": json.loads(pilot.as_json()),
            "report": json.loads(report.as_json()),
        }
        return result
    finally:
        if server is not None:
            procs.terminate(server, timeout=10)
        if judge is not None:
            judge.stop(timeout=10)
            judge.close()
        server_log.close()


async def _bounded_bench(cfg: bench.BenchConfig, limit_s: float) -> bench.BenchReport | None:
    with trio.move_on_after(limit_s):
        return await bench.run_bench(cfg)
    return None


# --- judge that drops every connection before answering ------------------------------------------


def run_drop_probe(wait_s: float, server_args: tuple[str, ...], mode: str) -> dict[str, Any]:
    """One group against a "judge" that accepts and immediately closes every connection.

    aiohttp sees ServerDisconnectedError before any header, which Gym's client retries forever
    every 0.5 s, so only judge_request_timeout_s (1800 s shipped) bounds the group. We wait
    `wait_s` seconds (client timeout) and count the connection attempts the server made.
    """
    judge_port, server_port = _free_port(), _free_port()
    server = None
    log = open(LOG_DIR / f"drop-probe-{mode}.server.log", "wb")  # noqa: SIM115 (closed in finally)
    try:
        server = subprocess.Popen(
            [
                "taskset",
                "-c",
                str(SERVER_CPU),
                REF_PYTHON,
                str(LAUNCHER),
                "--port",
                str(server_port),
                "--judge-url",
                f"127.0.0.1:{judge_port}",
                *server_args,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
        )
        connections = 0

        async def closer(stream: trio.SocketStream) -> None:
            nonlocal connections
            connections += 1
            await stream.aclose()

        async def probe() -> bench.BenchReport:
            async with trio.open_nursery() as nursery:
                await nursery.start(
                    functools.partial(trio.serve_tcp, closer, judge_port, host="127.0.0.1")
                )
                await trio.to_thread.run_sync(
                    _wait_http, f"http://127.0.0.1:{server_port}/health", server
                )
                report = await bench.run_bench(
                    bench.BenchConfig(
                        url=f"http://127.0.0.1:{server_port}",
                        mode=mode,
                        groups=1,  # type: ignore[arg-type]
                        concurrency=1,
                        timeout_s=wait_s,
                        server_pid=server.pid,
                    )
                )
                nursery.cancel_scope.cancel()
                return report

        report = trio.run(probe)
        return {
            "label": f"reference-drop-probe-{mode}",
            "server_args": list(server_args),
            "client_wait_s": wait_s,
            "judge_connections_seen": connections,
            "report": json.loads(report.as_json()),
        }
    finally:
        if server is not None:
            procs.terminate(server, timeout=10)
        log.close()


def _foreign_share(result: dict[str, Any]) -> float:
    """Cores of unrelated work during the measured run (lower is a cleaner measurement)."""
    foreign = result.get("cpu", {}).get("foreign_cpu_s")
    wall = result.get("report", {}).get("wall_s")
    return math.inf if foreign is None or not wall else foreign / wall


def _summary(result: dict[str, Any]) -> str:
    r = result["report"]
    return (
        f"{result['label']:<45} groups={r['groups']:>5} {r['groups_per_s']:>7.2f} g/s "
        f"p50={r['group_p50_ms']} p99={r['group_p99_ms']} ms "
        f"cpu/group={r['server_cpu_ms_per_group']} ms util={result['server_cpu_utilisation']} "
        f"rss fresh/peak={result['server_rss_fresh_mb']:.0f}/{r['server_rss_peak_mb']} MB "
        f"masked={r['masked_fraction']} failed={r['failed_groups']} "
        f"load/judge cpu/group={result['cpu'].get('load_cpu_ms_per_group')}/"
        f"{result['cpu'].get('judge_cpu_ms_per_group')} ms "
        f"load-core util={result['cpu'].get('load_core_utilisation')} "
        f"foreign cpu={result['cpu'].get('foreign_cpu_s')} s contaminated={result['contaminated']} "
        f"calls/group={r['judge_calls_per_group']} errors={r['errors']}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--suite", choices=["main"], default=None)
    parser.add_argument("--mode", choices=["verify", "compare"], default="verify")
    parser.add_argument("-G", "--concurrency", type=int, default=16)
    parser.add_argument("--latency-ms", type=float, default=0.0)
    parser.add_argument("-N", "--rollouts", type=int, default=16)
    parser.add_argument("--answer-chars", type=int, default=1000)
    parser.add_argument("--fault-rate", type=float, default=0.0)
    parser.add_argument("--fault-kind", default="http_500")
    parser.add_argument("--sticky-faults", action="store_true")
    parser.add_argument("--target-s", type=float, default=30.0)
    parser.add_argument("--max-groups", type=int, default=4000, help="cap on measured groups")
    parser.add_argument("--pilot-groups", type=int, default=None, help="default 2*G")
    parser.add_argument("--timeout-s", type=float, default=60.0, help="client per-request timeout")
    parser.add_argument("--server-arg", action="append", default=[], help="passed to the launcher")
    parser.add_argument("--out-dir", type=Path, default=RESULTS)
    parser.add_argument(
        "--keep-cleanest",
        action="store_true",
        help="keep an existing result that saw less foreign CPU (repeat runs on a busy box)",
    )
    parser.add_argument(
        "--quiet-wait-s",
        type=float,
        default=120.0,
        help="before each scenario wait up to this long for other work on the box to stop",
    )
    parser.add_argument(
        "--drop-probe",
        type=float,
        default=None,
        metavar="SECONDS",
        help="instead: one group against a judge that closes every connection; wait this long",
    )
    args = parser.parse_args(argv)

    if len(os.sched_getaffinity(0)) >= 2:
        os.sched_setaffinity(0, {LOAD_CPU})  # children (the judge) inherit it too
    if args.suite == "main":
        scenarios = [dataclasses.replace(s, target_s=args.target_s) for s in MAIN_SUITE]
    else:
        scenarios = [
            Scenario(
                mode=args.mode,
                concurrency=args.concurrency,
                latency_ms=args.latency_ms,
                rollouts=args.rollouts,
                answer_chars=args.answer_chars,
                fault_rate=args.fault_rate,
                fault_kind=args.fault_kind,
                sticky_faults=args.sticky_faults,
                target_s=args.target_s,
                max_groups=args.max_groups,
                pilot_groups=args.pilot_groups,
                timeout_s=args.timeout_s,
                server_args=tuple(args.server_arg),
            )
        ]
    args.out_dir.mkdir(parents=True, exist_ok=True)
    LOG_DIR.mkdir(exist_ok=True)
    if args.drop_probe is not None:
        result = run_drop_probe(args.drop_probe, tuple(args.server_arg), args.mode)
        suffix = "-".join(a.strip("-").replace("=", "") for a in args.server_arg)
        path = args.out_dir / f"{result['label']}{'-' + suffix if suffix else ''}.json"
        path.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
        r = result["report"]
        print(
            f"{result['label']}: waited {args.drop_probe} s, "
            f"groups answered={max(0, r['groups'] - r['failed_groups'])}, "
            f"p50={r['group_p50_ms']} ms, errors={r['errors']}, "
            f"judge connections={result['judge_connections_seen']}"
        )
        return 0
    status = 0
    for sc in scenarios:
        try:
            result = run_scenario(sc, log_dir=LOG_DIR, quiet_wait_s=args.quiet_wait_s)
        except Exception as exc:  # keep going with the other scenarios
            print(f"reference-{sc.name}: FAILED: {exc!r}", flush=True)
            status = 1
            continue
        path = args.out_dir / f"{result['label']}.json"
        print(_summary(result), flush=True)
        if args.keep_cleanest and path.exists():
            previous = json.loads(path.read_text())
            if _foreign_share(previous) <= _foreign_share(result):
                print(f"  kept {path.name}: it saw less foreign CPU", flush=True)
                continue
        path.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    return status


if __name__ == "__main__":
    sys.exit(main())
