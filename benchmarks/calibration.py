"""`genrm-trio calibrate`'s proof (docs/benchmarks.md, "Calibrating the judge"): on simulated
judges, whose answers' latent quality is known, does the estimated τ track the true τ, and does
the recommendation hold up on fresh groups?

For each judge family: `--measured-groups` groups of 16 are judged every pair in both orders
through the engine and the in-process simulated judge (`genrm_trio.app.calibrate.judge_groups`,
what the command runs), the judge is fitted and every schedule simulated
(`--simulated-groups`), and the recommendation taken. Then `--fresh-groups` other groups are
judged by every schedule directly (reward_quality.py's path: the simulated judge's verdicts,
`aggregate`) and scored against the latent quality: the true τ. The tables give estimated
against true τ per schedule, and, per judge, the recommendation, its true τ, all_pairs' true τ
(J = 1, `alternate`, the better aggregator) and the cheapest schedule whose true τ reaches
all_pairs' − 0.02.

    python benchmarks/calibration.py [--measured-groups 16] [--simulated-groups 400]
                                     [--fresh-groups 200] [--only-family comparative]
                                     [--out benchmarks/results/calibration.json]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import trio

from genrm_trio import Settings
from genrm_trio.app.calibrate import Calibration, judge_groups, reference
from genrm_trio.domain.calibration import (
    TOLERANCE,
    FrontierPoint,
    RolloutGroup,
    Schedule,
    fit_judge,
    kendall_tau_b,
    measure,
    recommend,
    schedules_for,
    simulate_frontier,
)
from genrm_trio.testing import SimConfig, SimJudge
from genrm_trio.testing.judgment import JudgmentModel, latent_quality

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import answer, engine_logs_quiet, git_commit
from reward_quality import FAMILIES, HISTORY, PROMPT, Graph, fast_scorings, judge_group

SIZE: Final = 16
JUDGES: Final[dict[str, JudgmentModel]] = {
    **FAMILIES,
    # the noisier judge (#39): noise 1.6, bias 0.3
    "comparative-noise-1.6": JudgmentModel("comparative", noise=1.6, bias=0.3),
}
PROOF_JUDGES: Final = ("comparative", "comparative-noise-1.6")
MEASURED_OFFSET: Final = 1_000_000  # measured groups' answers differ from the fresh groups'


def measured_groups(count: int) -> list[RolloutGroup]:
    return [
        RolloutGroup(
            f"g{g}",
            tuple(HISTORY),
            tuple(
                {
                    "output": [
                        {
                            "type": "message",
                            "role": "assistant",
                            "content": [
                                {"type": "output_text", "text": answer(MEASURED_OFFSET + g, i)}
                            ],
                        }
                    ]
                }
                for i in range(SIZE)
            ),
        )
        for g in range(count)
    ]


def measure_judge(model: JudgmentModel, count: int, seed: int) -> Calibration:
    settings = Settings.model_validate(
        {
            "num_rollouts_per_prompt": SIZE,
            "genrm_parse_retries": 0,
            "judge": {"max_concurrency": 1_000_000},
        }
    )
    calibration = Calibration(SIZE)
    judge = SimJudge(SimConfig(seed=seed, judgment=model, record_calls=False))
    trio.run(judge_groups, settings, judge, measured_groups(count), calibration)
    assert not calibration.failed, calibration.failed
    assert calibration.calls_made == count * SIZE * (SIZE - 1)
    return calibration


def true_taus(
    model: JudgmentModel, schedules: Sequence[Schedule], groups: int, seed: int
) -> dict[Schedule, float]:
    """Each schedule's mean τ of the rewards against the latent quality on ``groups`` fresh
    groups judged by the simulated judge itself."""
    graphs = {
        s: Graph(s.name, s.strategy, s.judges, "alternate", s.degree)
        for s in schedules
        if s.aggregator == "simple_tiebreaker"
    }
    taus: dict[Schedule, list[float]] = {s: [] for s in schedules}
    for group in range(groups):
        quality = [latent_quality(seed, answer(group, i)) for i in range(SIZE)]
        for schedule, graph in graphs.items():
            scorings = fast_scorings(graph, judge_group(model, graph, seed, group), 0.0)
            for s in schedules:
                if (s.strategy, s.judges, s.degree) != (
                    schedule.strategy,
                    schedule.judges,
                    schedule.degree,
                ):
                    continue
                rewards = scorings[(s.aggregator, "pair")].rewards
                assert rewards is not None
                tau = kendall_tau_b([rewards[m] for m in range(SIZE)], quality)
                if tau is not None:
                    taus[s].append(tau)
    return {s: math.fsum(v) / len(v) for s, v in taus.items()}


def run(args: argparse.Namespace) -> dict[str, Any]:
    schedules = schedules_for(SIZE)
    judges: dict[str, Any] = {}
    for name in args.only_family or list(JUDGES):
        model = JUDGES[name]
        started = time.monotonic()
        calibration = measure_judge(model, args.measured_groups, args.seed)
        measurement = measure(calibration.groups)
        fit = fit_judge(calibration.groups, measurement)
        frontier = simulate_frontier(fit, SIZE, groups=args.simulated_groups, seed=args.seed)
        chosen = recommend(frontier, SIZE)
        truth = true_taus(model, schedules, args.fresh_groups, args.seed)
        true_points = [
            FrontierPoint(p.schedule, p.calls_per_group, truth[p.schedule], math.nan)
            for p in frontier
        ]
        target_point = reference(true_points)
        target = target_point.tau - TOLERANCE
        reaching = [p for p in true_points if p.tau >= target]
        cheapest = min(reaching, key=lambda p: (p.calls_per_group, -p.tau))
        errors = [p.tau - truth[p.schedule] for p in frontier]
        # what the criterion reads: each schedule's distance below all_pairs, estimated and true
        estimated_top = reference(frontier)
        gaps = [
            (estimated_top.tau - p.tau) - (truth[estimated_top.schedule] - truth[p.schedule])
            for p in frontier
        ]
        judges[name] = {
            "model": {"family": model.family, "noise": model.noise, "bias": model.bias},
            "position_bias": measurement.first_win_excess,
            "order_consistency": measurement.order_consistency,
            "cycle_share": measurement.cycle_share,
            "fit": fit.as_json(),
            "schedules": [{**p.as_json(), "true_kendall_tau": truth[p.schedule]} for p in frontier],
            "mean_abs_error": math.fsum(abs(e) for e in errors) / len(errors),
            "max_abs_error": max(abs(e) for e in errors),
            "mean_error": math.fsum(errors) / len(errors),
            "mean_abs_gap_error": math.fsum(abs(g) for g in gaps) / len(gaps),
            "recommended": chosen.schedule.name,
            "recommended_calls": chosen.calls_per_group,
            "recommended_estimated_tau": chosen.tau,
            "recommended_true_tau": truth[chosen.schedule],
            "all_pairs": target_point.schedule.name,
            "all_pairs_true_tau": target_point.tau,
            "target": target,
            "recommended_reaches_target": truth[chosen.schedule] >= target,
            "cheapest_reaching_target": cheapest.schedule.name,
            "cheapest_reaching_target_calls": cheapest.calls_per_group,
            "seconds": time.monotonic() - started,
        }
        print(f"{name}: {json.dumps({k: v for k, v in judges[name].items() if k != 'schedules'})}")
    return judges


def tables(judges: dict[str, Any]) -> str:
    out = [
        "| judge | fitted noise, bias | scores | mean abs error of τ | max | mean (est − true) | "
        "mean abs error of the gap below all_pairs |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, j in judges.items():
        fit = j["fit"]
        out.append(
            f"| {name} | {fit['noise']:.2f}, {fit['bias']:+.2f} | {fit['score_mode']} | "
            f"{j['mean_abs_error']:.3f} | {j['max_abs_error']:.3f} | {j['mean_error']:+.3f} | "
            f"{j['mean_abs_gap_error']:.3f} |"
        )
    out += [
        "",
        "| judge | recommended | calls | τ estimated | τ true (fresh) | all_pairs τ true | "
        "target | reaches | cheapest reaching (fresh) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, j in judges.items():
        out.append(
            f"| {name} | {j['recommended']} | {j['recommended_calls']} | "
            f"{j['recommended_estimated_tau']:.3f} | {j['recommended_true_tau']:.3f} | "
            f"{j['all_pairs_true_tau']:.3f} | {j['target']:.3f} | "
            f"{'yes' if j['recommended_reaches_target'] else 'no'} | "
            f"{j['cheapest_reaching_target']} ({j['cheapest_reaching_target_calls']}) |"
        )
    out += ["", "| judge | schedule | calls | τ estimated | τ true |", "|---|---|---|---|---|"]
    for name, j in judges.items():
        for s in j["schedules"]:
            out.append(
                f"| {name} | {s['name']} | {s['calls_per_group']} | {s['kendall_tau']:.3f} | "
                f"{s['true_kendall_tau']:.3f} |"
            )
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--measured-groups", type=int, default=16)
    parser.add_argument("--simulated-groups", type=int, default=400)
    parser.add_argument("--fresh-groups", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only-family", action="append", choices=list(JUDGES))
    parser.add_argument("--out")
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    started = time.monotonic()
    with engine_logs_quiet():
        judges = run(args)
    print(tables(judges))
    proof = [n for n in PROOF_JUDGES if n in judges]
    if len(proof) == 2:
        low, high = (judges[n]["recommended_calls"] for n in proof)
        print(f"recommended calls grow with the noise: {low} -> {high}: {high >= low}")
    print(f"({time.monotonic() - started:.0f} s)")
    if args.out:
        record = {
            "benchmark": "calibration",
            "commit": git_commit(),
            "command": " ".join(["python", "benchmarks/calibration.py", *(argv or sys.argv[1:])]),
            "prompt": PROMPT,
            "judges": judges,
        }
        Path(args.out).write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
