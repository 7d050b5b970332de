"""N = 1 is never silent (issue #25 item 2): `num_rollouts_per_prompt` defaults to 1, as in Gym,
and then every `/verify` is answered at once with `default_score` and no judge call.

- the start-up warning that says so (settings, and `serve` logging it once);
- `serve --num-rollouts-per-prompt N`;
- `genrm-trio bench` failing in one line when groups of N > 1 were answered without judging.

Real sockets on 127.0.0.1 and the real clock where a server runs; every wait bounded.
"""

from __future__ import annotations

import logging
import os
import signal
from functools import partial
from pathlib import Path

import procs
import pytest
import trio

from genrm_trio.app import bench
from genrm_trio.app.bench import BenchConfig, BenchError, run_bench
from genrm_trio.app.cli import _serve_settings, build_parser, main
from genrm_trio.app.serve import serve
from genrm_trio.config import Settings, settings_from_mapping

N1_LINE = (
    "num_rollouts_per_prompt is 1: every /verify is answered at once with default_score (3.0) "
    "and no judge call; set num_rollouts_per_prompt (serve --num-rollouts-per-prompt N) to the "
    "rollouts per prompt the trainer sends (NeMo RL: grpo.num_generations_per_prompt; TRL: "
    "num_generations; verl: actor_rollout_ref.rollout.n; slime: --n-samples-per-prompt; e.g. "
    "num_rollouts_per_prompt: 16)"
)


def test_the_default_group_size_warns_and_says_what_happens() -> None:
    assert Settings().startup_warnings()[0] == N1_LINE
    assert Settings(default_score=2.5).startup_warnings()[0] == N1_LINE.replace("3.0", "2.5")


@pytest.mark.parametrize(
    "changes", [{"num_rollouts_per_prompt": 2}, {"num_rollouts_per_prompt": 16}]
)
def test_groups_of_two_or_more_do_not_warn(changes: dict[str, int]) -> None:
    assert not any("num_rollouts_per_prompt is" in line for line in load(changes))


def test_fixed_baseline_judges_singletons_and_does_not_warn() -> None:
    lines = load({"comparison_mode": "fixed_baseline"})
    assert not any("num_rollouts_per_prompt is" in line for line in lines)


def load(data: dict[str, object]) -> list[str]:
    return settings_from_mapping(data).startup_warnings()


async def test_serve_logs_the_warning_once_at_start(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="genrm_trio")
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            await nursery.start(partial(serve, settings_from_mapping({"port": 0}), sim=True))
            os.kill(os.getpid(), signal.SIGTERM)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert [r.getMessage() for r in warnings].count(N1_LINE) == 1
    lines = [r.getMessage() for r in caplog.records]
    assert lines.index(N1_LINE) < lines.index("received SIGTERM: shutting down")  # at start


def test_serve_takes_the_group_size_as_a_flag(tmp_path: Path) -> None:
    parse = build_parser().parse_args
    args = parse(["serve", "--judge", "sim", "--num-rollouts-per-prompt", "16"])
    assert _serve_settings(args).num_rollouts_per_prompt == 16
    config = tmp_path / "genrm.yaml"
    config.write_text("num_rollouts_per_prompt: 4\n")
    from_file = parse(["serve", "--judge", "sim", "--config", str(config)])
    assert _serve_settings(from_file).num_rollouts_per_prompt == 4
    flag_wins = parse(
        ["serve", "--judge", "sim", "--config", str(config), "--num-rollouts-per-prompt", "8"]
    )
    assert _serve_settings(flag_wins).num_rollouts_per_prompt == 8


@pytest.mark.parametrize(
    ("value", "message"), [("0", "must be >= 1, got 0"), ("many", "not an integer: 'many'")]
)
def test_a_bad_group_size_flag_is_a_usage_error_exit_2(
    value: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["serve", "--judge", "sim", "--num-rollouts-per-prompt", value]) == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: genrm-trio serve [-h]")
    assert err.splitlines()[-1] == (
        f"genrm-trio serve: error: argument --num-rollouts-per-prompt: {message}"
    )


# --- bench against a server that does not group -------------------------------------------------


async def test_bench_fails_when_groups_were_answered_without_judging() -> None:
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            port = await nursery.start(partial(serve, settings_from_mapping({"port": 0}), sim=True))
            cfg = BenchConfig(url=f"http://127.0.0.1:{port}", groups=3, concurrency=2, rollouts=4)
            with pytest.raises(BenchError) as caught:
                await run_bench(cfg)
            # groups of 1 are what such a server is for: no complaint
            report = await run_bench(BenchConfig(url=cfg.url, groups=3, rollouts=1))
            assert (report.groups, report.judge_calls_per_group) == (3, 0.0)
            os.kill(os.getpid(), signal.SIGTERM)
    assert str(caught.value) == bench.nothing_judged(3, 4)
    assert str(caught.value) == (
        "the server judged nothing: 3 groups of 4 /verify requests were answered with 0 judge "
        "calls; its num_rollouts_per_prompt is probably 1 (every /verify is answered at once "
        "with default_score): start it with --num-rollouts-per-prompt 4"
    )


def test_bench_command_exits_1_with_one_line_against_an_n1_server(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    server = procs.start_server(tmp_path, {})  # no num_rollouts_per_prompt: 1
    try:
        code = main(["bench", "--url", server.url, "--groups", "2", "--rollouts", "16"])
    finally:
        server.stop()
        server.close()
    captured = capsys.readouterr()
    assert code == 1
    assert captured.out == ""
    assert captured.err.splitlines()[-1] == (
        "genrm-trio: bench stopped: " + bench.nothing_judged(2, 16)
    )
    assert "num_rollouts_per_prompt is 1" in server.stderr_path.read_text()
