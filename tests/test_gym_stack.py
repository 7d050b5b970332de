"""NeMo Gym 0.7.0 runs genrm-trio for real: `benchmarks/gym_stack.py`, which runs the GPU-free
trial of docs/operations.md block by block as written, as a test.

Runs only when `GENRM_TRIO_GYM_VENV` names a venv with NeMo Gym's `bin/gym` (the trial needs
Gym's Python 3.13 venv, ~1.4 GB; this suite does not install it). About 100 s with the venv.
tests/test_gym_trial_doc.py checks the page's blocks without Gym.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

GYM_VENV = os.environ.get("GENRM_TRIO_GYM_VENV", "")
SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "gym_stack.py"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not (GYM_VENV and (Path(GYM_VENV) / "bin" / "gym").exists()),
        reason="GENRM_TRIO_GYM_VENV does not name a venv with NeMo Gym (bin/gym)",
    ),
]


def test_gym_stack(tmp_path: Path) -> None:
    # The script bounds itself (--timeout-s) and stops what it started; the outer timeout
    # only guards against the script itself hanging.
    result = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--gym-venv",
            GYM_VENV,
            "--work-dir",
            str(tmp_path / "work"),
            "--timeout-s",
            "300",
        ],
        capture_output=True,
        text=True,
        timeout=420,
        check=False,
    )
    summary = result.stdout.partition("=== gym_stack summary ===")[2]
    assert result.returncode == 0, summary or result.stdout[-4000:] + result.stderr[-4000:]
    assert "ran the gym-trial blocks of" in summary
    assert "working judge: 32 rows, 0 masked; sidecar 0 rows" in summary
    # step 7: two comparisons of each group fail, three of its rollouts are masked
    assert "partial (variant 3): 26 rows, 0 masked; sidecar 6 rows {'judge_failed': 6}" in summary
    assert "sidecar 32 rows {'judge_failed': 32}" in summary
    # the script fails if Gym had to kill genrm-trio, or if it took the process group's SIGINT
    # and Gym's own for two stops; the time it took is in the summary
    assert "genrm-trio exit after the Ctrl-C:" in summary
    assert "exiting at once" not in summary
