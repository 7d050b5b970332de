"""No module in tests/ imports a test module: what tests share lives in helper modules (the
non-`test_` files of tests/, such as judges.py or comparator_rig.py), so that each test module
can be read, run and changed alone, and no test patches another module's globals."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

TESTS = Path(__file__).parent


def imported_test_modules(source: str) -> list[str]:
    """The test modules (`test_*`, `tests.test_*`) that `source` imports, by any import
    statement or by `importlib.import_module`/`__import__` with a literal name."""
    names: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            names.append(module)
            if node.level or module == "tests":  # `from . import test_x`, `from tests import ...`
                names += [alias.name for alias in node.names]
        elif (
            isinstance(node, ast.Call)
            and isinstance(func := node.func, ast.Attribute | ast.Name)
            and (func.attr if isinstance(func, ast.Attribute) else func.id)
            in ("import_module", "__import__")
            and node.args
            and isinstance(first := node.args[0], ast.Constant)
            and isinstance(first.value, str)
        ):
            names.append(first.value)
    return [name for name in names if name.removeprefix("tests.").split(".")[0].startswith("test_")]


@pytest.mark.parametrize(
    "source",
    [
        "import test_attempts",
        "import test_attempts as rig",
        "from test_http_app import call",
        "from tests.test_http_app import call",
        "from tests import test_http_app",
        "from . import test_http_app",
        "def f():\n    from test_sim_judge import client",
        "import importlib\nimportlib.import_module('test_sim_judge')",
    ],
)
def test_the_check_sees_every_way_of_importing_a_test_module(source: str) -> None:
    assert imported_test_modules(source)


def test_the_check_lets_helper_modules_through() -> None:
    source = "import judges\nfrom comparator_rig import Rig\nfrom genrm_trio import testing"
    assert imported_test_modules(source) == []


def test_no_module_in_tests_imports_a_test_module() -> None:
    modules = sorted(TESTS.glob("*.py"))
    assert len(modules) > 50  # the check reads the real tests/, not an empty folder
    offenders = {
        path.name: found
        for path in modules
        if (found := imported_test_modules(path.read_text(encoding="utf-8")))
    }
    assert offenders == {}
