"""docs/configuration.md documents every Settings key, and only real ones.

The key tables share one header (`| Key | Type | Default | Validation | Meaning | Source |`);
each row's Key cell holds exactly one backticked dotted key. Adding a field to Settings (or to
JudgeSettings / ServerSettings) without a row here fails this test.
"""

from __future__ import annotations

import re
import typing
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel
from settings_keys import literal_keys

from genrm_trio.config import IGNORED_GYM_KEYS, Settings

DOC = Path(__file__).resolve().parent.parent / "docs" / "configuration.md"
HEADER = ["Key", "Type", "Default", "Validation", "Meaning", "Source"]
KEY_CELL = re.compile(r"^`([a-z][a-z0-9_]*(?:\.[a-z][a-z0-9_]*)*)`$")


def _optional_model(annotation: Any) -> type[BaseModel] | None:
    """`M` of an `M | None` annotation whose M is a model (an optional block), else None."""
    args = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
    if len(args) == 1 and isinstance(args[0], type) and issubclass(args[0], BaseModel):
        return args[0]
    return None


def model_keys(model: type[BaseModel], prefix: str = "") -> dict[str, Any]:
    """Every dotted key of `model` with its default; nested models are walked, not listed. An
    optional block (`M | None`) is listed itself (default null) and walked for its own keys."""
    keys: dict[str, Any] = {}
    for name, field in model.model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            keys |= model_keys(annotation, f"{prefix}{name}.")
            continue
        keys[f"{prefix}{name}"] = field.get_default(call_default_factory=True)
        block = _optional_model(annotation)
        if block is not None:
            keys |= model_keys(block, f"{prefix}{name}.")
    return keys


SETTINGS_KEYS = model_keys(Settings)


def split_row(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def key_rows() -> list[dict[str, str]]:
    """The rows of every table whose header is HEADER, as {column: cell}."""
    rows: list[dict[str, str]] = []
    lines = DOC.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        if lines[i].startswith("|") and split_row(lines[i]) == HEADER:
            i += 2  # header and separator
            while i < len(lines) and lines[i].startswith("|"):
                cells = split_row(lines[i])
                assert len(cells) == len(HEADER), f"malformed key-table row: {lines[i]!r}"
                rows.append(dict(zip(HEADER, cells, strict=True)))
                i += 1
        else:
            i += 1
    return rows


def documented() -> dict[str, dict[str, str]]:
    table: dict[str, dict[str, str]] = {}
    for row in key_rows():
        match = KEY_CELL.match(row["Key"])
        assert match, f"Key cell must be one backticked key: {row['Key']!r}"
        key = match.group(1)
        assert key not in table, f"{key} is documented twice"
        table[key] = row
    return table


def yaml_text(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def test_settings_keys_include_nested_blocks() -> None:
    assert "judge.base_url" in SETTINGS_KEYS
    assert "server.shutdown_grace_s" in SETTINGS_KEYS
    assert "judge" not in SETTINGS_KEYS
    assert SETTINGS_KEYS["judge.budget_escalation"] is None  # an optional block, listed
    assert SETTINGS_KEYS["judge.budget_escalation.factor"] == 2.0  # and walked
    assert "server" not in SETTINGS_KEYS


@pytest.mark.parametrize("key", sorted(SETTINGS_KEYS))
def test_every_settings_key_is_documented(key: str) -> None:
    assert key in documented(), f"{key} has no row in {DOC.name}"


@pytest.mark.parametrize("key", sorted(IGNORED_GYM_KEYS))
def test_ignored_gym_keys_are_documented(key: str) -> None:
    assert key in documented()


def test_no_stale_keys_documented() -> None:
    stale = set(documented()) - set(SETTINGS_KEYS) - IGNORED_GYM_KEYS
    assert not stale, f"documented but not Settings keys: {sorted(stale)}"


@pytest.mark.parametrize(
    "key",
    sorted(
        k
        for k, v in SETTINGS_KEYS.items()
        if (v is None or isinstance(v, bool | int | float | str)) and k != "default_principle"
    ),
)
def test_documented_scalar_defaults_match(key: str) -> None:
    default = documented()[key]["Default"]
    assert f"`{yaml_text(SETTINGS_KEYS[key])}`" in default, (
        f"{key}: default is {SETTINGS_KEYS[key]!r}, docs say {default!r}"
    )


@pytest.mark.parametrize("key", sorted(SETTINGS_KEYS))
def test_every_row_is_filled(key: str) -> None:
    row = documented()[key]
    for column in ("Type", "Default", "Meaning", "Source"):
        assert row[column], f"{key}: empty {column}"


@pytest.mark.parametrize(("key", "values"), sorted(literal_keys(Settings).items()))
def test_every_choice_of_a_literal_key_is_documented(key: str, values: tuple[str, ...]) -> None:
    """A key with a closed set of values lists each of them (backticked) in its Type cell: a new
    value of a `Literal` (a comparison strategy, a judge API) fails here until it is documented.
    """
    written = set(re.findall(r"`([^`]+)`", documented()[key]["Type"]))
    assert set(values) <= written, f"{key}: {sorted(set(values) - written)} not in its Type cell"


def test_startup_warning_texts_are_documented() -> None:
    text = DOC.read_text(encoding="utf-8")
    d12, d37 = Settings(num_rollouts_per_prompt=16).startup_warnings()
    assert d37 in text
    template = (
        d12.replace("1800.0", "{a}", 1)
        .replace("1800.0", "{b}", 1)
        .replace("timeout_s: 300 (its 4 attempts", "timeout_s: {b / (A + 2)} (its {A} attempts")
    )
    assert template in text
    n1, _ = Settings().startup_warnings()  # N = 1: no judging, so no deadline line
    assert n1.replace("(3.0)", "({default_score})") in text


@pytest.mark.parametrize(
    "flag",
    [
        "--config",
        "--instance",
        "--host",
        "--port",
        "--judge-url",
        "--judge-api",
        "--judge sim",
        "--state",
        "--num-rollouts-per-prompt",
    ],
)
def test_serve_flags_are_documented(flag: str) -> None:
    assert f"`{flag}" in DOC.read_text(encoding="utf-8")
