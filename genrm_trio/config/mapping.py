"""From a mapping of keys (a flat file, a Gym block, flags as dotted overrides) to `Settings`,
with one-line errors that name the key and suggest the one meant (docs/configuration.md).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ValidationError

from genrm_trio.config.settings import (
    IGNORED_GYM_KEYS,
    ONE_WORKER_MESSAGE,
    ConfigError,
    KeyedError,
    Settings,
    did_you_mean,
)

log = logging.getLogger("genrm_trio.config")  # one logger name for every config module


def _find_interpolation(value: object, path: str) -> str | None:
    """The dotted path of the first string holding `${` (OmegaConf interpolation), if any."""
    if isinstance(value, str):
        return path if "${" in value else None
    if isinstance(value, Mapping):
        for k, v in value.items():
            found = _find_interpolation(v, f"{path}.{k}" if path else str(k))
            if found:
                return found
    if isinstance(value, list):
        for idx, v in enumerate(value):
            found = _find_interpolation(v, f"{path}[{idx}]")
            if found:
                return found
    return None


def _unknown_key_hint(loc: tuple[str, ...]) -> str:
    """` (did you mean 'num_rollouts_per_prompt'?)` for an unknown key close to a known one.

    Candidates are the keys of the block the unknown key is in (`judge.`, `server.` or the top
    level). At the top level a key of a nested block counts too (`max_concurency` suggests
    `judge.max_concurrency`) and a dotted key naming a nested one is told to nest instead; in a
    block, a top-level key is told so.
    """
    *parents, name = loc
    model: type[BaseModel] = Settings
    for parent in parents:
        annotation = model.model_fields[parent].annotation
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return ""
        model = annotation
    prefix = "".join(f"{parent}." for parent in parents)
    if parents and name in Settings.model_fields:
        return f" ({name!r} is a top-level key, not one inside {parents[-1]!r})"
    here = sorted(model.model_fields)
    if not parents:
        here = sorted({*here, *IGNORED_GYM_KEYS})
    suggestions = [prefix + key for key in did_you_mean(name, here)]
    if not parents:
        nested = _nested_keys()
        block, dot, leaf = name.partition(".")
        if dot and name in nested:
            return f" (write it nested: {leaf!r} inside a {block!r} block)"
        if not suggestions:
            leaves = sorted({key.partition(".")[2] for key in nested})
            for match in did_you_mean(name, leaves):
                suggestions = [key for key in nested if key.partition(".")[2] == match]
        if not suggestions:
            suggestions = did_you_mean(name, nested)
    if not suggestions:
        return ""
    return " (did you mean " + " or ".join(repr(key) for key in suggestions) + "?)"


def _nested_keys() -> list[str]:
    """`judge.base_url`, `server.max_body_bytes`, …: every key of a nested block."""
    keys: list[str] = []
    for block, field in Settings.model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            keys.extend(f"{block}.{key}" for key in annotation.model_fields)
    return sorted(keys)


def settings_from_mapping(
    data: Mapping[str, Any],
    *,
    file: str = "<settings>",
    overrides: Mapping[str, Any] | None = None,
    model_server_used: bool = False,
) -> Settings:
    """Validate a flat mapping plus dotted-path `overrides` into Settings, or raise ConfigError.

    `model_server_used`: the judge was found through `genrm_model_server` (`settings_from_gym`).
    """
    flat: dict[str, Any] = {}
    ignored: list[str] = []
    for key, value in data.items():
        if not isinstance(key, str):
            raise ConfigError(file, str(key), "keys must be strings")
        if key in IGNORED_GYM_KEYS:
            ignored.append(key)
            continue
        flat[key] = value
    if ignored:
        log.info("ignoring Gym-only config keys: %s", ", ".join(sorted(ignored)))
    found = _find_interpolation(flat, "")
    if found:
        raise ConfigError(file, found, "OmegaConf interpolation (${...}) is not supported")
    for dotted, value in (overrides or {}).items():
        target = flat
        *parents, leaf = dotted.split(".")
        for parent in parents:
            child = target.get(parent)
            child = dict(child) if isinstance(child, Mapping) else {}
            target[parent] = child
            target = child
        target[leaf] = value
    try:
        settings = Settings.model_validate(flat)
    except ValidationError as exc:
        error = exc.errors()[0]
        key = ".".join(str(part) for part in error["loc"]) or "settings"
        message = str(error["msg"]).removeprefix("Value error, ")
        cause = error.get("ctx", {}).get("error")
        if isinstance(cause, KeyedError):
            key, message = cause.key, str(cause)
        if error["type"] == "extra_forbidden":
            message = "unknown key" + _unknown_key_hint(tuple(str(part) for part in error["loc"]))
        if message == ONE_WORKER_MESSAGE:
            key = "num_workers"
        raise ConfigError(file, key, message) from None
    used = model_server_used or settings.genrm_model_server is None
    # Said only when a judge URL is known: without one the next line is serve's "needs a judge".
    if not used and settings.judge.base_url is not None:
        log.info("genrm_model_server is not used: the judge is reached through judge.base_url")
    return settings
