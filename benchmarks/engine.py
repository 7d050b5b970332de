"""Engine-only benchmark: groups/s, CPU per group, and memory per member held in collection.

No HTTP and no sockets: `open_engine` with the in-process `SimJudge` at zero latency, so what is
measured is the engine (keys, digests, registry, state machine, waiters, cohort tasks, the
comparator, masking and scoring) plus the simulator's verdict text for each comparison.

Throughput: `--groups` groups of `--size` rollouts (circular), `--levels` groups in flight at
once; each group is `--size` concurrent `engine.verify()` calls. Reports groups/s (wall) and CPU
per group (`time.process_time`), best of `--repeat` runs, and the simulator's own CPU share.

Memory: `--hold` groups with `--size - 1` members each are held in collection (the last member
never arrives) for each answer size of `--answers`; reports the traced Python memory
(`tracemalloc`) and the RSS growth per held member and in total, and the largest allocation sites.
Each held request builds its own input (fresh strings, as a decoded HTTP body would) and keeps no
reference to it, so whatever the engine keeps of a request shows up here. The target per member
is 2 x answer size + 1 KiB for what the engine holds beyond a bare waiting task (the same tasks
and inputs parked in `trio.sleep_forever()`, measured too).

    python benchmarks/engine.py [--groups 200] [--levels 1,16,64] [--repeat 3]
                                [--hold 1000] [--answers 1000,16384] [--no-eager]

`--no-eager` runs with `eager_comparisons: false` (the default is the engine's, true), for a
before/after of eager starts on the same build.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import logging
import os
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import trio
import trio.testing

from genrm_trio import Scored, Settings, VerifyInput, open_engine
from genrm_trio.app.bench import procfs
from genrm_trio.judge.base import JudgeCall
from genrm_trio.testing import SimConfig, SimJudge

PROMPT = (
    "Solve the following problem and explain your reasoning step by step. A train leaves the "
    "station at 9:00 travelling at 80 km/h; a second train leaves at 10:00 at 100 km/h on the "
    "same track. When does the second train catch up with the first?"
)
FILLER = "The second train gains 20 km every hour on the first, which had an 80 km head start. "


EAGER = True  # eager_comparisons; --no-eager sets it False (also in the RSS child)


def settings(size: int) -> Settings:
    return Settings.model_validate(
        {
            "eager_comparisons": EAGER,
            "num_rollouts_per_prompt": size,
            "comparison_strategy": "circular",
            "cohort_collection_timeout_s": 3600.0,
            "cohort_evaluation_timeout_s": 3600.0,
            "judge_request_timeout_s": 600.0,
            "genrm_parse_retries": 0,
            "server": {"max_active_cohorts": 1_000_000},
            "judge": {"max_concurrency": 1_000_000},
        }
    )


def answer(group: int, index: int, chars: int) -> str:
    """A fresh answer string of exactly ``chars`` characters (distinct per rollout)."""
    head = f"[{group}:{index}] "
    body = (FILLER * (chars // len(FILLER) + 1))[: max(0, chars - len(head))]
    return head + body


def verify_input(group: str, index: int, chars: int, serial: int) -> VerifyInput:
    """One rollout as a decoded `/verify` body would give it: every object built anew."""
    text = answer(serial, index, chars)
    return VerifyInput(
        input=[{"role": "user", "content": "".join([PROMPT, ""]), "type": "message"}],
        response={
            "id": f"resp-{group}-{index}",
            "object": "response",
            "status": "completed",
            "output": [
                {
                    "id": f"msg-{group}-{index}",
                    "type": "message",
                    "role": "assistant",
                    "status": "completed",
                    "content": [{"type": "output_text", "text": text, "annotations": []}],
                }
            ],
            "usage": {"input_tokens": 64, "output_tokens": chars // 4},
        },
        group_id=group,
        group_attempt=0,
        group_attempt_given=True,
        rollout_index=index,
    )


# --- throughput ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Throughput:
    level: int
    groups: int
    wall_s: float
    cpu_s: float

    @property
    def rate(self) -> float:
        return self.groups / self.wall_s

    @property
    def cpu_ms(self) -> float:
        return self.cpu_s / self.groups * 1000

    @property
    def cpu_share(self) -> float:
        """Share of one core this process got: below 1 means other processes took the CPU."""
        return self.cpu_s / self.wall_s


async def run_groups(level: int, groups: int, size: int, chars: int, tag: str) -> Throughput:
    judge = SimJudge(SimConfig(record_calls=False))
    serials = itertools.count()
    async with open_engine(settings(size), judge) as engine:

        async def rollout(group: str, serial: int, index: int) -> None:
            outcome = await engine.verify(verify_input(group, index, chars, serial))
            assert isinstance(outcome, Scored), outcome

        async def worker() -> None:
            while (serial := next(serials)) < groups:
                group = f"{tag}-{level}-{serial}"
                async with trio.open_nursery() as nursery:
                    for index in range(size):
                        nursery.start_soon(rollout, group, serial, index)

        wall0, cpu0 = time.perf_counter(), time.process_time()
        async with trio.open_nursery() as nursery:
            for _ in range(level):
                nursery.start_soon(worker)
        wall1, cpu1 = time.perf_counter(), time.process_time()
        stats = engine.statistics()
        assert stats.active_cohorts == 0 and stats.waiters == 0, stats
        assert stats.judge.calls == groups * size, stats.judge
    return Throughput(level, groups, wall1 - wall0, cpu1 - cpu0)


async def judge_cpu_ms_per_group(groups: int, size: int, chars: int) -> float:
    """CPU of the simulated judge alone for the comparisons of one group (subtracted in text)."""
    judge = SimJudge(SimConfig(record_calls=False))
    history = [{"role": "user", "content": PROMPT}]
    texts = [answer(0, i, chars) for i in range(size)]
    calls = [
        JudgeCall(history, texts[i], texts[(i + 1) % size], None) for i in range(size)
    ]  # circular
    cpu0 = time.process_time()
    for _ in range(groups):
        for call in calls:
            await judge.attempt(call)
    return (time.process_time() - cpu0) / groups * 1000


# --- memory -------------------------------------------------------------------------------------


def rss_bytes() -> int:
    rss = procfs.rss_mb(os.getpid())
    if rss is not None:
        return int(rss * 1024 * 1024)
    import resource  # no /proc: the peak, the best there is

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


@dataclass(frozen=True, slots=True)
class Held:
    chars: int
    members: int
    traced: int  # bytes, tracemalloc: held by the engine and the waiting request tasks
    bare: int  # bytes, tracemalloc: the same request tasks parked without an engine
    rss: int  # bytes, RSS growth (fresh interpreter)
    rss_bare: int
    top: list[tuple[str, int]]  # (allocation site, bytes) of the engine hold

    def per_member(self, total: int) -> float:
        return total / self.members

    @property
    def engine_per_member(self) -> float:
        """What the engine holds per member beyond a bare waiting task."""
        return (self.traced - self.bare) / self.members

    @property
    def target(self) -> int:
        return 2 * self.chars + 1024


async def _park(item: VerifyInput) -> None:
    """The baseline request: drops its input and waits forever (no engine)."""
    del item
    await trio.sleep_forever()


async def hold(
    groups: int, size: int, chars: int, *, traced: bool, bare: bool = False
) -> tuple[int, int, Any]:
    """Hold ``groups`` cohorts with ``size - 1`` members each; (members, bytes, snapshot diff).

    ``bare``: the same request tasks and inputs, parked in ``trio.sleep_forever()`` instead.
    """
    judge = SimJudge(SimConfig(record_calls=False))
    members = groups * (size - 1)
    async with open_engine(settings(size), judge) as engine:

        async def rollout(serial: int, index: int) -> None:
            # the input is built here and handed over: this task keeps no reference to it
            if bare:
                await _park(verify_input(f"hold-{serial}", index, chars, serial))
            else:
                await engine.verify(verify_input(f"hold-{serial}", index, chars, serial))

        async with trio.open_nursery() as nursery:
            gc.collect()
            await trio.testing.wait_all_tasks_blocked()
            before_rss = rss_bytes()
            before = tracemalloc.take_snapshot() if traced else None
            before_traced = tracemalloc.get_traced_memory()[0] if traced else 0
            for serial in range(groups):
                for index in range(size - 1):
                    nursery.start_soon(rollout, serial, index)
            await trio.testing.wait_all_tasks_blocked()
            gc.collect()
            stats = engine.statistics()
            if not bare:
                assert stats.waiters == members and stats.active_cohorts == groups, stats
            if traced:
                after = tracemalloc.take_snapshot()
                grown = tracemalloc.get_traced_memory()[0] - before_traced
                assert before is not None
                diff = after.compare_to(before, "lineno")
            else:
                grown = rss_bytes() - before_rss
                diff = None
            nursery.cancel_scope.cancel()  # every request disconnects; aclose fails the cohorts
    return members, grown, diff


def _site(stat: Any) -> str:
    frame = stat.traceback[0]
    name = frame.filename
    for marker in ("site-packages/", "genrm_trio/", "benchmarks/"):
        if marker in name:
            name = name[name.index(marker) :].removeprefix("site-packages/")
            break
    return f"{name}:{frame.lineno}"


def rss_in_child(groups: int, size: int, chars: int, *, bare: bool) -> int:
    """RSS growth of the same hold in a fresh interpreter (no memory freed by earlier runs)."""
    out = subprocess.run(
        [
            sys.executable,
            __file__,
            "--rss-child",
            f"{groups},{size},{chars},{int(bare)}",
            *([] if EAGER else ["--no-eager"]),
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=600,
    )
    return int(out.stdout.split()[-1])


async def measure_hold(groups: int, size: int, chars: int) -> Held:
    rss = rss_in_child(groups, size, chars, bare=False)
    rss_bare = rss_in_child(groups, size, chars, bare=True)
    tracemalloc.start(1)
    try:
        members, traced, diff = await hold(groups, size, chars, traced=True)
        _, bare, _ = await hold(groups, size, chars, traced=True, bare=True)
    finally:
        tracemalloc.stop()
    top = [(_site(s), s.size_diff) for s in diff[:12] if s.size_diff > 0]
    return Held(chars, members, traced, bare, rss, rss_bare, top)


# --- main ---------------------------------------------------------------------------------------


def _levels(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part]


async def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--groups", type=int, default=200)
    parser.add_argument("--size", type=int, default=16)
    parser.add_argument("--levels", type=_levels, default=[1, 16, 64])
    parser.add_argument("--chars", type=int, default=1000, help="answer size for throughput")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--hold", type=int, default=1000)
    parser.add_argument("--answers", type=_levels, default=[1000, 16384])
    parser.add_argument("--rss-child", type=_levels, help=argparse.SUPPRESS)
    parser.add_argument("--no-eager", action="store_true", help="eager_comparisons: false")
    args = parser.parse_args(argv)
    global EAGER
    EAGER = not args.no_eager
    size = args.size
    logging.getLogger("genrm_trio").setLevel(logging.ERROR)  # one line per cohort otherwise
    if args.rss_child:
        groups, size, chars, bare = args.rss_child
        print((await hold(groups, size, chars, traced=False, bare=bool(bare)))[1])
        return 0

    print(
        f"engine benchmark: Python {sys.version.split()[0]}, trio {trio.__version__}, "
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}"
    )
    print(
        f"\nthroughput: {args.groups} groups of {size} (circular, {size} comparisons each), "
        f"{args.chars}-character answers, SimJudge at zero latency, best of {args.repeat}"
    )
    await run_groups(4, 20, size, args.chars, "warmup")
    sim_ms = await judge_cpu_ms_per_group(args.groups, size, args.chars)
    print(
        f"{'in flight':>10} {'groups/s':>10} {'rollouts/s':>11} {'CPU share':>10} "
        f"{'CPU ms/group':>13} {'groups/s per core':>18}"
    )
    for level in args.levels:
        runs = [
            await run_groups(level, args.groups, size, args.chars, f"r{n}")
            for n in range(args.repeat)
        ]
        best = max(runs, key=lambda r: r.rate)
        cpu = min(r.cpu_ms for r in runs)
        print(
            f"{level:>10} {best.rate:>10.1f} {best.rate * size:>11.0f} {best.cpu_share:>10.2f} "
            f"{cpu:>13.2f} {1000 / cpu:>18.0f}"
            f"   (runs: {', '.join(f'{r.rate:.0f}' for r in runs)} groups/s)"
        )
    print(
        f"of which the simulated judge's verdicts: {sim_ms:.2f} ms CPU per group; 'groups/s per "
        "core' = 1000 / CPU ms per group, the rate one otherwise idle core would sustain"
    )

    print(
        f"\nmemory: {args.hold} groups x {size - 1} members held in collection "
        f"(member {size - 1} never arrives)"
    )
    print(
        "per member: 'in all' = engine hold incl. the waiting request tasks; 'bare' = the same "
        "tasks parked in trio.sleep_forever() without an engine; 'engine' = the difference"
    )
    for chars in args.answers:
        held = await measure_hold(args.hold, size, chars)
        verdict = "within" if held.engine_per_member <= held.target else "OVER"
        kib = 1024
        print(
            f"answer {chars:>6} chars: traced {held.per_member(held.traced) / kib:6.2f} KiB in all"
            f" = {held.per_member(held.bare) / kib:.2f} KiB bare + "
            f"{held.engine_per_member / kib:.2f} KiB engine (target {held.target / kib:.2f} KiB:"
            f" {verdict}); RSS {held.per_member(held.rss) / kib:.2f} KiB in all, "
            f"{held.per_member(held.rss_bare) / kib:.2f} KiB bare"
        )
        print(
            f"    {held.members} members held at once: traced {held.traced / 2**20:.1f} MiB, "
            f"RSS {held.rss / 2**20:.1f} MiB; largest allocation sites (bytes per member):"
        )
        for site, grown in held.top:
            print(f"    {grown / held.members:9.0f}  {site}")
    return 0


if __name__ == "__main__":
    raise SystemExit(trio.run(main))
