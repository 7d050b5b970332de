"""One RL step, three ways: eager comparisons off, on with a first-in first-out judge queue, and on
with the critical-path queue (issue #20; docs/benchmarks.md, "Eager comparisons").

A step is G groups of 16 rollouts whose arrival times are drawn independently from a log-normal
(median, sigma, clipped), each sent to `/verify` at its time; the simulated judge serves at most K
calls at once (`SimConfig.capacity`, the rest queue first-in first-out, like a saturated vLLM
fleet) at a fixed call latency plus a uniform jitter. Per step it reports:

- tail: the last reward minus the last arrival (what the trainer waits after generation ends);
- group latency: per group, its rewards minus its own last arrival; mean and p95 over groups;
- judge utilisation: call-seconds served / (K x the step, from t = 0 to the last reward);
- eager share: the mean of the rows' `genrm_eager_comparison_rate_per_group`.

The three modes differ only in two settings:

=================  ===================  ======================  ===============================
mode               eager_comparisons    judge.max_concurrency   where calls wait
=================  ===================  ======================  ===============================
eager-off          false                K                       genrm-trio (every group complete)
eager-fifo         true                 every call of the step  the judge's own FIFO queue
eager-priority     true                 K                       genrm-trio's critical-path queue
=================  ===================  ======================  ===============================

`eager-fifo` is what eager starts give with `judge.max_concurrency` above the judge's real
capacity: every call is sent, and the judge serves them in arrival order.

Virtual time (default): `open_engine` with the in-process `SimJudge` under
`trio.testing.MockClock`, so the numbers are exact and do not depend on the machine. Each cell
runs `--seeds` steps (seeds 0..n-1: arrivals and jitter) and reports their means.

    python benchmarks/eager_step.py [--only 24x16-K24] [--seeds 5] [--out FILE]
                                    [--strategy regular --degree 8]
    python benchmarks/eager_step.py --groups 24 --capacity 24 --latency 0.5 --median 3 \\
        --sigma 0.5 --clip 0.3 10

Real time over HTTP (`--http`): for each mode a fresh `genrm-trio sim-judge --capacity K
--latency-ms L` and a fresh `genrm-trio serve` (pinned like benchmarks/run_suite.py: server on
core 0, judge and this load generator on core 1), the rollouts POSTed to `/verify` at their
times over a keep-alive pool; the same figures from the replies' wall-clock times and the judge's
`/stats`. Every process is stopped by its PID. Timing figures: run it on a quiet machine.

    python benchmarks/eager_step.py --http --groups 24 --capacity 24 --latency 0.5 --median 3 \\
        --sigma 0.5 --clip 0.3 10 --seeds 1
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Final

import trio
import trio.testing

from genrm_trio import Scored, Settings, VerifyInput, open_engine
from genrm_trio.domain.scoring import comparison_pairs, percentile
from genrm_trio.engine.evaluation import EAGER_RATE_KEY
from genrm_trio.testing import SimConfig, SimJudge

SIZE: Final = 16
MODES: Final = ("eager-off", "eager-fifo", "eager-priority")
ROOT: Final = Path(__file__).resolve().parent.parent
DEFAULT_OUT: Final = ROOT / "benchmarks" / "results" / "eager-step.json"


@dataclass(frozen=True, slots=True)
class Cell:
    name: str
    groups: int
    capacity: int  # K: calls the judge serves at once
    latency_s: float  # per call
    median_s: float  # arrivals: log-normal median
    sigma: float
    clip: tuple[float, float]
    jitter_s: float = 0.0  # uniform extra latency per call, 0..jitter
    strategy: str = "circular"  # comparison_strategy (one judge pass)
    degree: int = 4  # comparisons_per_rollout of `regular`

    @property
    def comparisons(self) -> int:
        return self.groups * len(comparison_pairs(SIZE, self.strategy, self.degree))


CELLS: Final = (
    Cell("24x16-K24", 24, 24, 0.5, 3.0, 0.5, (0.3, 10.0)),
    Cell("128x16-K64", 128, 64, 20.0, 60.0, 0.5, (10.0, 300.0)),
    Cell("128x16-K128", 128, 128, 20.0, 60.0, 0.5, (10.0, 300.0)),
    Cell("128x16-K256", 128, 256, 20.0, 60.0, 0.5, (10.0, 300.0)),
)


@dataclass(slots=True)
class Step:
    """One step's figures (seconds; utilisation and share as fractions)."""

    tail_s: float
    group_mean_s: float
    group_p95_s: float
    utilisation: float
    eager_share: float
    last_arrival_s: float
    last_reward_s: float
    judge_calls: int


@dataclass(slots=True)
class Summary:
    cell: str
    mode: str
    seeds: int
    tail_s: float
    group_mean_s: float
    group_p95_s: float
    utilisation: float
    eager_share: float
    steps: list[Step] = field(default_factory=list)


def arrivals(cell: Cell, seed: int) -> list[list[float]]:
    """Arrival time of every rollout, [group][rollout], log-normal and clipped."""
    rng = random.Random(seed)
    lo, hi = cell.clip
    mu = math.log(cell.median_s)
    return [
        [min(hi, max(lo, rng.lognormvariate(mu, cell.sigma))) for _ in range(SIZE)]
        for _ in range(cell.groups)
    ]


def settings_for(cell: Cell, mode: str) -> dict[str, Any]:
    slots = cell.capacity if mode != "eager-fifo" else max(cell.capacity, cell.comparisons)
    return {
        "num_rollouts_per_prompt": SIZE,
        "comparison_strategy": cell.strategy,
        "comparisons_per_rollout": cell.degree,
        "num_judges_per_comparison": 1,
        "cohort_collection_timeout_s": 86400.0,  # no deadline: the step is measured whole
        "cohort_evaluation_timeout_s": 86400.0,  # (all_pairs at K = 64 needs > 3600 s)
        "judge_request_timeout_s": 1800.0,
        "eager_comparisons": mode != "eager-off",
        "judge": {"max_concurrency": slots},
    }


def answer(group: int, rollout: int) -> str:
    return f"[g{group}r{rollout}] answer {group * 16 + rollout}"


def figures(
    times: Sequence[Sequence[float]],
    rewards: Sequence[Sequence[float]],
    busy_s: float,
    capacity: int,
    shares: Sequence[float],
    calls: int,
) -> Step:
    last_arrival = max(max(group) for group in times)
    last_reward = max(max(group) for group in rewards)
    latencies = [max(r) - max(t) for t, r in zip(times, rewards, strict=True)]
    return Step(
        tail_s=last_reward - last_arrival,
        group_mean_s=sum(latencies) / len(latencies),
        group_p95_s=percentile(latencies, 0.95),
        utilisation=busy_s / (capacity * last_reward),
        eager_share=sum(shares) / len(shares) if shares else 0.0,
        last_arrival_s=last_arrival,
        last_reward_s=last_reward,
        judge_calls=calls,
    )


# --- virtual time ----------------------------------------------------------------------------


def run_virtual(cell: Cell, mode: str, seed: int) -> Step:
    times = arrivals(cell, seed)
    config = Settings.model_validate(settings_for(cell, mode))
    judge = SimJudge(
        SimConfig(
            latency_s=cell.latency_s,
            jitter_s=cell.jitter_s,
            seed=seed,
            capacity=cell.capacity,
            record_calls=False,
        )
    )
    rewards = [[math.nan] * SIZE for _ in range(cell.groups)]
    shares: list[float] = []

    async def main() -> None:
        start = trio.current_time()
        async with open_engine(config, judge) as engine:

            async def send(group: int, rollout: int, at: float) -> None:
                await trio.sleep_until(start + at)
                item = VerifyInput(
                    input=f"prompt {group}",
                    response={
                        "id": f"r{group}-{rollout}",
                        "output": [
                            {
                                "type": "message",
                                "content": [
                                    {"type": "output_text", "text": answer(group, rollout)}
                                ],
                            }
                        ],
                    },
                    group_id=f"g{group}",
                    group_attempt_given=True,
                    rollout_index=rollout,
                )
                outcome = await engine.verify(item)
                if not isinstance(outcome, Scored):
                    raise RuntimeError(f"group {group} rollout {rollout}: {outcome!r}")
                rewards[group][rollout] = trio.current_time() - start
                if rollout == 0:
                    share = outcome.result.get(EAGER_RATE_KEY, 0.0)
                    assert isinstance(share, float)
                    shares.append(share)

            async with trio.open_nursery() as nursery:
                for group, row in enumerate(times):
                    for rollout, at in enumerate(row):
                        nursery.start_soon(send, group, rollout, at)

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    stats = judge.statistics()
    if stats.calls != cell.comparisons:
        raise RuntimeError(f"{stats.calls} judge calls, expected {cell.comparisons}")
    return figures(times, rewards, stats.busy_s, cell.capacity, shares, stats.calls)


# --- real time over HTTP -----------------------------------------------------------------------


def run_http(cell: Cell, mode: str, seed: int, log_dir: Path) -> Step:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import httpx
    import run_suite

    from genrm_trio.app import bench

    times = arrivals(cell, seed)
    flags = [
        "--capacity",
        str(cell.capacity),
        "--latency-ms",
        str(cell.latency_s * 1000),
        "--jitter-ms",
        str(cell.jitter_s * 1000),
        "--seed",
        str(seed),
    ]
    name = f"eager-{cell.name}-{mode}-s{seed}"
    judge = run_suite.start_judge(log_dir, name, flags)
    try:
        overrides = settings_for(cell, mode)
        judge_url = judge.url + "/v1"
        server = run_suite.start_server(log_dir, name, judge_url, overrides)
        try:
            return trio.run(_http_step, cell, times, server.url, judge.url, bench, httpx)
        finally:
            server.stop()
    finally:
        judge.stop()


async def _http_step(
    cell: Cell, times: list[list[float]], url: str, judge_url: str, bench: Any, httpx: Any
) -> Step:
    bench.raise_fd_limit(cell.comparisons + 64)
    pool = bench.HttpPool(url, 3600.0, {})
    run_id = time.monotonic_ns()  # fresh group ids: a server's retained records never replay
    bodies = [
        [
            json.dumps(
                bench.verify_body(
                    task=group,
                    rollout=rollout,
                    group_id=f"eager-{run_id}-{group}",
                    attempt=0,
                    prompt=f"Step prompt {group}: explain the result step by step.",
                    answer=bench.answer_text(group, rollout, 1000),
                )
            ).encode()
            for rollout in range(SIZE)
        ]
        for group in range(cell.groups)
    ]
    rewards = [[math.nan] * SIZE for _ in range(cell.groups)]
    sent = [[math.nan] * SIZE for _ in range(cell.groups)]
    shares: list[float] = []
    async with httpx.AsyncClient() as client:
        before = (await client.get(judge_url + "/stats")).json()
        start = trio.current_time()

        async def send(group: int, rollout: int, at: float) -> None:
            await trio.sleep_until(start + at)
            sent[group][rollout] = trio.current_time() - start
            status, reply = await pool.post("/verify", bodies[group][rollout])
            if status != 200:
                raise RuntimeError(f"/verify {status}: {reply[:300]!r}")
            row = json.loads(reply)
            if row.get("mask_sample"):
                raise RuntimeError(f"masked: {row.get('failure_reason')}")
            rewards[group][rollout] = trio.current_time() - start
            if rollout == 0:
                shares.append(float(row.get(EAGER_RATE_KEY, 0.0)))

        try:
            async with trio.open_nursery() as nursery:
                for group, row_times in enumerate(times):
                    for rollout, at in enumerate(row_times):
                        nursery.start_soon(send, group, rollout, at)
        finally:
            await pool.aclose()
        after = (await client.get(judge_url + "/stats")).json()
    calls = int(after["calls"] - before["calls"])
    busy = float(after["busy_s"] - before["busy_s"])
    # the figures run from the actual send times (a busy load generator may send a bit late)
    return figures(sent, rewards, busy, cell.capacity, shares, calls)


# --- the sweep ---------------------------------------------------------------------------------


def summarise(cell: Cell, mode: str, steps: list[Step]) -> Summary:
    def mean(get: Callable[[Step], float]) -> float:
        return sum(get(step) for step in steps) / len(steps)

    return Summary(
        cell=cell.name,
        mode=mode,
        seeds=len(steps),
        tail_s=mean(lambda s: s.tail_s),
        group_mean_s=mean(lambda s: s.group_mean_s),
        group_p95_s=mean(lambda s: s.group_p95_s),
        utilisation=mean(lambda s: s.utilisation),
        eager_share=mean(lambda s: s.eager_share),
        steps=steps,
    )


def check_targets(results: dict[str, dict[str, Summary]]) -> list[str]:
    """The issue's targets: the priority queue never worse than eager off (tail, group p95) in
    any cell, per seed; at 24x16 K=24 tail <= 0.5x and mean group latency <= 0.7x of eager off."""
    lines: list[str] = []
    for cell, modes in results.items():
        off, priority = modes.get("eager-off"), modes.get("eager-priority")
        if off is None or priority is None:
            continue
        for figure in ("tail_s", "group_p95_s"):
            worse = [
                (seed, getattr(p, figure), getattr(o, figure))
                for seed, (p, o) in enumerate(zip(priority.steps, off.steps, strict=True))
                if getattr(p, figure) > getattr(o, figure) + 1e-9
            ]
            verdict = "met" if not worse else f"MISSED in seeds {[w[0] for w in worse]}"
            ratio = getattr(priority, figure) / getattr(off, figure)
            lines.append(f"{cell}: priority {figure} <= eager-off: {verdict} (mean {ratio:.2f}x)")
        if cell == "24x16-K24":
            tail = priority.tail_s / off.tail_s
            mean = priority.group_mean_s / off.group_mean_s
            lines.append(
                f"{cell}: tail <= 0.5x: {'met' if tail <= 0.5 else 'MISSED'} ({tail:.2f}x); "
                f"mean group latency <= 0.7x: {'met' if mean <= 0.7 else 'MISSED'} ({mean:.2f}x)"
            )
    return lines


def table(results: dict[str, dict[str, Summary]]) -> str:
    head = (
        f"{'cell':<22} {'mode':<15} {'tail s':>8} {'x off':>6} {'mean s':>8} {'x off':>6} "
        f"{'p95 s':>8} {'x off':>6} {'util':>6} {'eager':>6}"
    )
    lines = [head, "-" * len(head)]
    for cell, modes in results.items():
        off = modes.get("eager-off")
        for mode, s in modes.items():

            def ratio(value: float, base: float | None) -> str:
                return f"{value / base:6.2f}" if base else f"{'':>6}"

            lines.append(
                f"{cell:<22} {mode:<15} {s.tail_s:8.2f} {ratio(s.tail_s, off and off.tail_s)} "
                f"{s.group_mean_s:8.2f} {ratio(s.group_mean_s, off and off.group_mean_s)} "
                f"{s.group_p95_s:8.2f} {ratio(s.group_p95_s, off and off.group_p95_s)} "
                f"{s.utilisation:6.2f} {s.eager_share:6.2f}"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", action="append", default=[], help="cell name (repeatable)")
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--seeds", type=int, default=5, help="steps per cell (seeds 0..n-1)")
    parser.add_argument("--groups", type=int, help="a custom cell: G groups of 16")
    parser.add_argument("--capacity", type=int, help="custom cell: K calls served at once")
    parser.add_argument("--latency", type=float, help="custom cell: seconds per call")
    parser.add_argument("--jitter", type=float, default=0.0, help="custom cell: uniform extra s")
    parser.add_argument("--median", type=float, help="custom cell: arrival median, s")
    parser.add_argument("--sigma", type=float, help="custom cell: arrival log-normal sigma")
    parser.add_argument("--clip", type=float, nargs=2, metavar=("LO", "HI"), help="arrivals, s")
    parser.add_argument(
        "--strategy",
        choices=["circular", "regular", "all_pairs"],
        default="circular",
        help="comparison_strategy of every cell (the cell's name gets it as a suffix)",
    )
    parser.add_argument("--degree", type=int, default=4, help="comparisons_per_rollout (regular)")
    parser.add_argument("--http", action="store_true", help="real time over HTTP (quiet box)")
    parser.add_argument("--out", type=Path, default=None, help=f"JSON results ({DEFAULT_OUT})")
    args = parser.parse_args(argv)

    custom = [args.groups, args.capacity, args.latency, args.median, args.sigma, args.clip]
    if any(v is not None for v in custom):
        if any(v is None for v in custom):
            parser.error(
                "a custom cell needs --groups --capacity --latency --median --sigma --clip"
            )
        name = f"{args.groups}x16-K{args.capacity}-{args.latency:g}s-m{args.median:g}"
        clip = (args.clip[0], args.clip[1])
        cells = [
            Cell(
                name,
                args.groups,
                args.capacity,
                args.latency,
                args.median,
                args.sigma,
                clip,
                args.jitter,
            )
        ]
    else:
        cells = [c for c in CELLS if not args.only or c.name in args.only]
    if args.strategy != "circular":
        suffix = f"-d{args.degree}" if args.strategy == "regular" else "-all_pairs"
        cells = [
            replace(c, name=c.name + suffix, strategy=args.strategy, degree=args.degree)
            for c in cells
        ]
    results: dict[str, dict[str, Summary]] = {}
    log_dir = Path(tempfile.mkdtemp(prefix="genrm-eager-")) if args.http else None
    for cell in cells:
        results[cell.name] = {}
        for mode in args.modes:
            steps = []
            for seed in range(args.seeds):
                if log_dir is not None:
                    steps.append(run_http(cell, mode, seed, log_dir))
                else:
                    steps.append(run_virtual(cell, mode, seed))
            results[cell.name][mode] = summarise(cell, mode, steps)
            print(f"done {cell.name} {mode}", file=sys.stderr, flush=True)
    print(table(results))
    targets = check_targets(results)
    for line in targets:
        print(line)
    out = args.out or (DEFAULT_OUT.with_name("eager-step-http.json") if args.http else DEFAULT_OUT)
    out.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "clock": "real (HTTP)" if args.http else "virtual",
        "cells": [asdict(c) for c in cells],
        "results": {c: {m: asdict(s) for m, s in modes.items()} for c, modes in results.items()},
        "targets": targets,
        "logs": str(log_dir) if log_dir else None,
    }
    out.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
