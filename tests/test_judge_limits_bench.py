"""benchmarks/judge_limits.py still runs end to end, tiny: a real `genrm-trio sim-judge --rpm 60`
(a bucket of 60 calls, one more a second, 429 with `retry-after` beyond it) behind a real
`genrm-trio serve`, unconfigured and configured, and the verl stand-in beside them. Its figures
are a benchmark's (docs/benchmarks.md, "A judge with rate limits"); asserted here is what holds
whatever the clock says: every row got a reward and none is masked, the configured run drew no
429, and the peer made the same calls at its buckets' pace (run apart, small: it sends at the
refill rate from the first call, so any backlog past the minute's bucket takes it a minute)."""

from __future__ import annotations

from pathlib import Path

import pytest
from loading import run_benchmark


@pytest.mark.slow
def test_a_tiny_rate_limited_judge_masks_nothing(tmp_path: Path) -> None:
    stdout, report = run_benchmark(
        "judge_limits.py",
        *("--limits", "rpm=60", "--groups", "9", "--size", "8", "--modes", "unconfigured"),
        *("configured", "--latency-ms", "20", "--answer-chars", "200"),
        out=tmp_path / "limits.json",
        timeout=300,
    )
    results = {r["mode"]: r for r in report["results"]}
    assert list(results) == ["unconfigured", "configured"]
    for mode, result in results.items():
        assert result["errors"] == [] and result["rows_masked"] == 0, mode
        # and the start-up answer probe's one call (judge/answer_probe.py), before the groups
        assert result["calls_needed"] == 72 and result["served"] == 72 + 1, mode
        assert result["share_of_limit"] is not None and result["share_of_limit"] > 0.0, mode
    assert results["configured"]["rate_limited"] == 0
    assert "429s/100 calls" in stdout


@pytest.mark.slow
def test_the_verl_stand_in_makes_the_same_calls(tmp_path: Path) -> None:
    # at the refill rate from the first call (1 a second here): 8 calls, not a backlog
    _, report = run_benchmark(
        "judge_limits.py",
        *("--limits", "rpm=60", "--groups", "2", "--size", "4", "--modes", "verl"),
        *("--latency-ms", "20", "--answer-chars", "200"),
        out=tmp_path / "verl.json",
        timeout=120,
    )
    [peer] = report["results"]
    assert peer["mode"] == "verl"
    assert peer["served"] + peer["rate_limited"] == peer["calls_needed"] == 8
    assert peer["rows_masked"] == peer["rate_limited"] == 0
    assert peer["duration_s"] >= 7.0  # one call a second, none before its turn
