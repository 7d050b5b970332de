"""Scripts the tests exercise that are files, not modules of a package: the benchmarks and the
docs' examples, loaded as modules or run in a process of their own."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

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


def run_benchmark(script: str, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """Run `benchmarks/{script}` with `args` in a process of its own, from the checkout, its
    output captured as text (bounded by `timeout` seconds; its exit code is the caller's to
    check)."""
    return subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
