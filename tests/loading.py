"""Scripts the tests exercise that are files, not modules of a package: the benchmarks and the
docs' examples, loaded as modules or run in a process of their own."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def load_script(relative: str, name: str) -> ModuleType:
    """Run the script at `relative` (to the checkout) as a module called `name`."""
    spec = importlib.util.spec_from_file_location(name, ROOT / relative)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses resolve their annotations through it while built
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[name]
    return module


def run_benchmark(script: str, *args: str, out: Path, timeout: float) -> tuple[str, Any]:
    """Run `benchmarks/{script}` with `args` and `--out out` in a process of its own, from the
    checkout (bounded by `timeout` seconds); assert it exited 0 (the message its stderr's tail)
    and return its stdout and the JSON report it wrote to `out`."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), *args, "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout, json.loads(out.read_text())
