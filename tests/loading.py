"""Scripts the tests exercise that are files, not modules of a package: the benchmarks and the
docs' examples."""

from __future__ import annotations

import importlib.util
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
