"""Soak: steady `/verify` groups against real `sim-judge` and `serve` processes for a long time.

Starts `genrm-trio sim-judge` (2% random faults by default) and `genrm-trio serve` on 127.0.0.1,
drives G groups of N rollouts at a time (closed loop) for `--minutes`, and every `--sample-s`
seconds records the server's RSS, open file descriptors (/proc/PID/fd), OS threads, CPU time,
active cohorts (/cohorts) and judge calls in flight (/metrics), and the judge's own in-flight
count (/stats). Every reply is checked: HTTP 200; a scored row has a finite reward and no failure;
a masked row is a judge_failed failsafe row (mask_sample, instance_config.mask_sample,
_ng_failure_class, reward 0.0, a reason of at most 2,000 characters). One member of every 25th
group is replayed and must come back identical. At the end the server must be quiet (no cohorts,
nothing in flight) and both processes must exit 0 on SIGTERM.

Prints a summary and whether RSS and descriptors stayed flat after the warm-up; exits 1 on any
incorrect outcome, leak or unclean exit.

    python benchmarks/soak.py [--minutes 30] [--groups-in-flight 8] [--rollouts 16]
                              [--fault-rate 0.02] [--retries 1] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import trio
import yaml

from genrm_trio.app.bench import answer_text, procfs, verify_body
from genrm_trio.app.top_frame import Series, parse_metrics
from genrm_trio.domain.scoring import percentile
from genrm_trio.testing import procs
from genrm_trio.testing.procs import Proc

PROMPT = "Explain why the sum of two even numbers is even."


# --- processes and sampling: genrm_trio.testing.procs, genrm_trio.app.bench.procfs, and
# --- the metrics parser of `genrm-trio top` ------------------------------------------------------


def _start(args: Sequence[str], log: Path, timeout: float = 60.0) -> Proc:
    try:
        return procs.start(args, log, timeout=timeout)
    except procs.StartError as exc:
        raise SystemExit(f"{args[0]} did not start: {exc}; see {log}") from None


def _gauge(series: Series, name: str) -> float:
    """A gauge's value, nan when the server does not export it (a sample to show, not hide)."""
    value = series.total(name)
    return math.nan if value is None else value


@dataclass
class Sample:
    t_s: float
    rss_mb: float | None
    fds: int | None
    threads: int | None
    cpu_s: float | None
    active_cohorts: int
    judge_inflight: float
    judge_queued: float
    judge_calls: float
    sim_in_flight: int
    groups_done: int


# --- outcomes -------------------------------------------------------------------------------------


@dataclass
class Tally:
    groups: int = 0
    rows: int = 0
    scored: int = 0
    masked: int = 0
    partially_masked_groups: int = 0
    fully_masked_groups: int = 0
    replays: int = 0
    group_latencies: list[float] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def problem(self, text: str) -> None:
        if len(self.problems) < 20:
            self.problems.append(text)
        else:
            self.problems[-1] = f"... and more (last: {text})"


def check_row(row: Any, group_id: str, index: int) -> str | None:
    """None if the row is a correct outcome for member `index` of `group_id`, else why not."""
    if not isinstance(row, dict):
        return f"not an object: {row!r:.200}"
    if row.get("_ng_group_id") != group_id or row.get("_ng_rollout_index") != index:
        return f"identity keys do not echo {group_id}/{index}"
    reward = row.get("reward")
    if row.get("mask_sample") is True:
        reason = row.get("failure_reason")
        if not (
            row.get("failure_kind") == "judge_failed"
            and row.get("_ng_failure_class") == "judge_failed"
            and isinstance(row.get("instance_config"), dict)
            and row["instance_config"].get("mask_sample") is True
            and reward == 0.0
            and isinstance(reason, str)
            and 0 < len(reason) <= 2000
            and row.get("_ng_failure_judge_error") == reason
        ):
            return f"malformed failsafe row: {json.dumps(row)[:300]}"
        return None
    if row.get("mask_sample") is not False:
        return "mask_sample missing"
    if not (isinstance(reward, float) and math.isfinite(reward)):
        return f"non-finite reward {reward!r}"
    if row.get("failure_kind") is not None or row.get("failure_reason") is not None:
        return "scored row carries a failure"
    return None


# --- the run --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Options:
    minutes: float
    groups_in_flight: int
    rollouts: int
    answer_chars: int
    fault_rate: float
    fault_kind: str
    retries: int
    latency_ms: float
    jitter_ms: float
    sample_s: float
    warmup_s: float
    seed: int
    sticky_faults: bool
    state: bool
    max_terminal: int
    workdir: Path


async def _drive(opts: Options, base: str, judge: str, pid: int) -> tuple[Tally, list[Sample]]:
    tally = Tally()
    samples: list[Sample] = []
    started = trio.current_time()
    end = started + opts.minutes * 60.0
    # One client per worker, each with at most N + 1 connections: one httpx client with hundreds
    # of connections costs quadratic CPU in its pool (docs/benchmarks.md, "Judge client") and would
    # measure the load generator, not the server.
    limits = httpx.Limits(
        max_connections=opts.rollouts + 1, max_keepalive_connections=opts.rollouts + 1
    )

    def new_client() -> httpx.AsyncClient:
        return httpx.AsyncClient(trust_env=False, timeout=300.0, limits=limits)

    async with new_client() as http:

        async def sample() -> None:
            cohorts = (await http.get(f"{base}/cohorts")).json()
            m = parse_metrics((await http.get(f"{base}/metrics")).text)
            sim = (await http.get(f"{judge}/stats")).json()
            rss = procfs.rss_mb(pid)
            samples.append(
                Sample(
                    t_s=round(trio.current_time() - started, 1),
                    rss_mb=None if rss is None else round(rss, 1),
                    fds=procfs.open_fds(pid),
                    threads=procfs.status_field(pid, "Threads"),
                    cpu_s=procfs.cpu_s(pid),
                    active_cohorts=len(cohorts),
                    judge_inflight=_gauge(m, "genrm_trio_judge_inflight"),
                    judge_queued=_gauge(m, "genrm_trio_judge_queued"),
                    judge_calls=m.value("genrm_trio_judge_calls_total"),
                    sim_in_flight=int(sim["in_flight"]),
                    groups_done=tally.groups,
                )
            )

        async def sampler() -> None:
            while True:
                await sample()
                await trio.sleep(opts.sample_s)

        async def group(http: httpx.AsyncClient, worker: int, number: int) -> None:
            group_id = f"soak-{worker}-{number}"
            members = [
                verify_body(
                    task=number,
                    rollout=i,
                    group_id=group_id,
                    attempt=0,
                    prompt=PROMPT,
                    answer=answer_text(worker * 1_000_003 + number, i, opts.answer_chars),
                )
                for i in range(opts.rollouts)
            ]
            rows: dict[int, Any] = {}
            t0 = trio.current_time()

            async def one(i: int) -> None:
                response = await http.post(f"{base}/verify", json=members[i])
                if response.status_code != 200:
                    tally.problem(
                        f"{group_id}/{i}: HTTP {response.status_code} {response.text[:200]}"
                    )
                    return
                rows[i] = response.json()

            async with trio.open_nursery() as nursery:
                for i in range(opts.rollouts):
                    nursery.start_soon(one, i)
            tally.group_latencies.append(trio.current_time() - t0)
            tally.groups += 1
            masked = 0
            for i, row in rows.items():
                tally.rows += 1
                why = check_row(row, group_id, i)
                if why is not None:
                    tally.problem(f"{group_id}/{i}: {why}")
                elif row["mask_sample"]:
                    masked += 1
                else:
                    tally.scored += 1
            tally.masked += masked
            if masked == opts.rollouts:
                tally.fully_masked_groups += 1
            elif masked:
                tally.partially_masked_groups += 1
            if number % 25 == 0 and 0 in rows:
                replay = await http.post(f"{base}/verify", json=members[0])
                tally.replays += 1
                if replay.status_code != 200 or replay.json() != rows[0]:
                    tally.problem(f"{group_id}/0: replay differs: {replay.text[:200]}")

        async def worker(w: int) -> None:
            number = 0
            async with new_client() as own:
                while trio.current_time() < end:
                    await group(own, w, number)
                    number += 1

        async with trio.open_nursery() as nursery:
            nursery.start_soon(sampler)
            async with trio.open_nursery() as workers:
                for w in range(opts.groups_in_flight):
                    workers.start_soon(worker, w)
            # Drained: the server must go quiet.
            with trio.move_on_after(10):
                while True:
                    await sample()
                    last = samples[-1]
                    if not (last.active_cohorts or last.judge_inflight or last.sim_in_flight):
                        break
                    await trio.sleep(0.2)
            nursery.cancel_scope.cancel()
    return tally, samples


def _slope_per_min(points: Sequence[tuple[float, float]]) -> float:
    if len(points) < 2:
        return 0.0
    xs = [p[0] / 60.0 for p in points]
    ys = [p[1] for p in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return 0.0 if den == 0 else sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / den


def _pct(values: Sequence[float], q: float) -> float:
    return percentile(values, q) if values else math.nan


def summarise(
    opts: Options, tally: Tally, samples: list[Sample], codes: dict[str, int]
) -> dict[str, Any]:
    warm = [s for s in samples if s.t_s >= opts.warmup_s and s.rss_mb is not None]
    rss = [(s.t_s, float(s.rss_mb)) for s in warm if s.rss_mb is not None]
    fds = [s.fds for s in warm if s.fds is not None]
    final = samples[-1] if samples else None
    rss_start = rss[0][1] if rss else math.nan
    rss_end = rss[-1][1] if rss else math.nan
    slope = _slope_per_min(rss)
    minutes_after_warmup = (rss[-1][0] - rss[0][0]) / 60.0 if len(rss) > 1 else 0.0
    # Flat: the median RSS of the last third of the post-warm-up samples is within
    # max(5 MB, 5%) of the first third's; descriptors (connections come and go) peak no higher
    # in the last third than in the first third plus 16.
    third = max(1, len(rss) // 3)
    rss_first = statistics.median(r for _, r in rss[:third]) if rss else math.nan
    rss_last = statistics.median(r for _, r in rss[-third:]) if rss else math.nan
    rss_flat = bool(rss) and rss_last - rss_first < max(5.0, 0.05 * rss_first)
    fd_third = max(1, len(fds) // 3)
    fds_flat = bool(fds) and max(fds[-fd_third:]) <= max(fds[:fd_third]) + 16
    quiet = final is not None and not (
        final.active_cohorts or final.judge_inflight or final.judge_queued or final.sim_in_flight
    )
    elapsed = final.t_s if final else 0.0
    cpu = [s.cpu_s for s in samples if s.cpu_s is not None]
    return {
        "minutes": round(elapsed / 60.0, 2),
        "groups": tally.groups,
        "rows": tally.rows,
        "scored_rows": tally.scored,
        "masked_rows": tally.masked,
        "partially_masked_groups": tally.partially_masked_groups,
        "fully_masked_groups": tally.fully_masked_groups,
        "replays_checked": tally.replays,
        "problems": tally.problems,
        "groups_per_s": round(tally.groups / elapsed, 2) if elapsed else None,
        "rows_per_s": round(tally.rows / elapsed, 1) if elapsed else None,
        "group_latency_s": {
            "p50": round(_pct(tally.group_latencies, 0.50), 3),
            "p95": round(_pct(tally.group_latencies, 0.95), 3),
            "p99": round(_pct(tally.group_latencies, 0.99), 3),
            "max": round(max(tally.group_latencies, default=math.nan), 3),
        },
        "judge_calls": final.judge_calls if final else None,
        "server_cpu_share": round((cpu[-1] - cpu[0]) / elapsed, 2) if len(cpu) > 1 else None,
        "rss_mb": {
            "after_warmup": rss_start,
            "end": rss_end,
            "max": max((r for _, r in rss), default=math.nan),
            "first_third_median": rss_first,
            "last_third_median": rss_last,
            "slope_mb_per_min": round(slope, 3),
            "minutes_measured": round(minutes_after_warmup, 2),
            "flat": rss_flat,
        },
        "fds": {
            "after_warmup": fds[0] if fds else None,
            "end": fds[-1] if fds else None,
            "max": max(fds) if fds else None,
            "flat": fds_flat,
        },
        "threads_max": max((s.threads for s in samples if s.threads is not None), default=None),
        "active_cohorts_max": max((s.active_cohorts for s in samples), default=None),
        "quiet_at_end": quiet,
        "machine_load_avg_1m_end": round(os.getloadavg()[0], 2),
        "cpus": os.cpu_count(),
        "exit_codes": codes,
        "ok": not tally.problems
        and rss_flat
        and fds_flat
        and quiet
        and all(code == 0 for code in codes.values()),
    }


def _print(summary: dict[str, Any], samples: list[Sample]) -> None:
    print("\n t(s)   RSS MB  fds thr  active inflight  judge calls  groups")
    step = max(1, len(samples) // 24)
    for s in samples[::step] + ([samples[-1]] if samples and len(samples) % step else []):
        print(
            f"{s.t_s:6.0f} {s.rss_mb or 0:8.1f} {s.fds or 0:4d} {s.threads or 0:3d} "
            f"{s.active_cohorts:7d} {s.judge_inflight:8.0f} {s.judge_calls:12.0f} "
            f"{s.groups_done:7d}"
        )
    print()
    for key, value in summary.items():
        print(f"{key:26s} {value}")
    print("\nRESULT:", "OK" if summary["ok"] else "FAILED")


def run(opts: Options) -> dict[str, Any]:
    opts.workdir.mkdir(parents=True, exist_ok=True)
    judge = _start(
        [
            "sim-judge",
            "--port",
            "0",
            "--latency-ms",
            str(opts.latency_ms),
            "--jitter-ms",
            str(opts.jitter_ms),
            "--fault-rate",
            str(opts.fault_rate),
            "--fault-kind",
            opts.fault_kind,
            "--seed",
            str(opts.seed),
            *(["--sticky-faults"] if opts.sticky_faults else []),
        ],
        opts.workdir / "sim-judge.err",
    )
    server: Proc | None = None
    try:
        config = {
            "num_rollouts_per_prompt": opts.rollouts,
            "cohort_collection_timeout_s": 120.0,
            "cohort_evaluation_timeout_s": 300.0,
            "judge_request_timeout_s": 60.0,
            "genrm_parse_retries": opts.retries,
            "genrm_parse_retry_sleep_s": 0.05,
            "cohort_result_ttl_s": 600.0,
            "max_terminal_cohorts": opts.max_terminal,
        }
        path = opts.workdir / "soak.yaml"
        path.write_text(yaml.safe_dump(config))
        server = _start(
            [
                "serve",
                "--config",
                str(path),
                "--port",
                "0",
                "--judge-url",
                judge.url + "/v1",
                "--judge-api",
                "genrm_model",
                *(["--state", str(opts.workdir / "state.sqlite")] if opts.state else []),
            ],
            opts.workdir / "serve.err",
        )
        print(
            f"soak: {opts.minutes} min, {opts.groups_in_flight} groups x {opts.rollouts} in flight"
        )
        faults = f"{opts.fault_rate:.0%} {opts.fault_kind}" + (
            ", sticky" if opts.sticky_faults else ""
        )
        print(f"      judge {judge.url} ({faults}), server {server.url}")
        print(f"      logs in {opts.workdir}")
        tally, samples = trio.run(_drive, opts, server.url, judge.url, server.popen.pid)
        codes = {"serve": server.stop(30.0), "sim-judge": judge.stop(30.0)}
    finally:
        for proc in (server, judge):
            if proc is not None:
                proc.close()
    summary = summarise(opts, tally, samples, codes)
    if "Traceback" in (opts.workdir / "serve.err").read_text(errors="replace"):
        summary["problems"].append("a Traceback in the server log")
        summary["ok"] = False
    summary["samples"] = [asdict(s) for s in samples]
    _print({k: v for k, v in summary.items() if k != "samples"}, samples)
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--groups-in-flight", type=int, default=8)
    parser.add_argument("--rollouts", type=int, default=16)
    parser.add_argument("--answer-chars", type=int, default=800)
    parser.add_argument("--fault-rate", type=float, default=0.02)
    parser.add_argument("--fault-kind", default="http_500")
    parser.add_argument("--retries", type=int, default=1, help="genrm_parse_retries (A - 1)")
    parser.add_argument("--latency-ms", type=float, default=20.0)
    parser.add_argument("--jitter-ms", type=float, default=30.0)
    parser.add_argument("--sample-s", type=float, default=5.0)
    parser.add_argument(
        "--warmup-s", type=float, default=None, help="default: 10%% of the run, 30..120 s"
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--sticky-faults",
        action="store_true",
        help="a faulted pair fails every retry (many masked rows), instead of transient faults",
    )
    parser.add_argument(
        "--state", action="store_true", help="serve with --state (durable SQLite in the workdir)"
    )
    parser.add_argument(
        "--max-terminal",
        type=int,
        default=64,
        help="max_terminal_cohorts: small, so retention reaches its steady state in the warm-up",
    )
    parser.add_argument("--workdir", type=Path, default=None, help="logs and config (temp dir)")
    parser.add_argument("--json", type=Path, default=None, help="write the summary here")
    args = parser.parse_args()
    warmup = args.warmup_s
    if warmup is None:
        warmup = min(120.0, max(30.0, 6.0 * args.minutes))
    opts = Options(
        minutes=args.minutes,
        groups_in_flight=args.groups_in_flight,
        rollouts=args.rollouts,
        answer_chars=args.answer_chars,
        fault_rate=args.fault_rate,
        fault_kind=args.fault_kind,
        retries=args.retries,
        latency_ms=args.latency_ms,
        jitter_ms=args.jitter_ms,
        sample_s=args.sample_s,
        warmup_s=warmup,
        seed=args.seed,
        sticky_faults=args.sticky_faults,
        state=args.state,
        max_terminal=args.max_terminal,
        workdir=args.workdir or Path(tempfile.mkdtemp(prefix="genrm-soak-")),
    )
    summary = run(opts)
    if args.json is not None:
        args.json.write_text(json.dumps(summary, indent=2))
    sys.exit(0 if summary["ok"] else 1)


if __name__ == "__main__":
    main()
