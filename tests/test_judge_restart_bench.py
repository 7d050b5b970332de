"""benchmarks/judge_restart.py still runs end to end, tiny: a real `genrm-trio sim-judge` (one,
then a fleet of two) behind a real `genrm-trio serve`, every judge killed with SIGKILL about 1 s
while 2 groups of 4 are judged, then restarted on the same port. Its figures are a benchmark's
(docs/benchmarks.md, "A judge restart"); asserted here is only what holds whatever the clock says:
every rollout got a reward and none is masked (the 300 s group deadline outlasts the outage),
the outage was seen (unreachable seconds on /metrics, the WARNING and INFO lines), every
/readyz answer other than 200 names the unreachable judge, and a restarted judge answered."""

from __future__ import annotations

from pathlib import Path

import pytest
from loading import run_benchmark


@pytest.mark.slow
def test_a_tiny_judge_restart_masks_nothing(tmp_path: Path) -> None:
    _, report = run_benchmark(
        "judge_restart.py",
        *("--replicas", "1", "2", "--groups", "2", "--size", "4"),
        # every call lasts 1 s and the kill comes 0.3 s after the first: calls in flight
        *("--latency-ms", "1000", "--jitter-ms", "0", "--kill-at-s", "0.3"),
        *("--down-s", "1", "--outage-probe-s", "0.5", "--readyz-every-s", "0.1"),
        *("--timeout-s", "60"),
        out=tmp_path / "restart.json",
        timeout=180,
    )
    assert [r["replicas"] for r in report["results"]] == [1, 2]
    for result in report["results"]:
        name = f"{result['replicas']} replica(s)"
        assert result["errors"] == [], name
        assert result["replied"] == result["rollouts"] == 8, name
        assert result["masked_rollouts"] == 0 and result["target_met"], name
        assert result["masked_rollouts_metric"] == 0.0, name
        assert result["in_flight_at_kill"] > 0, name
        assert result["unreachable_seconds_total"] > 0.0, name
        gone = [line for line in result["log_lines"] if "WARNING" in line]
        back = [line for line in result["log_lines"] if "INFO" in line]
        assert len(gone) == 1 and "judge unreachable: no replica can be reached" in gone[0], name
        assert len(back) == 1 and "judge is back after " in back[0], name
        assert result["readyz_reasons"] in (
            [],
            ["judge unreachable for Ns: no judge replica can be reached"],
        ), name
        assert result["calls_after_restart"] >= 1, name
        assert result["restart_to_first_judged_s"] is not None, name
        assert result["restart_to_first_judged_s"] >= result["restart_to_first_call_s"] >= 0, name
