"""benchmarks/eager_step.py's real-time mode (`--http`) still runs end to end: a fresh
`genrm-trio sim-judge --capacity` and `genrm-trio serve` per mode, one small step over HTTP.
Its figures are a benchmark's (docs/benchmarks.md, "Eager comparisons"); only what must hold
whatever the clock says is asserted here: every rollout got its reward from the judge calls the
plan asks for, and every mode reported a finite step."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from loading import run_benchmark


@pytest.mark.slow
def test_one_small_step_over_http_in_every_mode(tmp_path: Path) -> None:
    _, report = run_benchmark(
        "eager_step.py",
        "--http",
        *("--groups", "1", "--capacity", "2", "--latency", "0.05"),
        *("--median", "0.1", "--sigma", "0.1", "--clip", "0.05", "0.2", "--seeds", "1"),
        out=tmp_path / "step.json",
        timeout=120,
    )
    assert report["clock"] == "real (HTTP)"
    (cell,) = report["cells"]
    results = report["results"][cell["name"]]
    assert set(results) == {"eager-off", "eager-fifo", "eager-priority"}
    for mode, result in results.items():
        (step,) = result["steps"]
        assert step["judge_calls"] == 16, mode  # circular: 16 comparisons, no retries
        assert math.isfinite(step["tail_s"]) and step["tail_s"] > 0, mode
        assert step["last_reward_s"] >= step["last_arrival_s"], mode
