"""benchmarks/security_bombs.py still runs end to end, tiny (`--scale 0.01`): every bomb against a
real `genrm-trio serve`, then the hostile judges. Its figures are a benchmark's
(docs/reliability.md, "Security"); asserted here is only what holds whatever the clock says: it
exits 0 with bounds no machine misses, prints a row per bomb, and a judge reply of more values
than `MAX_REPLY_VALUES` fails its comparison (the review's 30 MiB of `[[],…]`, scaled to
100,000 lists: 200,000 values)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from loading import ROOT


@pytest.mark.slow
def test_the_security_bombs_run_tiny() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "security_bombs.py"), "--scale", "0.01",
         "--max-health-ms", "1e9", "--max-rss-mb", "1e9"],
        cwd=ROOT, capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    rows = done.stdout.splitlines()[1:]
    assert len(rows) == 12, done.stdout
    assert rows[0].startswith("(none: /health alone for 2 s)")
    assert rows[-1].startswith("judge replies of 30 MiB of [[],…] (x2)")
    assert rows[-1].split()[-4] == "503"  # status, seconds, /health ms, RSS MB
