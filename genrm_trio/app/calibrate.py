"""`genrm-trio calibrate` (docs/operations.md, "Calibrating the judge"): judge every pair of a few
rollout groups in both orders through the engine and judge client `serve` uses, measure the
judge, simulate every schedule under the fitted judge and recommend the cheapest good one.

The judging runs through `open_engine` with the config's judge, fleet, limits and deadlines, as
`/compare` batches (all_pairs, J = 2, `position_balance: alternate`: N(N − 1) calls a group), and
without the durable store: it never touches a running server's state. Each measured group is
written to `--json` at once, so Ctrl-C (or a crash) keeps what was measured, and a second run with
the same `--json` adds groups. The figures are from `genrm_trio.domain.calibration`.
"""

from __future__ import annotations

import argparse
import json
import signal
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from genrm_trio.app.arguments import positive_int, say, write_atomically
from genrm_trio.config import ConfigError, Settings, load_settings
from genrm_trio.domain.calibration import (
    TOLERANCE,
    CalibrationInputError,
    FrontierPoint,
    GroupJudgments,
    JudgeFit,
    Measurement,
    RolloutGroup,
    ShownVerdict,
    fit_judge,
    group_from_compare_rows,
    measure,
    parse_rollout_groups,
    recommend,
    simulate_frontier,
    simulated_groups_for,
)
from genrm_trio.domain.model import CompareFailed, CompareInput, RequestRejected

if TYPE_CHECKING:
    from rich.console import Console

    from genrm_trio.judge.base import Judge

__all__ = [
    "Calibration",
    "add_calibrate_arguments",
    "judge_groups",
    "judge_with_progress",
    "load_calibration",
    "record_json",
    "reference",
    "run_calibrate_command",
    "write_record",
]

JSON_FORMAT: Final = "genrm-trio-calibration/1"
BALANCE: Final = "alternate"


def calibration_settings(settings: Settings) -> Settings:
    """The config with the measuring schedule: every pair in both orders."""
    return settings.model_copy(
        update={
            "comparison_strategy": "all_pairs",
            "num_judges_per_comparison": 2,
            "position_balance": BALANCE,
        }
    )


@dataclass
class Calibration:
    """What a run measured so far: loaded from `--json` and extended group by group."""

    size: int
    groups: list[GroupJudgments] = field(default_factory=list)
    calls_made: int = 0
    failed: list[str] = field(default_factory=list)  # "key: reason" of groups the judge failed

    def keys(self) -> set[str]:
        return {g.key for g in self.groups}


async def judge_groups(
    settings: Settings,
    judge: Judge,
    groups: Sequence[RolloutGroup],
    calibration: Calibration,
    *,
    on_group_done: Callable[[], None] = lambda: None,
) -> None:
    """Judge ``groups`` one after another through the engine (every pair in both orders),
    appending each to ``calibration`` as soon as it is judged (to ``calibration.failed`` when
    the judge failed it), then calling ``on_group_done``. Cancelling keeps the groups judged so
    far."""
    from genrm_trio.engine.engine import open_engine

    measuring = calibration_settings(settings)
    async with open_engine(measuring, judge) as engine:
        for group in groups:
            item = CompareInput(list(group.history), list(group.responses))
            try:
                result = await engine.compare(item)
            except CompareFailed as exc:
                calibration.failed.append(f"{group.key}: {exc}")
                on_group_done()
                continue
            rows = result.comparison_results or []
            judged = group_from_compare_rows(group.key, calibration.size, rows, BALANCE)
            calibration.groups.append(judged)
            calibration.calls_made += len(rows)
            on_group_done()


# --- the JSON file ------------------------------------------------------------------------------


def _groups_json(calibration: Calibration) -> list[dict[str, Any]]:
    return [
        {
            "key": g.key,
            "verdicts": [
                [v.first, v.second, v.score_first, v.score_second, v.ranking] for v in g.verdicts
            ],
        }
        for g in calibration.groups
    ]


def load_calibration(path: Path, size: int) -> Calibration:
    """A previous run's `--json` (to add groups to); CalibrationInputError when it is not one or
    was measured with another group size."""
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        if record.get("format") != JSON_FORMAT:
            raise CalibrationInputError(f"{path}: not a calibration file ({JSON_FORMAT})")
        stored = int(record["num_rollouts_per_prompt"])
        if stored != size:
            raise CalibrationInputError(
                f"{path}: measured with num_rollouts_per_prompt {stored}, the config has {size}"
            )
        groups = [
            GroupJudgments(
                str(g["key"]),
                size,
                tuple(
                    ShownVerdict(int(a), int(b), float(s1), float(s2), float(r))
                    for a, b, s1, s2, r in g["verdicts"]
                ),
            )
            for g in record["groups"]
        ]
        return Calibration(size, groups, int(record["calls_made"]))
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        if isinstance(exc, CalibrationInputError):
            raise
        raise CalibrationInputError(f"{path}: not a readable calibration file: {exc!r}") from None


def write_record(path: Path, record: dict[str, Any]) -> None:
    """``record`` (`record_json`) as the `--json` file, replaced whole."""
    write_atomically(path, (json.dumps(record, indent=1) + "\n").encode())


@dataclass(frozen=True)
class Figures:
    measurement: Measurement
    fit: JudgeFit
    frontier: list[FrontierPoint]
    recommended: FrontierPoint


def figures(calibration: Calibration, *, simulated_groups: int, seed: int, prior: float) -> Figures:
    """The measurements, the fit, the simulated frontier and the recommendation."""
    measurement = measure(calibration.groups)
    fit = fit_judge(calibration.groups, measurement)
    frontier = simulate_frontier(
        fit, calibration.size, groups=simulated_groups, seed=seed, prior=prior
    )
    return Figures(measurement, fit, frontier, recommend(frontier, calibration.size))


def reference(points: Sequence[FrontierPoint]) -> FrontierPoint:
    """all_pairs with one call per pair, the better aggregator: what a saving is against."""
    return max(
        (p for p in points if p.schedule.strategy == "all_pairs" and p.schedule.judges == 1),
        key=lambda p: p.tau,
    )


def saving_words(result: Figures, size: int) -> str:
    best = reference(result.frontier)
    chosen = result.recommended
    fewer = best.calls_per_group - chosen.calls_per_group
    if fewer <= 0:
        return (
            f"No saving: this judge needs all_pairs' {best.calls_per_group} calls per group of "
            f"{size} (estimated τ {chosen.tau:.3f})."
        )
    return (
        f"{chosen.schedule.name} makes {chosen.calls_per_group} judge calls per group of {size} "
        f"instead of all_pairs' {best.calls_per_group}: {fewer} fewer "
        f"({fewer / best.calls_per_group:.0%} of the judge bill), for an estimated τ of "
        f"{chosen.tau:.3f} against {best.tau:.3f}."
    )


def record_json(
    calibration: Calibration, result: Figures | None, *, simulated_groups: int, seed: int
) -> dict[str, Any]:
    record: dict[str, Any] = {
        "format": JSON_FORMAT,
        "num_rollouts_per_prompt": calibration.size,
        "calls_made": calibration.calls_made,
        "groups_measured": len(calibration.groups),
        "groups_failed": calibration.failed,
    }
    if result is not None:
        m = result.measurement
        record.update(
            {
                "position_bias": {
                    "first_win_share": m.first_win_share,
                    "first_win_excess": m.first_win_excess,
                    "mean_score_shift": m.mean_score_shift,
                },
                "order_consistency": m.order_consistency,
                "cycle_share": m.cycle_share,
                "judge_model": result.fit.as_json(),
                "simulated_groups": simulated_groups,
                "seed": seed,
                "tolerance": TOLERANCE,
                "frontier": [p.as_json() for p in result.frontier],
                "recommended": {
                    **result.recommended.as_json(),
                    "config_lines": result.recommended.schedule.config_lines(),
                    "saving": saving_words(result, calibration.size),
                },
            }
        )
    record["groups"] = _groups_json(calibration)
    return record


# --- output -------------------------------------------------------------------------------------


def print_report(console: Console, calibration: Calibration, result: Figures) -> None:
    from rich.table import Table  # here, not at the top: `genrm-trio --help` stays light

    m = result.measurement
    summary = Table(title="The judge", show_header=False)
    summary.add_row("groups measured", str(len(calibration.groups)))
    summary.add_row("judge calls made", str(calibration.calls_made))
    summary.add_row(
        "position bias",
        f"first answer wins {m.first_win_share:.1%} ({m.first_win_excess:+.1%} beyond 50 %); "
        f"mean score shift {m.mean_score_shift:+.3f}",
    )
    consistency = "—" if m.order_consistency is None else f"{m.order_consistency:.1%}"
    summary.add_row("order consistency", f"{consistency} of pairs agree in both orders")
    cycles = "—" if m.cycle_share is None else f"{m.cycle_share:.2%}"
    summary.add_row("cycle share", f"{cycles} of decided triangles are intransitive")
    fit = result.fit
    scores = (
        f"pointwise, score noise {fit.score_noise:.2f}"
        if fit.score_mode == "pointwise"
        else "follow the ranking"
    )
    summary.add_row(
        "fitted judge",
        f"noise {fit.noise:.2f}, bias {fit.bias:+.2f} (quality sd 1); scores {scores}",
    )
    console.print(summary)
    frontier = Table(title="Estimated Kendall τ against the answers' quality, per schedule")
    for column in ("schedule", "calls / group", "τ", "±", ""):
        frontier.add_column(column, justify="left" if column == "schedule" else "right")
    for point in sorted(result.frontier, key=lambda p: (p.calls_per_group, -p.tau)):
        frontier.add_row(
            point.schedule.name,
            str(point.calls_per_group),
            f"{point.tau:.3f}",
            f"{point.tau_se:.3f}",
            "◀ recommended" if point == result.recommended else "",
        )
    console.print(frontier)
    console.print(f"Recommended (cheapest within {TOLERANCE} τ of the best at all_pairs' budget):")
    for line in result.recommended.schedule.config_lines():
        console.print(f"  {line}", markup=False, highlight=False)
    console.print(saving_words(result, calibration.size))


def plot(result: Figures, size: int, path: Path) -> None:
    """τ against calls per group, per aggregator and number of passes, the recommendation
    marked (matplotlib: `_matplotlib_missing` checked it is installed)."""
    import matplotlib  # type: ignore[import-not-found, unused-ignore]

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # type: ignore[import-not-found, unused-ignore]

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    # one pass over each pair (circular is d = 2, all_pairs d = N − 1): one line per aggregator;
    # two passes (J = 2) as points beside it
    for aggregator, colour in (("bradley_terry", "tab:green"), ("simple_tiebreaker", "tab:blue")):
        for judges, line in ((1, "-"), (2, "none")):
            points = sorted(
                (
                    p
                    for p in result.frontier
                    if p.schedule.aggregator == aggregator and p.schedule.judges == judges
                ),
                key=lambda p: p.calls_per_group,
            )
            ax.plot(
                [p.calls_per_group for p in points],
                [p.tau for p in points],
                linestyle=line,
                marker="o" if judges == 1 else "x",
                markersize=3 if judges == 1 else 7,
                color=colour,
                label=f"{aggregator}, J = {judges}"
                + (" (circular, regular, all_pairs)" if judges == 1 else " (circular, all_pairs)"),
            )
    chosen = result.recommended
    ax.plot([chosen.calls_per_group], [chosen.tau], "k*", markersize=14, label="recommended")
    ax.set_xscale("log", base=2)
    ax.set_xlabel(f"judge calls per group of {size}")
    ax.set_ylabel("estimated Kendall τ")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _matplotlib_missing() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return True
    return False


# --- the command --------------------------------------------------------------------------------


def add_calibrate_arguments(parser: argparse.ArgumentParser) -> None:
    from genrm_trio.testing.judgment import JUDGMENT_PRESETS

    parser.add_argument("--config", type=Path, metavar="FILE", help="the config serve runs with")
    parser.add_argument(
        "--input",
        type=Path,
        required=True,
        metavar="FILE",
        help='rollouts JSONL: {"prompt": ..., "completions": [...]} per line, or /verify bodies',
    )
    parser.add_argument(
        "--groups", type=positive_int, default=16, metavar="N", help="groups to judge in this run"
    )
    parser.add_argument(
        "--json", type=Path, metavar="FILE", help="every figure; an existing file is added to"
    )
    parser.add_argument("--plot", type=Path, metavar="FILE", help="PNG of τ against calls")
    parser.add_argument(
        "--simulated-groups",
        type=positive_int,
        metavar="N",
        help="simulated groups per schedule (default: 400 at 16 rollouts, 400·16/N above, "
        "at least 50)",
    )
    parser.add_argument("--seed", type=int, default=0, metavar="N", help="of the simulation")
    parser.add_argument(
        "--judge",
        choices=["config", "sim"],
        default="config",
        help="sim: the simulated judge (to try the command; says nothing of a real judge)",
    )
    parser.add_argument(
        "--judgment",
        choices=list(JUDGMENT_PRESETS),
        metavar="NAME",
        help=f"--judge sim's noisy-judge family ({', '.join(JUDGMENT_PRESETS)})",
    )
    parser.add_argument("--judgment-noise", type=float, metavar="NUMBER")
    parser.add_argument("--judgment-bias", type=float, metavar="NUMBER")


def _judge(args: argparse.Namespace, settings: Settings) -> Judge:
    if args.judge == "sim":
        from genrm_trio.testing import SimConfig, SimJudge
        from genrm_trio.testing.flags import judgment_from_args

        model = judgment_from_args(
            args.judgment, noise=args.judgment_noise, bias=args.judgment_bias
        )
        return SimJudge(SimConfig(judgment=model, record_calls=False))
    from genrm_trio.judge.factory import make_judge

    if (
        args.judgment is not None
        or args.judgment_noise is not None
        or args.judgment_bias is not None
    ):
        raise CalibrationInputError("--judgment and its -noise and -bias need --judge sim")
    if settings.judge.base_url is None:
        raise ConfigError(
            str(args.config) if args.config else "<flags>",
            "judge.base_url",
            "calibrate needs a judge: set judge.base_url (and judge.api), or use --judge sim",
        )
    return make_judge(settings)


def run_calibrate_command(args: argparse.Namespace) -> int:
    """The command: 0 when figures were produced, 1 when the judge failed every group, 2 for
    bad input or config."""
    import trio
    from rich.console import Console

    if args.plot is not None and _matplotlib_missing():
        say("calibrate: --plot needs matplotlib (pip install matplotlib)")
        return 2
    try:
        settings = load_settings(args.config)
        size = settings.num_rollouts_per_prompt
        if size < 2:
            raise CalibrationInputError(
                f"num_rollouts_per_prompt is {size}: a group needs at least 2 rollouts to compare"
            )
        with args.input.open(encoding="utf-8") as lines:  # streamed: one line at a time
            groups = parse_rollout_groups(lines, size, str(args.input))
        calibration = (
            load_calibration(args.json, size)
            if args.json is not None and args.json.exists()
            else Calibration(size)
        )
        judge = _judge(args, settings)
    except ConfigError as exc:
        say(f"config error: {exc.file}: {exc.key}: {exc.message}")
        return 2
    except (CalibrationInputError, ValueError) as exc:
        say(f"calibrate: {exc}")
        return 2
    except OSError as exc:
        say(f"calibrate: {exc.filename}: {exc.strerror}")
        return 2
    console = Console()
    known = calibration.keys()
    todo = [g for g in groups if g.key not in known][: args.groups]
    per_group = size * (size - 1)
    if calibration.groups:
        console.print(
            f"{args.json}: {len(calibration.groups)} groups measured before "
            f"({calibration.calls_made} calls); adding {len(todo)}."
        )
    console.print(
        f"Judging {len(todo)} groups of {size}, every pair in both orders: "
        f"{per_group} calls a group, {per_group * len(todo)} judge calls in all."
    )
    simulated = args.simulated_groups or simulated_groups_for(size)
    seed = args.seed

    def save() -> None:
        if args.json is not None:
            record = record_json(calibration, None, simulated_groups=simulated, seed=seed)
            write_record(args.json, record)

    try:
        interrupted = trio.run(
            judge_with_progress, settings, judge, todo, calibration, save, console
        )
    except CalibrationInputError as exc:  # the engine refused the groups as the config stands
        say(f"calibrate: {exc}")
        return 2
    if interrupted:
        console.print(
            f"Stopped: kept the {len(calibration.groups)} groups measured "
            f"({calibration.calls_made} calls)."
        )
    for failure in calibration.failed:
        say(f"calibrate: group {failure}")
    if not calibration.groups:
        say("calibrate: no group was measured, so there is nothing to estimate from")
        return 1
    try:
        with console.status("simulating every schedule under the fitted judge"):
            result = figures(
                calibration,
                simulated_groups=simulated,
                seed=seed,
                prior=settings.bradley_terry_prior,
            )
    except ValueError as exc:  # nothing to fit (no pair judged in both orders)
        say(f"calibrate: {exc}")
        return 1
    print_report(console, calibration, result)
    if args.json is not None:
        record = record_json(calibration, result, simulated_groups=simulated, seed=seed)
        write_record(args.json, record)
        console.print(f"wrote {args.json}")
    if args.plot is not None:
        plot(result, size, args.plot)
        console.print(f"wrote {args.plot}")
    return 0


async def judge_with_progress(
    settings: Settings,
    judge: Judge,
    todo: Sequence[RolloutGroup],
    calibration: Calibration,
    save: Callable[[], None],
    console: Console,
) -> bool:
    """Judge ``todo`` under a progress bar; SIGINT stops it cleanly. True when stopped early."""
    import trio
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    size = calibration.size
    stopped = False
    columns = (
        TextColumn("judging"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("calls"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console, transient=False) as progress:
        task = progress.add_task("judging", total=size * (size - 1) * len(todo))

        def on_group_done() -> None:
            progress.advance(task, size * (size - 1))
            save()

        try:
            async with trio.open_nursery() as nursery:

                async def stop_on_sigint() -> None:
                    nonlocal stopped
                    with trio.open_signal_receiver(signal.SIGINT) as signals:
                        async for _ in signals:
                            stopped = True
                            nursery.cancel_scope.cancel()
                            return

                nursery.start_soon(stop_on_sigint)
                await judge_groups(settings, judge, todo, calibration, on_group_done=on_group_done)
                nursery.cancel_scope.cancel()
        except RequestRejected as exc:
            raise CalibrationInputError(str(exc)) from None
        finally:
            with trio.CancelScope(shield=True):
                await judge.aclose()
    return stopped
