"""Benchmark suite for our server: scenarios (a)-(f) of the performance issue, as real processes.

Run from the repository root in the dev venv:

    python benchmarks/run_suite.py                      # every scenario, JSON to benchmarks/results
    python benchmarks/run_suite.py --only a --target-s 10
    python benchmarks/run_suite.py --only a:verify-G16-lat0ms --profile /tmp/prof

Set-up (the reference harness, benchmarks/reference_bench.py, uses the same one): the server
(`genrm-trio serve`, the shipped genrm_compare.yaml values, N = 16) is pinned to core 0 with
`taskset -c 0`; the simulated judge (`genrm-trio sim-judge`) and this process, the load generator
(`genrm_trio.app.bench.run_bench`), share core 1. Every scenario starts a fresh judge and a fresh
server on 127.0.0.1 and stops both by PID; each is bounded (a pilot sizes the measured run to
about `--target-s` seconds, a hard limit stops it after 60 s). Other work on this box shares the
cores, so before each scenario the suite waits (up to `--quiet-wait-s`) for the box to be quiet
and records the foreign CPU seen during the run (`contaminated` when it exceeds 0.1 core).

Scenarios, named like the reference harness's so the two can be paired:
  a  /verify at G = 1, 16, 64, 256 with the judge at 0 ms and at 200 ms (answers of 1,000 chars)
  b  /compare at G = 16 (batches of 16), judge at 0 ms and 200 ms
  c  fail-fast: /compare with one comparison failing every attempt (HTTP 500, retry sleep 50 ms)
     while another takes 5 s; and a judge that drops every connection (mid-body, and on accept)
     for /compare and /verify. The judge for (c) runs inside this process (core 1) so that its
     call timestamps share the client's clock: "503 after exhaustion" is measured from the judge
     receiving the failing comparison's last attempt to the client receiving the 503.
  d  masked fraction with sticky per-pair judge failures at 1 % and 5 % (/verify G = 16)
  e  memory: 1,000 groups with 15 of 16 members held in collection, answers of 16 KB
  f  /verify G = 16 and G = 64 with `serve --state PATH` (SQLite, synchronous=FULL)
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import importlib.util
import json
import math
import os
import platform
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

import httpx
import trio
import yaml

from genrm_trio.app import bench
from genrm_trio.app.bench import procfs
from genrm_trio.config import Settings
from genrm_trio.domain.scoring import percentile
from genrm_trio.testing import FaultRule, SimConfig, procs, serve_sim_judge
from genrm_trio.testing.asgi import SimJudgeApp
from genrm_trio.testing.procs import Proc

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
SERVER_CPU = 0
LOAD_CPU = 1
HARD_LIMIT_S = 60.0  # no measured run lasts longer
CLEAN_CORES = 0.05  # a run that saw less foreign CPU than this (in cores) is clean
START_TIMEOUT_S = 30.0


def _shipped() -> dict[str, Any]:
    """The shipped genrm_compare.yaml values, from the reference launcher (one copy for both
    servers), kept to the keys our flat config has. The judge comes from `--judge-url`, so the
    Gym server entry `genrm_model_server` is left out."""
    path = ROOT / "benchmarks" / "reference" / "run_reference_server.py"
    spec = importlib.util.spec_from_file_location("run_reference_server", path)
    assert spec is not None and spec.loader is not None
    launcher = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(launcher)
    keys = set(Settings.model_fields) - {"genrm_model_server"}
    return {key: value for key, value in launcher.SHIPPED.items() if key in keys}


SHIPPED: dict[str, Any] = _shipped()


# --- processes -----------------------------------------------------------------------------------


def _cli_module(source: Path) -> str:
    """The command line's module in a checkout: the installed `genrm-trio` script names today's,
    which an older checkout (before the layer folders) does not have."""
    return "genrm_trio.app.cli" if (source / "genrm_trio/app/cli.py").exists() else "genrm_trio.cli"


SERVER_PYTHONPATH: str | None = None  # --server-src: serve another checkout (before/after runs)


def start(
    args: Sequence[str],
    log_path: Path,
    *,
    cpu: int,
    pythonpath: str | None = None,
    program: Sequence[str] | None = None,
) -> Proc:
    """`taskset -c CPU genrm-trio ARGS` (or `PROGRAM ARGS`), once it printed its listening line."""
    env = {"PYTHONPATH": pythonpath} if pythonpath else None
    return procs.start(
        args,
        log_path,
        program=program,
        prefix=["taskset", "-c", str(cpu)],
        env=env,
        cwd=ROOT,
        timeout=START_TIMEOUT_S,
    )


def start_judge(log_dir: Path, name: str, flags: Sequence[str]) -> Proc:
    return start(["sim-judge", "--port", "0", *flags], log_dir / f"{name}.judge.log", cpu=LOAD_CPU)


def start_server(
    log_dir: Path,
    name: str,
    judge_url: str,
    overrides: dict[str, Any] | None = None,
    extra: Sequence[str] = (),
) -> Proc:
    config = {**SHIPPED, **(overrides or {})}
    judge = dict(config.get("judge") or {})
    # `--judge-url` needs judge.api: Gym's protocol under its earlier name, which older
    # checkouts (SERVER_PYTHONPATH) read too; the simulated judge serves every judge API
    judge.setdefault("api", "responses")
    config["judge"] = judge
    path = log_dir / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    args = ["serve", "--config", str(path), "--port", "0", "--judge-url", judge_url, *extra]
    program = None
    if SERVER_PYTHONPATH is not None:
        # -P: not the working directory (this checkout) first on sys.path, but PYTHONPATH's
        program = [sys.executable, "-P", "-m", _cli_module(Path(SERVER_PYTHONPATH))]
    return start(
        args,
        log_dir / f"{name}.server.log",
        cpu=SERVER_CPU,
        pythonpath=SERVER_PYTHONPATH,
        program=program,
    )


# --- CPU and memory accounting -------------------------------------------------------------------


def _reference_running() -> bool:
    """Whether the reference harness is measuring right now (its server process exists)."""
    return any(b"run_reference_server.py" in (procfs.cmdline(pid) or b"") for pid in procfs.pids())


def wait_for_quiet(max_wait_s: float) -> float:
    """Wait until other work on the box is quiet and the reference harness is not measuring."""
    return procfs.wait_for_quiet(max_wait_s, window_s=2.0, also_busy=_reference_running)


# --- helpers -------------------------------------------------------------------------------------


def _versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for name in ("genrm-trio", "trio", "httpx", "httpcore", "hypercorn", "quart", "quart-trio"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            out[name] = metadata.version(name)
    return out


def _git_head() -> str | None:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
    except OSError:
        return None


def _setup() -> dict[str, Any]:
    return {
        "server_cpu": SERVER_CPU,
        "load_and_judge_cpu": LOAD_CPU,
        "cores": os.cpu_count(),
        "versions": _versions(),
        "commit": _git_head(),
        "server_src": SERVER_PYTHONPATH,
        "config": "shipped genrm_compare.yaml values (N=16, circular, 1 judge, A=4, sleep 0.2 s)",
    }


async def _bounded(cfg: bench.BenchConfig, limit_s: float) -> bench.BenchReport | None:
    with trio.move_on_after(limit_s):
        return await bench.run_bench(cfg)
    return None


def _report(report: bench.BenchReport | None) -> dict[str, Any] | None:
    return None if report is None else json.loads(report.as_json())


# --- (a), (b), (d), (f): load through `genrm_trio.app.bench` -------------------------------------


@dataclasses.dataclass(frozen=True)
class LoadScenario:
    mode: str = "verify"
    concurrency: int = 16
    latency_ms: float = 0.0
    rollouts: int = 16
    answer_chars: int = 1000
    fault_rate: float = 0.0
    fault_kind: str = "http_500"
    sticky_faults: bool = False
    state: bool = False
    min_groups: int = 0  # at least this many measured groups (masked-fraction statistics)
    max_groups: int = 4000

    @property
    def name(self) -> str:
        parts = [self.mode, f"G{self.concurrency}", f"lat{self.latency_ms:g}ms"]
        if self.rollouts != 16:
            parts.append(f"N{self.rollouts}")
        if self.fault_rate:
            sticky = "sticky-" if self.sticky_faults else ""
            parts.append(f"{sticky}{self.fault_kind}{self.fault_rate:g}")
        if self.state:
            parts.append("state")
        return "-".join(parts)


def run_load(
    sc: LoadScenario,
    *,
    log_dir: Path,
    target_s: float,
    quiet_wait_s: float,
    profile: Path | None,
    repeats: int = 3,
) -> dict[str, Any]:
    busy_before = wait_for_quiet(quiet_wait_s) if quiet_wait_s > 0 else None
    flags = ["--latency-ms", str(sc.latency_ms)]
    if sc.fault_rate:
        flags += ["--fault-rate", str(sc.fault_rate), "--fault-kind", sc.fault_kind]
        if sc.sticky_faults:
            flags.append("--sticky-faults")
    judge = start_judge(log_dir, sc.name, flags)
    server: Proc | None = None
    spy: subprocess.Popen[bytes] | None = None
    state_dir = tempfile.mkdtemp(prefix="genrm-suite-") if sc.state else None
    try:
        extra = ["--state", os.path.join(state_dir, "state.sqlite")] if state_dir else []
        server = start_server(log_dir, sc.name, judge.url + "/v1", extra=extra)
        time.sleep(1.0)
        rss_fresh = procfs.rss_mb(server.pid)

        def cfg(groups: int) -> bench.BenchConfig:
            return bench.BenchConfig(
                url=server.url if server else "",
                mode=sc.mode,  # type: ignore[arg-type]
                groups=groups,
                concurrency=sc.concurrency,
                rollouts=sc.rollouts,
                answer_chars=sc.answer_chars,
                timeout_s=60.0,
                server_pid=server.pid if server else None,
                judge_stats_url=judge.url + "/stats",
            )

        # Pilot: warms the server up and sizes the measured run.
        pilot_groups = max(min(2 * sc.concurrency, 64), sc.concurrency, 4)
        pilot = trio.run(_bounded, cfg(pilot_groups), HARD_LIMIT_S)
        if pilot is None or pilot.groups == 0:
            raise RuntimeError(f"pilot made no progress: {pilot}")
        groups = math.ceil(pilot.groups_per_s * target_s)
        groups = int(min(sc.max_groups, max(2 * sc.concurrency, sc.min_groups, groups)))
        if profile is not None:
            profile.mkdir(parents=True, exist_ok=True)
            spy = subprocess.Popen(
                ["taskset", "-c", str(LOAD_CPU), "py-spy", "record", "--nonblocking", "-r", "100",
                 "-f", "raw", "-o", str(profile / f"{sc.name}.txt"), "-p", str(server.pid)],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
        # Up to `repeats` measured runs; the one that saw the least foreign CPU is kept (other
        # work on the box only ever makes a run slower), and a clean run ends the series.
        runs: list[tuple[bench.BenchReport | None, dict[str, Any]]] = []
        for _ in range(max(1, repeats)):
            meter = procfs.CpuMeter(server.pid, judge.pid)
            measured = trio.run(_bounded, cfg(groups), HARD_LIMIT_S)
            runs.append((measured, meter.stop(measured.groups if measured else 0)))
            if measured is None or runs[-1][1]["foreign_cores"] < CLEAN_CORES:
                break
        report, cpu = min(runs, key=lambda run: run[1]["foreign_cores"])
        if spy is not None:
            spy.send_signal(signal.SIGINT)
            spy.wait(timeout=30)
        time.sleep(1.0)
        return {
            "label": f"ours-{sc.name}",
            "server": "genrm-trio serve (hypercorn trio worker, 1 process)",
            "scenario": dataclasses.asdict(sc),
            "setup": _setup(),
            "server_rss_fresh_mb": rss_fresh,
            "server_rss_after_run_mb": procfs.rss_mb(server.pid),
            "cpu": cpu,
            "box_busy_cores_before": busy_before,
            "contaminated": cpu["contaminated"],
            "judge_stats": httpx.get(judge.url + "/stats", timeout=5).json(),
            "pilot": _report(pilot),
            "runs": [
                {
                    "groups_per_s": r.groups_per_s if r else None,
                    "server_cpu_ms_per_group": c["server_cpu_ms_per_group"],
                    "foreign_cores": c["foreign_cores"],
                }
                for r, c in runs
            ],
            "report": _report(report),
            "complete": report is not None,
        }
    finally:
        if spy is not None and spy.poll() is None:
            spy.kill()
            spy.wait(timeout=10)
        if server is not None:
            server.stop(10.0)
            server.close()
        judge.stop(10.0)
        judge.close()
        if state_dir:
            shutil.rmtree(state_dir, ignore_errors=True)


LOAD_A = [
    LoadScenario(concurrency=g, latency_ms=lat) for lat in (0.0, 200.0) for g in (1, 16, 64, 256)
]
LOAD_B = [LoadScenario(mode="compare", concurrency=16, latency_ms=lat) for lat in (0.0, 200.0)]
LOAD_D = [
    LoadScenario(fault_rate=rate, sticky_faults=True, min_groups=400) for rate in (0.01, 0.05)
]
LOAD_F = [LoadScenario(state=True), LoadScenario(concurrency=64, state=True)]


# --- (c) fail-fast -------------------------------------------------------------------------------

FAIL_MARK = "[fail-this-pair]"
SLOW_MARK = "[slow-this-pair]"


def _compare_body(group: int, marks: dict[int, str], n: int = 16) -> bytes:
    answers = []
    for r in range(n):
        text = bench.answer_text(group, r, 1000)
        if r in marks:
            text = marks[r] + " " + text[: 1000 - len(marks[r]) - 1]
        answers.append(text)
    body = {
        "conversation_history": [{"role": "user", "content": f"Fail-fast prompt {group}."}],
        "response_objs": [bench.policy_response(text) for text in answers],
    }
    return json.dumps(body).encode()


def _verify_bodies(group: int, n: int = 16) -> list[bytes]:
    group_id = f"suite-{os.getpid()}-{group}-{time.monotonic_ns()}"
    return [
        json.dumps(
            bench.verify_body(
                task=group,
                rollout=r,
                group_id=group_id,
                attempt=0,
                prompt=f"Drop prompt {group}",
                answer=bench.answer_text(group, r, 1000),
            )
        ).encode()
        for r in range(n)
    ]


def _stats(values: Sequence[float]) -> dict[str, float | None]:
    ms = sorted(v * 1000 for v in values)
    if not ms:
        return {"n": 0, "min_ms": None, "p50_ms": None, "max_ms": None}
    return {
        "n": len(ms),
        "min_ms": round(ms[0], 2),
        "p50_ms": round(percentile(ms, 0.5), 2),
        "max_ms": round(ms[-1], 2),
    }


async def _closer_judge(task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
    """A "judge" that accepts every connection and closes it at once, before any byte."""

    async def close(stream: trio.SocketStream) -> None:
        await stream.aclose()

    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    task_status.started(port)
    await trio.serve_listeners(close, listeners)


def run_failfast(*, log_dir: Path, repeats: int, quiet_wait_s: float) -> list[dict[str, Any]]:
    busy_before = wait_for_quiet(quiet_wait_s) if quiet_wait_s > 0 else None
    results: list[dict[str, Any]] = []

    # c1: one comparison fails every attempt, one takes 5 s, the other 14 answer at once.
    sleep_s, attempts = 0.05, 4
    rules = (
        FaultRule(fault="http_500", match=FAIL_MARK, position="both"),
        FaultRule(fault="slow", match=SLOW_MARK, position="both", delay_s=5.0),
    )
    app = SimJudgeApp(SimConfig(rules=rules, record_calls=True))

    async def c1() -> dict[str, Any]:
        async with trio.open_nursery() as nursery:
            port = await nursery.start(functools.partial(serve_sim_judge, app))
            server = await trio.to_thread.run_sync(
                functools.partial(
                    start_server,
                    log_dir,
                    "failfast-compare",
                    f"http://127.0.0.1:{port}/v1",
                    {"genrm_parse_retry_sleep_s": sleep_s, "genrm_parse_retries": attempts - 1},
                )
            )
            after_exhaustion, totals, statuses, slow_in_flight = [], [], [], []
            try:
                async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
                    for i in range(repeats + 1):  # the first one warms up
                        # pairs (0, 1) and (8, 9) of the circular plan carry both marks
                        body = _compare_body(
                            1000 + i, {0: FAIL_MARK, 1: FAIL_MARK, 8: SLOW_MARK, 9: SLOW_MARK}
                        )
                        first_call = len(app.sim.calls)
                        t0 = trio.current_time()
                        reply = await client.post(
                            "/compare", content=body, headers={"content-type": "application/json"}
                        )
                        t1 = trio.current_time()
                        calls = app.sim.calls[first_call:]
                        failing = [c.started_at for c in calls if c.fault == "http_500"]
                        slow = [c for c in calls if c.fault == "slow"]
                        if i == 0:
                            continue
                        statuses.append(reply.status_code)
                        totals.append(t1 - t0)
                        if len(failing) == attempts:
                            after_exhaustion.append(t1 - max(failing))
                        slow_in_flight.append(bool(slow))
                        await trio.sleep(0.2)  # let the judge see the cancelled slow call go
                    detail = reply.json().get("detail", "")
            finally:
                await trio.to_thread.run_sync(server.stop)
            nursery.cancel_scope.cancel()
        return {
            "label": "ours-failfast-compare-http500-vs-slow5s",
            "what": (
                "/compare of 16 (circular): pair (0,1) gets HTTP 500 on all A=4 attempts "
                f"(retry sleep {sleep_s}s), pair (8,9) takes 5 s, the rest answer at once; "
                "after_exhaustion = client got the 503 minus the judge receiving the last "
                "failing attempt (includes that attempt's reply and the 503's trip)"
            ),
            "statuses": sorted(set(statuses)),
            "slow_sibling_in_flight": all(slow_in_flight),
            "detail_example": detail[:300],
            "after_exhaustion": _stats(after_exhaustion),
            "total": _stats(totals),
            "judge_in_flight_after": app.sim.statistics().in_flight,
            "target": "503 within 10 ms of exhaustion",
        }

    results.append(trio.run(c1))

    # c2: a judge that drops every connection; /compare and /verify, shipped retries (A=4, 0.2 s)
    for kind in ("drop-midbody", "close-on-accept"):
        drop_app = SimJudgeApp(SimConfig(rules=(FaultRule(fault="drop"),), record_calls=False))

        async def c2(kind: str = kind, drop_app: SimJudgeApp = drop_app) -> list[dict[str, Any]]:
            out: list[dict[str, Any]] = []
            async with trio.open_nursery() as nursery:
                if kind == "drop-midbody":
                    port = await nursery.start(functools.partial(serve_sim_judge, drop_app))
                else:
                    port = await nursery.start(_closer_judge)
                server = await trio.to_thread.run_sync(
                    functools.partial(
                        start_server, log_dir, f"drop-{kind}", f"http://127.0.0.1:{port}/v1"
                    )
                )
                try:
                    async with httpx.AsyncClient(
                        base_url=server.url,
                        timeout=30,
                        limits=httpx.Limits(max_connections=32),
                    ) as client:
                        headers = {"content-type": "application/json"}
                        compare_t, compare_status = [], set()
                        for i in range(repeats):
                            body = _compare_body(2000 + i, {})
                            t0 = trio.current_time()
                            reply = await client.post("/compare", content=body, headers=headers)
                            compare_t.append(trio.current_time() - t0)
                            compare_status.add(reply.status_code)
                        verify_t, masked, verify_status = [], 0, set()
                        for i in range(repeats):
                            replies: list[httpx.Response] = []
                            t0 = trio.current_time()
                            async with trio.open_nursery() as group:
                                for b in _verify_bodies(3000 + i):

                                    async def one(
                                        b: bytes = b, replies: list[httpx.Response] = replies
                                    ) -> None:
                                        replies.append(
                                            await client.post("/verify", content=b, headers=headers)
                                        )

                                    group.start_soon(one)
                            verify_t.append(trio.current_time() - t0)
                            for r in replies:
                                verify_status.add(r.status_code)
                                masked += bool(r.status_code == 200 and r.json().get("mask_sample"))
                finally:
                    await trio.to_thread.run_sync(server.stop)
                nursery.cancel_scope.cancel()
            bound_ms = 4 * 0.2 * 1000 + 100
            out.append(
                {
                    "label": f"ours-drop-{kind}-compare",
                    "what": f"/compare of 16 against a judge that {kind.replace('-', ' ')}s",
                    "statuses": sorted(compare_status),
                    "latency": _stats(compare_t),
                    "target_ms": bound_ms,
                }
            )
            out.append(
                {
                    "label": f"ours-drop-{kind}-verify",
                    "what": f"/verify group of 16 against a judge that {kind.replace('-', ' ')}s",
                    "statuses": sorted(verify_status),
                    "masked_rows": masked,
                    "rows": 16 * repeats,
                    "latency": _stats(verify_t),
                    "target_ms": bound_ms,
                }
            )
            return out

        results.extend(trio.run(c2))
    for r in results:
        r["setup"] = {**_setup(), "judge": "in the suite's process (core 1)"}
        r["box_busy_cores_before"] = busy_before
    return results


# --- (e) memory with members held in collection --------------------------------------------------


async def _hold(
    url: str, groups: int, held: int, answer_chars: int, server_pid: int, connect_limit: int
) -> dict[str, Any]:
    """Open one connection per held request, send it, never read the reply; measure RSS."""
    host, _, port = url.removeprefix("http://").rpartition(":")
    streams: list[trio.SocketStream] = []
    limiter = trio.CapacityLimiter(connect_limit)
    rss_idle = procfs.rss_mb(server_pid)
    t0 = trio.current_time()

    async def send(group: int, rollout: int) -> None:
        body = json.dumps(
            bench.verify_body(
                task=group,
                rollout=rollout,
                group_id=f"hold-{group}",
                attempt=0,
                prompt=f"Held prompt {group}",
                answer=bench.answer_text(group, rollout, answer_chars),
            )
        ).encode()
        head = (
            f"POST /verify HTTP/1.1\r\nhost: {host}:{port}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\n\r\n"
        ).encode()
        async with limiter:
            stream = await trio.open_tcp_stream(host, int(port))
            streams.append(stream)
            await stream.send_all(head + body)

    async with trio.open_nursery() as nursery:
        for g in range(groups):
            for r in range(held):
                nursery.start_soon(send, g, r)
    sent_s = trio.current_time() - t0
    # Wait until the server holds every member (its /cohorts view), bounded.
    present = 0
    async with httpx.AsyncClient(timeout=30) as client:
        with trio.move_on_after(HARD_LIMIT_S):
            while True:
                cohorts = (await client.get(url + "/cohorts")).json()
                present = sum(c["members_present"] for c in cohorts)
                if present >= groups * held:
                    break
                await trio.sleep(0.5)
    held_s = trio.current_time() - t0
    await trio.sleep(1.0)
    rss_held = procfs.rss_mb(server_pid)
    for stream in streams:
        await stream.aclose()
    await trio.sleep(3.0)
    rss_released = procfs.rss_mb(server_pid)
    members = groups * held
    return {
        "members_held": present,
        "members_sent": members,
        "send_s": round(sent_s, 2),
        "all_held_after_s": round(held_s, 2),
        "server_rss_idle_mb": rss_idle,
        "server_rss_held_mb": rss_held,
        "server_rss_after_clients_closed_mb": rss_released,
        "kb_per_held_member": (
            round((rss_held - rss_idle) * 1024 / members, 2) if rss_held and rss_idle else None
        ),
    }


def run_memory(
    *, log_dir: Path, groups: int, answer_chars: int, quiet_wait_s: float
) -> dict[str, Any]:
    busy_before = wait_for_quiet(quiet_wait_s) if quiet_wait_s > 0 else None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = groups * 15 + 256
    if soft < need:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(need, soft)), hard))
    judge = start_judge(log_dir, "memory", [])
    server: Proc | None = None
    try:
        server = start_server(log_dir, "memory", judge.url + "/v1")
        time.sleep(1.0)
        held = trio.run(_hold, server.url, groups, 15, answer_chars, server.pid, 256)
        return {
            "label": f"ours-memory-hold{groups}x15-{answer_chars // 1024}KB",
            "what": f"{groups} groups, 15 of 16 members each held in collection, answers of "
            f"{answer_chars} chars (one connection per held request)",
            "setup": _setup(),
            "box_busy_cores_before": busy_before,
            **held,
            "judge_calls": httpx.get(judge.url + "/stats", timeout=5).json()["calls"],
        }
    finally:
        if server is not None:
            server.stop(10.0)
            server.close()
        judge.stop(10.0)
        judge.close()


# --- main ----------------------------------------------------------------------------------------


def _summary(result: dict[str, Any]) -> str:
    r = result.get("report")
    if r:
        cpu = result["cpu"]
        return (
            f"{result['label']:<44} {r['groups']:>5} groups {r['groups_per_s']:>7.2f} g/s "
            f"p50/p99 {r['group_p50_ms']}/{r['group_p99_ms']} ms "
            f"server {cpu['server_cpu_ms_per_group']} ms/group "
            f"(util {cpu['server_core_utilisation']}) load+judge util "
            f"{cpu['load_core_utilisation']} rss {result['server_rss_fresh_mb']:.0f}->"
            f"{r['server_rss_peak_mb']} MB masked {r['masked_fraction']} "
            f"calls/group {r['judge_calls_per_group']} foreign {cpu['foreign_cpu_s']} s "
            f"errors {r['errors']}"
        )
    keep = {k: v for k, v in result.items() if k not in ("setup", "what", "label", "scenario")}
    return f"{result['label']:<44} {json.dumps(keep)[:400]}"


def _write(out_dir: Path, result: dict[str, Any], suffix: str = "") -> None:
    result["label"] += suffix
    path = out_dir / f"{result['label']}.json"
    path.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    print(_summary(result), flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="LETTER[:NAME]",
        help="run only these scenarios (a..f), optionally one by name, e.g. a:verify-G16-lat0ms",
    )
    parser.add_argument("--target-s", type=float, default=12.0, help="measured run length")
    parser.add_argument("--quiet-wait-s", type=float, default=60.0)
    parser.add_argument("--repeats", type=int, default=10, help="fail-fast repetitions")
    parser.add_argument(
        "--runs", type=int, default=3, help="measured runs per load scenario (cleanest kept)"
    )
    parser.add_argument("--hold-groups", type=int, default=1000, help="(e): groups held")
    parser.add_argument("--out-dir", type=Path, default=RESULTS)
    parser.add_argument("--log-dir", type=Path, default=Path("/tmp/genrm-suite-logs"))
    parser.add_argument("--profile", type=Path, default=None, help="py-spy raw profiles here")
    parser.add_argument(
        "--server-src",
        type=Path,
        default=None,
        help="run the server from this checkout (e.g. a git worktree of an older commit)",
    )
    parser.add_argument("--label-suffix", default="", help="appended to every result label")
    parser.add_argument(
        "--server-set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="one more config key for every server (VALUE read as YAML), e.g. "
        "eager_comparisons=false",
    )
    args = parser.parse_args(argv)
    global SERVER_PYTHONPATH
    for item in args.server_set:
        key, sep, value = item.partition("=")
        if not sep or not key:
            parser.error(f"--server-set wants KEY=VALUE, got {item!r}")
        SHIPPED[key] = yaml.safe_load(value)
    if args.server_src is not None:
        SERVER_PYTHONPATH = str(args.server_src.resolve())

    if len(os.sched_getaffinity(0)) >= 2:
        os.sched_setaffinity(0, {LOAD_CPU})
    args.out_dir.mkdir(parents=True, exist_ok=True)
    args.log_dir.mkdir(parents=True, exist_ok=True)
    wanted: dict[str, set[str]] = {}
    for item in args.only or ["a", "b", "c", "d", "e", "f"]:
        letter, _, name = item.partition(":")
        wanted.setdefault(letter, set())
        if name:
            wanted[letter].add(name)

    def chosen(letter: str, name: str) -> bool:
        return letter in wanted and (not wanted[letter] or name in wanted[letter])

    status = 0
    jobs: list[tuple[str, str, Callable[[], Any]]] = []
    for letter, scenarios in (("a", LOAD_A), ("b", LOAD_B), ("d", LOAD_D), ("f", LOAD_F)):
        for sc in scenarios:
            jobs.append(
                (
                    letter,
                    sc.name,
                    functools.partial(
                        run_load,
                        sc,
                        log_dir=args.log_dir,
                        target_s=args.target_s,
                        quiet_wait_s=args.quiet_wait_s,
                        profile=args.profile,
                        repeats=args.runs,
                    ),
                )
            )
    jobs.append(
        (
            "c",
            "failfast",
            functools.partial(
                run_failfast,
                log_dir=args.log_dir,
                repeats=args.repeats,
                quiet_wait_s=args.quiet_wait_s,
            ),
        )
    )
    jobs.append(
        (
            "e",
            "memory",
            functools.partial(
                run_memory,
                log_dir=args.log_dir,
                groups=args.hold_groups,
                answer_chars=16 * 1024,
                quiet_wait_s=args.quiet_wait_s,
            ),
        )
    )
    order = "abcdef"
    jobs.sort(key=lambda job: order.index(job[0]))
    for letter, name, job in jobs:
        if not chosen(letter, name):
            continue
        try:
            outcome = job()
        except Exception as exc:  # keep going with the other scenarios
            print(f"({letter}) {name}: FAILED: {exc!r}", flush=True)
            status = 1
            continue
        for result in outcome if isinstance(outcome, list) else [outcome]:
            _write(args.out_dir, result, args.label_suffix)
    return status


if __name__ == "__main__":
    sys.exit(main())
