"""Output-budget escalation: masked rollouts and judge output tokens, escalation off and on.

Counts, not timings: `open_engine` with the in-process `SimJudge` and its length model (each
attempt's verdict needs L output tokens, drawn per pair and attempt; an attempt whose budget is
below L comes back as an exhausted budget with usage = the budget), run in virtual time
(`trio.testing.MockClock`), so retry sleeps cost nothing and the result does not depend on how
busy the machine is. Every scenario runs `--groups` groups of 16 rollouts (circular, one judge
pass) with escalation off and on, over the same texts and seed, and reports per group: masked
rollouts (a group whose every member is masked counts 16), failed comparisons, the share of
comparisons that escalated, judge attempts, and judge output tokens (the sum of every attempt's
reported output tokens, escalated and exhausted attempts included; mean and p95 over groups).

Scenarios (`--only NAME` to pick some):

- `validation-A2`: the partial-masking validation run — `validation` preset (531-2,981 tokens,
  1,341 at p55), max_output_tokens 1,341, genrm_parse_retries 1 (two attempts);
  on = factor 2, cap 32,768.
- `validation-A3`: the same with three attempts.
- `long_tail-A2`, `long_tail-A3`: `long_tail` preset, max_output_tokens 16,384, two or three
  attempts; on = factor 2, cap 32,768.

    python benchmarks/budget_escalation.py [--groups 400] [--seed 0] [--only validation-A2]
                                           [--out benchmarks/results/budget-escalation.json]
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import re
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

import trio
import trio.testing

from genrm_trio import GroupFailed, Masked, Scored, Settings, open_engine
from genrm_trio.domain.scoring import percentile
from genrm_trio.judge.base import JudgeCall, JudgeReply, ReplyStatus
from genrm_trio.testing import SimConfig, SimJudge
from genrm_trio.testing.verdicts import LENGTH_PRESETS

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import WrappedSim, engine_logs_quiet, git_commit, verify_input

SIZE: Final = 16
PROMPT: Final = "Compare the two answers to the user's question and decide which is better."
_TAG: Final = re.compile(r"^\[g(\d+):(\d+)\]")


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    preset: str
    budget: int
    retries: int  # genrm_parse_retries: A = retries + 1 attempts
    factor: float = 2.0
    cap: int = 32768


SCENARIOS: Final = (
    Scenario("validation-A2", "validation", 1341, 1),
    Scenario("validation-A3", "validation", 1341, 2),
    Scenario("long_tail-A2", "long_tail", 16384, 1),
    Scenario("long_tail-A3", "long_tail", 16384, 2),
)


def settings(scenario: Scenario, escalation: bool) -> Settings:
    judge: dict[str, Any] = {"max_concurrency": 1_000_000}
    if escalation:
        judge["budget_escalation"] = {"factor": scenario.factor, "max_output_tokens": scenario.cap}
    return Settings.model_validate(
        {
            "num_rollouts_per_prompt": SIZE,
            "comparison_strategy": "circular",
            "cohort_collection_timeout_s": 3600.0,
            "cohort_evaluation_timeout_s": 3600.0,
            "judge_request_timeout_s": 600.0,
            "genrm_parse_retries": scenario.retries,
            "genrm_parse_retry_sleep_s": 0.2,
            "genrm_responses_create_params": {
                "input": [],
                "max_output_tokens": scenario.budget,
                "temperature": 0.6,
                "top_p": 0.95,
            },
            "judge": judge,
            "server": {"max_active_cohorts": 1_000_000},
        }
    )


@dataclass
class GroupTally:
    output_tokens: int = 0
    attempts: int = 0
    # per unordered pair of rollout indices: the statuses of its attempts, in order
    pairs: dict[tuple[int, int], list[ReplyStatus]] = field(default_factory=dict)
    escalated: set[tuple[int, int]] = field(default_factory=set)


class CountingJudge(WrappedSim):
    """The simulated judge, tallying each group's attempts and reported output tokens."""

    def __init__(self, sim: SimJudge, budget: int) -> None:
        super().__init__(sim)
        self._budget = budget
        self.groups: dict[int, GroupTally] = {}

    async def attempt(self, call: JudgeCall) -> JudgeReply:
        reply = await self._sim.attempt(call)
        first, second = _TAG.match(call.response_1), _TAG.match(call.response_2)
        assert first is not None and second is not None, call
        tally = self.groups.setdefault(int(first.group(1)), GroupTally())
        pair = tuple(sorted((int(first.group(2)), int(second.group(2)))))
        assert len(pair) == 2
        key = (pair[0], pair[1])
        tally.attempts += 1
        tally.output_tokens += reply.output_tokens or 0
        tally.pairs.setdefault(key, []).append(reply.status)
        if (call.max_output_tokens or 0) > self._budget:
            tally.escalated.add(key)
        return reply


@dataclass(frozen=True, slots=True)
class Result:
    scenario: str
    escalation: str  # "off" or "factor F, cap C"
    groups: int
    masked_rollouts_mean: float
    masked_rollouts_p95: float
    masked_rollout_share: float
    groups_fully_masked: int
    failed_comparisons: int
    failed_comparisons_per_group: float
    escalated_comparison_share: float
    attempts_per_comparison: float
    output_tokens_per_group_mean: float
    output_tokens_per_group_p95: float


async def run(scenario: Scenario, escalation: bool, groups: int, seed: int) -> Result:
    config = settings(scenario, escalation)
    sim = SimJudge(
        SimConfig(seed=seed, length_model=LENGTH_PRESETS[scenario.preset], record_calls=False)
    )
    judge = CountingJudge(sim, scenario.budget)
    masked: list[int] = []
    fully = 0
    serials = itertools.count()
    async with open_engine(config, judge) as engine:

        async def one_group(group: int) -> None:
            nonlocal fully
            outcomes: list[Any] = [None] * SIZE

            async def rollout(index: int) -> None:
                outcomes[index] = await engine.verify(verify_input(group, index, PROMPT))

            async with trio.open_nursery() as nursery:
                for index in range(SIZE):
                    nursery.start_soon(rollout, index)
            if all(isinstance(o, GroupFailed) for o in outcomes):
                fully += 1
                masked.append(SIZE)
            else:
                assert all(isinstance(o, Scored | Masked) for o in outcomes), outcomes
                masked.append(sum(isinstance(o, Masked) for o in outcomes))

        async def worker() -> None:
            while (group := next(serials)) < groups:
                await one_group(group)

        async with trio.open_nursery() as nursery:
            for _ in range(16):  # groups in flight
                nursery.start_soon(worker)
    attempts = scenario.retries + 1
    tallies = [judge.groups[g] for g in range(groups)]
    comparisons = groups * SIZE
    assert all(len(t.pairs) == SIZE for t in tallies)
    failed = sum(
        len(statuses) == attempts and all(s is ReplyStatus.BUDGET_EXHAUSTED for s in statuses)
        for t in tallies
        for statuses in t.pairs.values()
    )
    tokens = [float(t.output_tokens) for t in tallies]
    label = f"factor {scenario.factor:g}, cap {scenario.cap}" if escalation else "off"
    return Result(
        scenario=scenario.name,
        escalation=label,
        groups=groups,
        masked_rollouts_mean=math.fsum(masked) / groups,
        masked_rollouts_p95=percentile([float(m) for m in masked], 0.95),
        masked_rollout_share=math.fsum(masked) / (groups * SIZE),
        groups_fully_masked=fully,
        failed_comparisons=failed,
        failed_comparisons_per_group=failed / groups,
        escalated_comparison_share=sum(len(t.escalated) for t in tallies) / comparisons,
        attempts_per_comparison=sum(t.attempts for t in tallies) / comparisons,
        output_tokens_per_group_mean=math.fsum(tokens) / groups,
        output_tokens_per_group_p95=percentile(tokens, 0.95),
    )


def table(results: Sequence[Result]) -> str:
    lines = [
        "| scenario | escalation | masked rollouts / group (mean, p95) | failed comparisons "
        "(total, / group) | escalated comparisons | attempts / comparison | judge output "
        "tokens / group (mean, p95) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r.scenario} | {r.escalation} | {r.masked_rollouts_mean:.2f}, "
            f"{r.masked_rollouts_p95:.0f} | {r.failed_comparisons}, "
            f"{r.failed_comparisons_per_group:.2f} | {r.escalated_comparison_share:.1%} | "
            f"{r.attempts_per_comparison:.2f} | {r.output_tokens_per_group_mean:,.0f}, "
            f"{r.output_tokens_per_group_p95:,.0f} |"
        )
    return "\n".join(lines)


def verdicts(results: Sequence[Result]) -> list[dict[str, Any]]:
    """On against off per scenario, against the issue's target: masked rollouts at most a
    quarter of off's, at no more than 1.3x its judge output tokens."""
    out: list[dict[str, Any]] = []
    by_name: dict[str, dict[str, Result]] = {}
    for r in results:
        by_name.setdefault(r.scenario, {})["off" if r.escalation == "off" else "on"] = r
    for name, pair in by_name.items():
        off, on = pair["off"], pair["on"]
        masked_ratio = (
            on.masked_rollouts_mean / off.masked_rollouts_mean if off.masked_rollouts_mean else None
        )
        tokens_ratio = on.output_tokens_per_group_mean / off.output_tokens_per_group_mean
        out.append(
            {
                "scenario": name,
                "masked_ratio": masked_ratio,
                "tokens_ratio": tokens_ratio,
                "tokens_p95_ratio": on.output_tokens_per_group_p95
                / off.output_tokens_per_group_p95,
                "target_met": masked_ratio is not None
                and masked_ratio <= 0.25
                and tokens_ratio <= 1.3,
            }
        )
    return out


async def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--groups", type=int, default=400)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", action="append", choices=[s.name for s in SCENARIOS])
    parser.add_argument("--out", type=Path)
    arguments = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(arguments)
    with engine_logs_quiet():
        return await run_benchmark(args, argv)


async def run_benchmark(args: argparse.Namespace, argv: Sequence[str] | None) -> int:
    """The benchmark `main` parsed `args` for (`argv` as given, for the record's command)."""
    chosen = [s for s in SCENARIOS if not args.only or s.name in args.only]
    results: list[Result] = []
    for scenario in chosen:
        for escalation in (False, True):
            results.append(await run(scenario, escalation, args.groups, args.seed))
    print(table(results))
    checks = verdicts(results)
    for check in checks:
        masked = check["masked_ratio"]
        print(
            f"{check['scenario']}: masked on/off = "
            f"{'n/a' if masked is None else f'{masked:.3f}'}, output tokens on/off = "
            f"{check['tokens_ratio']:.3f} (p95 {check['tokens_p95_ratio']:.3f}); target "
            f"{'met' if check['target_met'] else 'not met'}"
        )
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        record = {
            "benchmark": "budget_escalation",
            "commit": git_commit(),
            "command": " ".join(
                ["python", "benchmarks/budget_escalation.py", *(argv or sys.argv[1:])]
            ),
            "groups": args.groups,
            "seed": args.seed,
            "scenarios": [asdict(s) for s in chosen],
            "results": [asdict(r) for r in results],
            "verdicts": checks,
        }
        args.out.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0)))
