"""benchmarks/judge_limits.py still runs end to end, tiny: a real `genrm-trio sim-judge --rpm 60`
(a bucket of 60 calls, one more a second, 429 with `retry-after` beyond it) behind a real
`genrm-trio serve`, unconfigured and configured, and the verl stand-in beside them. Its figures
are a benchmark's (docs/benchmarks.md, "A judge with rate limits"); asserted here is what holds
whatever the clock says: every row got a reward and none is masked, the configured run drew no
429, and the peer made the same number of calls, each 429 a row lost."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from loading import run_benchmark


@pytest.mark.slow
def test_a_tiny_rate_limited_judge_masks_nothing(tmp_path: Path) -> None:
    out = tmp_path / "limits.json"
    done = run_benchmark(
        "judge_limits.py",
        *("--limits", "rpm=60", "--groups", "9", "--size", "8"),
        *("--latency-ms", "20", "--answer-chars", "200", "--out", str(out)),
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(out.read_text())
    results = {r["mode"]: r for r in report["results"]}
    assert list(results) == ["unconfigured", "configured", "verl"]
    for mode in ("unconfigured", "configured"):
        result = results[mode]
        assert result["errors"] == [] and result["rows_masked"] == 0, mode
        assert result["served"] == result["calls_needed"] == 72, mode
        assert result["share_of_limit"] is not None and result["share_of_limit"] > 0.0, mode
    assert results["configured"]["rate_limited"] == 0
    peer = results["verl"]
    assert peer["served"] + peer["rate_limited"] == peer["calls_needed"] == 72
    assert peer["rows_masked"] == peer["rate_limited"]
    assert "429s/100 calls" in done.stdout
