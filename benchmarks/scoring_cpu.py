"""CPU time of scoring one group, by part (docs/benchmarks.md, "Scoring at scale"): the
Bradley–Terry fit, the preference-cycle share, and the whole of `score_cohort` (masking, both
aggregations' shared work, rows), at N ∈ {16, 64, 256, 512} for all_pairs and regular graphs.

CPU time of the measuring thread (`time.thread_time`), the best of `--repeat` runs, so the load
of the shared machine matters less than with a wall clock. `--loop` adds what the event loop
sees: the longest gap between the ticks of a task that sleeps 1 ms while `score_cohort` runs
on the loop, and while it runs in a worker thread (`judge/offload.py`'s `score_off_loop`, as
the engine does for large groups: the collector paused meanwhile), with the loop thread's own
CPU time meanwhile. The gap is wall-clock time on a shared machine: an upper bound, noisy.
`--gc-off` runs with the collector disabled throughout, to see how much of a gap is CPython's
garbage collector (it pauses every thread). `--engine` instead sends one group through
`open_engine` with an instant simulated judge and reports its wall time and the loop's largest
gap, scoring and everything else included.
Verdicts are deterministic (a seeded latent quality per member and a rounded noisy ranking
per comparison), every comparison succeeds, one judge pass.

    python benchmarks/scoring_cpu.py [--sizes 16 64 256 512] [--degree 8] [--repeat 3] [--loop]
                                     [--out benchmarks/results/scoring-cpu.json]
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import trio

from genrm_trio import Settings, open_engine
from genrm_trio.domain.scoring import (
    JudgedComparison,
    PairObservations,
    fit_bradley_terry,
    observation,
    plan_comparisons,
    preference_cycle_rate,
)
from genrm_trio.domain.verdict import Verdict
from genrm_trio.engine.evaluation import Evaluation, MemberText, score_cohort
from genrm_trio.judge.offload import score_off_loop
from genrm_trio.testing import SimConfig, SimJudge

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import answered, git_commit, verify_input


def judged(n: int, strategy: str, degree: int, seed: int = 0) -> list[JudgedComparison]:
    """One verdict per planned comparison: ranking 1–6 from a noisy quality difference."""
    rng = random.Random(seed)
    quality = [rng.gauss(0, 1) for _ in range(n)]
    out = []
    for p in plan_comparisons(n, strategy, 1, "none", degree):
        z = quality[p.i] - quality[p.j] + rng.gauss(0, 1)
        r = min(6.0, max(1.0, round(3.5 - 1.5 * z)))
        out.append(JudgedComparison(p.i, p.j, p.k, (3.0, 3.0, r)))
    return out


def pair_observations(comparisons: Sequence[JudgedComparison]) -> list[PairObservations]:
    totals: dict[tuple[int, int], list[float]] = {}
    for c in comparisons:
        a, b, y = c.i, c.j, observation(c)
        if a > b:
            a, b, y = b, a, 1.0 - y
        total = totals.setdefault((a, b), [0.0, 0.0])
        total[0] += 1
        total[1] += y
    return [PairObservations(a, b, int(k), w) for (a, b), (k, w) in totals.items()]


def evaluation(n: int, strategy: str, degree: int, comparisons: Sequence[JudgedComparison]) -> Any:
    plan = plan_comparisons(n, strategy, 1, "none", degree)
    ev = Evaluation(plan, [f"a{i}" for i in range(n)], [], None)
    for c, judged_one in enumerate(comparisons):
        ev.results[c] = answered(Verdict(*judged_one.scores))
    return ev


def best_cpu(work: Callable[[], object], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.thread_time()
        work()
        best = min(best, time.thread_time() - start)
    return best


async def heartbeat(gaps: list[float], done: trio.Event) -> None:
    """Ticks every 1 ms until `done`, appending to `gaps` the wall-clock time between ticks: how
    long the loop was kept from running."""
    last = time.perf_counter()
    while not done.is_set():
        await trio.sleep(0.001)
        now = time.perf_counter()
        gaps.append(now - last)
        last = now


async def _largest_gap(work: Callable[[], object], threaded: bool) -> tuple[float, float]:
    """The longest wall-clock gap between ticks of a 1 ms heartbeat while ``work`` runs, and the
    CPU time of the loop's thread meanwhile."""
    gaps: list[float] = []
    done = trio.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(heartbeat, gaps, done)
        await trio.sleep(0.01)
        start = time.thread_time()
        if threaded:
            await score_off_loop(work, trio.CapacityLimiter(1))
        else:
            work()
        loop_cpu = time.thread_time() - start
        await trio.sleep(0.01)
        done.set()
    return max(gaps), loop_cpu


async def _engine_gap(n: int, strategy: str, degree: int) -> tuple[float, float]:
    """One group through `open_engine` with an instant simulated judge (every rollout sent at
    once): the group's wall time and the longest gap of a 1 ms heartbeat meanwhile."""
    settings = Settings.model_validate(
        {
            "num_rollouts_per_prompt": n,
            "comparison_strategy": strategy,
            "comparisons_per_rollout": degree,
            "aggregator_method": "bradley_terry",
            "cohort_collection_timeout_s": 600.0,
            "cohort_evaluation_timeout_s": 600.0,
            "judge_request_timeout_s": 300.0,
            "judge": {"max_concurrency": 1_000_000},
        }
    )
    gaps: list[float] = []
    done = trio.Event()
    judge = SimJudge(SimConfig(latency_s=0.0, record_calls=False))
    async with open_engine(settings, judge) as engine, trio.open_nursery() as nursery:
        nursery.start_soon(heartbeat, gaps, done)
        start = time.perf_counter()
        async with trio.open_nursery() as group:
            for i in range(n):
                group.start_soon(engine.verify, verify_input(0, i, "Which answer is better?"))
        elapsed = time.perf_counter() - start
        done.set()
    return elapsed, max(gaps)


def measure(n: int, strategy: str, degree: int, repeat: int, loop: bool) -> dict[str, Any]:
    comparisons = judged(n, strategy, degree)
    pairs = pair_observations(comparisons)
    members = list(range(n))
    settings = Settings.model_validate(
        {
            "num_rollouts_per_prompt": n,
            "comparison_strategy": strategy,
            "comparisons_per_rollout": degree,
            "aggregator_method": "bradley_terry",
        }
    )
    ev = evaluation(n, strategy, degree, comparisons)
    texts = {i: MemberText("", f"a{i}") for i in range(n)}
    fit = fit_bradley_terry(n, pairs, 0.1)
    gaps: dict[str, float] = {}
    if loop:
        for threaded in (False, True):
            name = "threaded" if threaded else "inline"
            gaps[f"loop_gap_{name}_s"], gaps[f"loop_cpu_{name}_s"] = trio.run(
                _largest_gap, lambda: score_cohort(settings, ev, n, texts), threaded
            )
    return {
        **gaps,
        "n": n,
        "strategy": strategy,
        "degree": degree if strategy == "regular" else None,
        "comparisons": len(comparisons),
        "newton_steps": fit.newton_steps,
        "fit_cpu_s": best_cpu(lambda: fit_bradley_terry(n, pairs, 0.1), repeat),
        "cycle_share_cpu_s": best_cpu(lambda: preference_cycle_rate(comparisons, members), repeat),
        "score_cohort_cpu_s": best_cpu(lambda: score_cohort(settings, ev, n, texts), repeat),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--sizes", type=int, nargs="+", default=[16, 64, 256, 512])
    parser.add_argument("--degree", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--loop", action="store_true", help="also the event loop's largest gap")
    parser.add_argument(
        "--engine",
        action="store_true",
        help="instead: one group through open_engine (instant judge), its time and loop gap",
    )
    parser.add_argument(
        "--gc-off", action="store_true", help="with the garbage collector off (gc.disable)"
    )
    parser.add_argument("--out")
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    if args.gc_off:
        gc.disable()
    if args.engine:
        print("| N | graph | group wall time | largest loop gap |")
        print("|---|---|---|---|")
        for n in args.sizes:
            for strategy in ("regular", "all_pairs"):
                elapsed, gap = trio.run(_engine_gap, n, strategy, args.degree)
                print(f"| {n} | {strategy} | {elapsed:.2f} s | {gap * 1e3:.1f} ms |", flush=True)
        return 0
    rows = []
    loop_columns = " loop's largest gap: inline | threaded | loop CPU, threaded |"
    print(
        "| N | graph | comparisons | Newton steps | fit | cycle share | score_cohort |"
        + (loop_columns if args.loop else "")
    )
    print("|---|---|---|---|---|---|---|" + ("---|---|---|" if args.loop else ""))
    for n in args.sizes:
        for strategy in ("regular", "all_pairs"):
            row = measure(n, strategy, args.degree, args.repeat, args.loop)
            rows.append(row)
            graph = f"regular d={args.degree}" if strategy == "regular" else "all_pairs"
            print(
                f"| {n} | {graph} | {row['comparisons']} | {row['newton_steps']} | "
                f"{row['fit_cpu_s'] * 1e3:.1f} ms | {row['cycle_share_cpu_s'] * 1e3:.1f} ms | "
                f"{row['score_cohort_cpu_s'] * 1e3:.1f} ms |"
                + (
                    f" {row['loop_gap_inline_s'] * 1e3:.1f} ms | "
                    f"{row['loop_gap_threaded_s'] * 1e3:.1f} ms | "
                    f"{row['loop_cpu_threaded_s'] * 1e3:.1f} ms |"
                    if args.loop
                    else ""
                ),
                flush=True,
            )
    if args.out:
        record = {
            "benchmark": "scoring_cpu",
            "commit": git_commit(),
            "command": " ".join(["python", "benchmarks/scoring_cpu.py", *(argv or sys.argv[1:])]),
            "gc_off": args.gc_off,
            "rows": rows,
        }
        Path(args.out).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
