"""`genrm-trio calibrate` end to end against the in-process simulated judge (genrm_trio/app/
calibrate.py; docs/operations.md, "Calibrating the judge"): the call count it announces and makes,
the JSON, resuming, stopping, and one-line errors."""

from __future__ import annotations

import io
import json
import signal
import sys
import types
from pathlib import Path

import pytest
import trio
from rich.console import Console

from genrm_trio import Settings
from genrm_trio.app.calibrate import (
    Calibration,
    figures,
    judge_groups,
    judge_with_progress,
    plot,
    record_json,
    write_record,
)
from genrm_trio.app.cli import main
from genrm_trio.domain.calibration import GroupJudgments, RolloutGroup, ShownVerdict
from genrm_trio.testing import SimConfig, SimJudge
from genrm_trio.testing.judgment import JUDGMENT_PRESETS

pytestmark = pytest.mark.usefixtures("restore_logging")

SIZE = 4
KEYS = {
    "recommended",
    "frontier",
    "position_bias",
    "order_consistency",
    "cycle_share",
    "calls_made",
}


def _rollouts(tmp_path: Path, groups: int, size: int = SIZE) -> Path:
    path = tmp_path / "rollouts.jsonl"
    lines = [
        json.dumps(
            {
                "prompt": f"Task {g}: which answer is right?",
                "completions": [f"answer {g}.{i}, worked through" for i in range(size)],
            }
        )
        for g in range(groups)
    ]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _config(tmp_path: Path, size: int = SIZE) -> Path:
    path = tmp_path / "genrm.yaml"
    path.write_text(f"num_rollouts_per_prompt: {size}\n", encoding="utf-8")
    return path


def _run(tmp_path: Path, *extra: str, groups: int = 2) -> int:
    return main(
        [
            "calibrate",
            "--config",
            str(_config(tmp_path)),
            "--input",
            str(tmp_path / "rollouts.jsonl"),
            "--judge",
            "sim",
            "--judgment",
            "comparative",
            "--simulated-groups",
            "20",
            "--groups",
            str(groups),
            *extra,
        ]
    )


def test_calibrate_end_to_end_writes_every_figure(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _rollouts(tmp_path, 5)
    out = tmp_path / "calibration.json"
    assert _run(tmp_path, "--json", str(out), groups=3) == 0
    printed = capsys.readouterr().out
    assert "Judging 3 groups of 4, every pair in both orders: 12 calls a group, 36 judge" in printed
    assert "comparison_strategy:" in printed
    assert "aggregator_method:" in printed
    record = json.loads(out.read_text(encoding="utf-8"))
    assert set(record) >= KEYS
    assert record["calls_made"] == 36
    assert record["groups_measured"] == 3
    assert [g["key"] for g in record["groups"]] == ["line 1", "line 2", "line 3"]
    assert all(len(g["verdicts"]) == 12 for g in record["groups"])
    # every pair of every group in both orders
    for group in record["groups"]:
        shown = sorted((a, b) for a, b, *_ in group["verdicts"])
        assert shown == sorted((a, b) for a in range(SIZE) for b in range(SIZE) if a != b)
    names = {p["name"] for p in record["frontier"]}
    assert "all_pairs J=2 bradley_terry" in names and "circular J=1 simple_tiebreaker" in names
    assert set(record["position_bias"]) == {
        "first_win_share",
        "first_win_excess",
        "mean_score_shift",
    }
    assert 0.0 <= record["order_consistency"] <= 1.0
    recommended = record["recommended"]
    assert recommended["config_lines"][0].startswith("comparison_strategy: ")
    best = max(
        p["kendall_tau"] for p in record["frontier"] if p["calls_per_group"] <= SIZE * 3 // 2
    )
    assert recommended["kendall_tau"] >= best - 0.02
    assert (
        "judge calls per group of 4" in recommended["saving"]
        or "No saving" in (recommended["saving"])
    )


def test_a_second_run_adds_groups_and_a_third_has_none_left(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _rollouts(tmp_path, 5)
    out = tmp_path / "calibration.json"
    assert _run(tmp_path, "--json", str(out), groups=3) == 0
    first = json.loads(out.read_text(encoding="utf-8"))
    capsys.readouterr()
    assert _run(tmp_path, "--json", str(out), groups=3) == 0
    printed = capsys.readouterr().out
    assert "3 groups measured before (36 calls); adding 2." in printed
    second = json.loads(out.read_text(encoding="utf-8"))
    assert second["calls_made"] == 60
    assert [g["key"] for g in second["groups"]] == [f"line {n}" for n in range(1, 6)]
    assert second["groups"][:3] == first["groups"]  # what was measured is kept as it was
    assert _run(tmp_path, "--json", str(out), groups=3) == 0
    assert "Judging 0 groups" in capsys.readouterr().out
    assert json.loads(out.read_text(encoding="utf-8"))["calls_made"] == 60


def _slow_judging() -> tuple[Settings, SimJudge, list[RolloutGroup]]:
    """Five groups of 4 and a judge whose calls take 1 s: a group's 12 calls run at once."""
    settings = Settings.model_validate(
        {"num_rollouts_per_prompt": SIZE, "judge": {"max_concurrency": 64}}
    )
    judge = SimJudge(SimConfig(latency_s=1.0, judgment=JUDGMENT_PRESETS["comparative"]))
    groups = [
        RolloutGroup(
            f"g{g}",
            ({"role": "user", "content": "Q?"},),
            tuple(
                {"output": [{"type": "message", "content": [{"type": "output_text", "text": t}]}]}
                for t in (f"a{g}.{i}" for i in range(SIZE))
            ),
        )
        for g in range(5)
    ]
    return settings, judge, groups


async def test_ctrl_c_stops_cleanly_and_the_json_keeps_what_was_measured(
    autojump_clock: trio.abc.Clock, tmp_path: Path
) -> None:
    settings, judge, groups = _slow_judging()
    calibration = Calibration(SIZE)
    out = tmp_path / "calibration.json"

    def save() -> None:
        write_record(out, record_json(calibration, None, simulated_groups=1, seed=0))

    async def ctrl_c() -> None:
        await trio.sleep(1.5)
        signal.raise_signal(signal.SIGINT)

    console = Console(file=io.StringIO())
    async with trio.open_nursery() as nursery:
        nursery.start_soon(ctrl_c)
        stopped = await judge_with_progress(settings, judge, groups, calibration, save, console)
    assert stopped
    assert trio.current_time() == 1.5  # the second group's calls were cancelled, not awaited
    assert judge.statistics().calls == 24
    record = json.loads(out.read_text(encoding="utf-8"))
    assert (record["groups_measured"], record["calls_made"]) == (1, 12)
    assert [g["key"] for g in record["groups"]] == ["g0"]


async def test_cancelling_keeps_the_groups_judged(autojump_clock: trio.abc.Clock) -> None:
    settings, judge, groups = _slow_judging()
    calibration = Calibration(SIZE)
    seen: list[float] = []
    with trio.move_on_after(2.5):
        await judge_groups(
            settings,
            judge,
            groups,
            calibration,
            on_group_done=lambda: seen.append(trio.current_time()),
        )
    # a group's 12 calls run at once for 1 s each: two groups by 2.5 s, the third cut off
    assert seen == [1.0, 2.0]
    assert [g.key for g in calibration.groups] == ["g0", "g1"]
    assert calibration.calls_made == 24
    assert judge.statistics().calls == 36
    assert trio.current_time() == 2.5


def test_bad_lines_are_one_line_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "rollouts.jsonl"
    path.write_text(
        json.dumps({"prompt": "Q", "completions": ["a", "b", "c", "d"]})
        + "\n"
        + json.dumps({"prompt": "Q", "completions": ["a", "b", "c"]})
        + "\n",
        encoding="utf-8",
    )
    assert _run(tmp_path) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"genrm-trio: calibrate: {path}:2: 3 completions; num_rollouts_per_prompt is 4"
    path.write_text('{"prompt": "Q", "completions": ["a", "b", "c", "d"]}\n\n{oops\n')
    assert _run(tmp_path) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"genrm-trio: calibrate: {path}:3: not JSON: ")
    assert "\n" not in err


def test_groups_of_one_cannot_be_calibrated(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "rollouts.jsonl").write_text('{"prompt": "Q", "completions": ["a"]}\n')
    config = tmp_path / "one.yaml"
    config.write_text("num_rollouts_per_prompt: 1\n")
    argv = ["calibrate", "--config", str(config), "--input", str(tmp_path / "rollouts.jsonl")]
    assert main([*argv, "--judge", "sim"]) == 2
    assert capsys.readouterr().err.strip() == (
        "genrm-trio: calibrate: num_rollouts_per_prompt is 1: a group needs at least 2 rollouts "
        "to compare"
    )


def test_a_json_of_another_group_size_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _rollouts(tmp_path, 2)
    out = tmp_path / "calibration.json"
    out.write_text(
        json.dumps(
            {
                "format": "genrm-trio-calibration/1",
                "num_rollouts_per_prompt": 8,
                "calls_made": 0,
                "groups": [],
            }
        )
    )
    assert _run(tmp_path, "--json", str(out)) == 2
    assert capsys.readouterr().err.strip() == (
        f"genrm-trio: calibrate: {out}: measured with num_rollouts_per_prompt 8, the config has 4"
    )


def test_without_a_judge_it_says_what_to_set(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _rollouts(tmp_path, 2)
    code = main(
        [
            "calibrate",
            "--config",
            str(_config(tmp_path)),
            "--input",
            str(tmp_path / "rollouts.jsonl"),
        ]
    )
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"genrm-trio: config error: {tmp_path / 'genrm.yaml'}: judge.base_url: ")
    assert "--judge sim" in err


def test_judgment_flags_need_the_simulated_judge(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _rollouts(tmp_path, 2)
    argv = [
        "calibrate",
        "--config",
        str(_config(tmp_path)),
        "--input",
        str(tmp_path / "rollouts.jsonl"),
    ]
    assert main([*argv, "--judgment", "comparative"]) == 2
    assert capsys.readouterr().err.strip() == (
        "genrm-trio: calibrate: --judgment and its -noise and -bias need --judge sim"
    )
    assert main([*argv, "--judge", "sim", "--judgment-noise", "1.6"]) == 2
    assert (
        capsys.readouterr().err.strip()
        == "genrm-trio: calibrate: --judgment-noise needs --judgment"
    )


def test_plot_without_matplotlib_is_refused_before_any_call(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib → ImportError
    _rollouts(tmp_path, 2)
    out = tmp_path / "calibration.json"
    assert _run(tmp_path, "--json", str(out), "--plot", str(tmp_path / "f.png")) == 2
    captured = capsys.readouterr()
    assert captured.err.strip() == (
        "genrm-trio: calibrate: --plot needs matplotlib (pip install matplotlib)"
    )
    assert not out.exists()


class _Axes:
    """matplotlib's Axes as far as `plot` uses it: records each line drawn."""

    def __init__(self) -> None:
        self.lines: list[tuple[list[float], list[float], dict[str, object]]] = []

    def plot(self, xs: list[float], ys: list[float], *args: object, **kwargs: object) -> None:
        self.lines.append((list(xs), list(ys), {"args": args, **kwargs}))

    def __getattr__(self, name: str) -> object:  # set_xscale, set_xlabel, grid, legend, ...
        return lambda *args, **kwargs: None


def test_plot_draws_each_aggregator_and_stars_the_recommendation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    axes, saved = _Axes(), []
    figure = types.SimpleNamespace(
        tight_layout=lambda: None, savefig=lambda p, dpi: saved.append(p)
    )
    pyplot = types.ModuleType("matplotlib.pyplot")
    pyplot.subplots = lambda figsize: (figure, axes)  # type: ignore[attr-defined]
    pyplot.close = lambda fig: None  # type: ignore[attr-defined]
    matplotlib = types.ModuleType("matplotlib")
    matplotlib.use = lambda backend: None  # type: ignore[attr-defined]
    matplotlib.pyplot = pyplot  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "matplotlib", matplotlib)
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", pyplot)
    # four answers of qualities 0 < 1 < 2 < 3, every pair in both orders, the better one winning
    verdicts = tuple(
        ShownVerdict(a, b, 4.0, 2.0, 2.0) if a > b else ShownVerdict(a, b, 2.0, 4.0, 5.0)
        for a in range(SIZE)
        for b in range(SIZE)
        if a != b
    )
    calibration = Calibration(SIZE, [GroupJudgments("g", SIZE, verdicts)], 12)
    result = figures(calibration, simulated_groups=10, seed=0, prior=0.1)
    plot(result, SIZE, tmp_path / "f.png")
    assert saved == [tmp_path / "f.png"]
    labels = [kwargs["label"] for _, _, kwargs in axes.lines]
    assert labels[-1] == "recommended"
    assert len(labels) == 5  # two aggregators × (one pass, two passes), and the star
    one_pass = [xs for xs, _, kwargs in axes.lines if "J = 1" in str(kwargs["label"])]
    assert all(xs == [4, 6] for xs in one_pass)  # circular (4 calls), all_pairs (6) at N = 4
    star_x, star_y, _ = axes.lines[-1]
    assert (star_x, star_y) == ([result.recommended.calls_per_group], [result.recommended.tau])
