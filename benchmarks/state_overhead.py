"""What durable state costs: groups/s with and without ``state_path`` (docs/durable-state.md).

    python benchmarks/state_overhead.py [--groups 3000] [--concurrency 64] [--rollouts 8]
                                        [--rounds 3] [--synchronous FULL|NORMAL] [--dir DIR]
                                        [--judge-latency-ms 0]

In-process: the real engine, the in-process simulated judge at zero latency, and a closed loop
of ``--concurrency`` groups in flight, each sending its ``--rollouts`` members at once. With
state, every group costs three commits (watermark, open, terminal) on the SQLite store; the
judge costs nothing, so this is the worst case for the store's relative overhead. Runs alternate
(without, with) ``--rounds`` times; the best round of each is compared. The target is at most
10% slower with state. ``--judge-latency-ms`` gives every simulated judge call that latency
(a realistic judge takes hundreds of milliseconds), to see the store's share in a real run.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

from genrm_trio.app.compose import durable_engine, restore_from_store
from genrm_trio.config import Settings
from genrm_trio.domain.model import Scored, VerifyInput
from genrm_trio.engine.engine import Engine
from genrm_trio.store.sqlite import open_store
from genrm_trio.testing import SimConfig, SimJudge

TARGET_PERCENT = 10.0


def _settings(rollouts: int, state_path: str | None) -> Settings:
    return Settings.model_validate(
        {
            "num_rollouts_per_prompt": rollouts,
            "max_terminal_cohorts": 4096,
            "state_path": state_path,
            "genrm_parse_retries": 0,
        }
    )


def _member(group: int, index: int) -> VerifyInput:
    answer = f"answer {index} of group {group}: " + "words " * 40
    return VerifyInput(
        input=[{"role": "user", "content": f"question {group}"}],
        response={
            "id": f"resp-{group}-{index}",
            "output": [
                {
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": answer}],
                }
            ],
        },
        group_id=f"bench-{group}",
        group_attempt=0,
        group_attempt_given=True,
        rollout_index=index,
    )


async def _drive(
    engine: Engine, groups: int, concurrency: int, rollouts: int
) -> tuple[float, float]:
    """Run ``groups`` groups, ``concurrency`` at a time; returns (wall s, process CPU s)."""
    next_group = 0

    async def one_group(group: int) -> None:
        async def one(index: int) -> None:
            outcome = await engine.verify(_member(group, index))
            assert isinstance(outcome, Scored), outcome

        async with trio.open_nursery() as nursery:
            for index in range(rollouts):
                nursery.start_soon(one, index)

    async def worker() -> None:
        nonlocal next_group
        while next_group < groups:
            group = next_group
            next_group += 1
            await one_group(group)

    start, cpu = time.perf_counter(), time.process_time()
    async with trio.open_nursery() as nursery:
        for _ in range(concurrency):
            nursery.start_soon(worker)
    return time.perf_counter() - start, time.process_time() - cpu


async def _round(
    args: argparse.Namespace, state_dir: Path | None, label: str
) -> tuple[float, float]:
    """(groups/s, CPU ms per group, all threads) of one round."""
    path = None if state_dir is None else str(state_dir / f"{label}.db")
    settings = _settings(args.rollouts, path)
    judge = SimJudge(SimConfig(record_calls=False, latency_s=args.judge_latency_ms / 1000.0))
    if path is None or args.synchronous == "FULL":
        async with durable_engine(settings, judge) as engine:
            elapsed, cpu = await _drive(engine, args.groups, args.concurrency, args.rollouts)
    else:
        from genrm_trio.engine.engine import open_engine

        async with (
            open_store(path, settings, synchronous=args.synchronous) as store,
            open_engine(settings, judge, store=store) as engine,
        ):
            await restore_from_store(engine, store)
            elapsed, cpu = await _drive(engine, args.groups, args.concurrency, args.rollouts)
    return args.groups / elapsed, 1000.0 * cpu / args.groups


async def _main(args: argparse.Namespace) -> dict[str, Any]:
    without: list[tuple[float, float]] = []
    with_state: list[tuple[float, float]] = []
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        for n in range(args.rounds):
            without.append(await _round(args, None, f"none-{n}"))
            with_state.append(await _round(args, Path(tmp), f"state-{n}"))
    best_without = max(rate for rate, _ in without)
    best_with = max(rate for rate, _ in with_state)
    cpu_without = min(cpu for _, cpu in without)
    cpu_with = min(cpu for _, cpu in with_state)
    return {
        "without": [rate for rate, _ in without],
        "with": [rate for rate, _ in with_state],
        "best_without": best_without,
        "best_with": best_with,
        "median_without": statistics.median(rate for rate, _ in without),
        "median_with": statistics.median(rate for rate, _ in with_state),
        "slower_percent": 100.0 * (best_without - best_with) / best_without,
        "cpu_ms_without": cpu_without,
        "cpu_ms_with": cpu_with,
        "cpu_percent": 100.0 * (cpu_with - cpu_without) / cpu_without,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--groups", type=int, default=3000, help="groups per round")
    parser.add_argument("--concurrency", type=int, default=64, help="groups in flight")
    parser.add_argument("--rollouts", type=int, default=8, help="rollouts per group (N)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds of each")
    parser.add_argument("--synchronous", choices=["FULL", "NORMAL"], default="FULL")
    parser.add_argument("--dir", default=None, help="where the state files go (default: tmp)")
    parser.add_argument(
        "--judge-latency-ms", type=float, default=0.0, help="latency of every judge call"
    )
    args = parser.parse_args()
    result = trio.run(_main, args)
    print(
        f"{args.groups} groups x {args.rollouts} rollouts, {args.concurrency} in flight, "
        f"simulated judge at {args.judge_latency_ms:g} ms per call, "
        f"synchronous={args.synchronous}"
    )
    for name in ("without", "with"):
        rounds = ", ".join(f"{value:.0f}" for value in result[name])
        print(f"  {name + ' state':14s} best {result['best_' + name]:7.0f} groups/s  ({rounds})")
    print(
        f"  CPU per group (all threads, best round): {result['cpu_ms_without']:.2f} ms without, "
        f"{result['cpu_ms_with']:.2f} ms with state ({result['cpu_percent']:+.1f}%)"
    )
    verdict = "ok" if result["slower_percent"] <= TARGET_PERCENT else "over target"
    print(
        f"  with state is {result['slower_percent']:+.1f}% slower in groups/s "
        f"(target <= {TARGET_PERCENT:.0f}%: {verdict})"
    )


if __name__ == "__main__":
    main()
