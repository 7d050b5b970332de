"""Where settings come from: a YAML file (flat keys, or a Gym config file whose
`resources_servers.genrm_trio` / `genrm_compare` block is used; docs/configuration.md, "File
shapes"), the judge of a Gym block's `genrm_model_server`, and secrets from the environment.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import yaml

from genrm_trio.config.mapping import settings_from_mapping
from genrm_trio.config.settings import (
    ConfigError,
    Settings,
)

log = logging.getLogger("genrm_trio.config")  # one logger name for every config module


_HEADER_SAFE: Final = re.compile(r"[\x21-\x7e]+")
"""What a bearer token may hold: visible ASCII. Whitespace, CR, LF, NUL and other control
characters cannot be sent in a header, and a non-ASCII character would be encoded differently
by a client and this server."""


def read_secret(env_name: str, *, key: str, file: str = "environment") -> str:
    """The bearer token held by `env_name`. Unset or empty, or holding anything but visible
    ASCII (a trailing newline from a file, say), is a start-up error naming the variable; the
    value is never shown, since an HTTP library's error would quote it in full."""
    value = os.environ.get(env_name, "")
    if not value:
        raise ConfigError(file, key, f"environment variable {env_name} is unset or empty")
    if not _HEADER_SAFE.fullmatch(value):
        raise ConfigError(
            file,
            key,
            f"environment variable {env_name} holds whitespace, a control character or a "
            "non-ASCII character, which an HTTP header cannot carry (a trailing newline from "
            'a file? `export NAME="$(cat file)"` drops it)',
        )
    return value


GYM_BLOCK_NAMES: Final = ("genrm_trio", "genrm_compare")
"""The `resources_servers` keys whose block configures this server in a Gym config file:
`genrm_trio` when Gym launches genrm-trio itself (docs/operations.md), `genrm_compare` for a
file written for Gym's own server."""


def gym_instances(data: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    """(instance name, block) of every genrm_trio / genrm_compare block of a Gym config."""
    found: list[tuple[str, Mapping[str, Any]]] = []
    for name, value in data.items():
        if not isinstance(value, Mapping):
            continue
        servers = value.get("resources_servers")
        if not isinstance(servers, Mapping):
            continue
        for block_name in GYM_BLOCK_NAMES:
            block = servers.get(block_name)
            if isinstance(block, Mapping):
                found.append((str(name), block))
                break
    return found


def _is_gym_file(data: Mapping[str, Any]) -> bool:
    """Whether a mapping looks like a Gym config (`<instance>: {<server type>: {<name>: …}}`)."""
    return any(
        isinstance(value, Mapping)
        and any(str(kind).endswith(("_servers", "_models", "_agents")) for kind in value)
        for value in data.values()
    )


def _named(names: list[str]) -> str:
    return ", ".join(repr(name) for name in names) if names else "none"


def _gym_block(data: Mapping[str, Any], instance: str | None) -> Mapping[str, Any] | None:
    """The genrm_trio / genrm_compare block of a Gym config file, or None for a flat file."""
    blocks = gym_instances(data)
    if instance is not None and not blocks and not _is_gym_file(data):
        return None  # a flat file: `load_settings` says that --instance does not apply
    if instance is not None:
        for name, block in blocks:
            if name == instance:
                return block
        raise ConfigError(
            "",
            "--instance",
            f"no genrm_trio or genrm_compare instance named {instance!r} "
            f"(instances found: {_named([name for name, _ in blocks])})",
        )
    if blocks:
        return blocks[0][1]
    if _is_gym_file(data):
        raise ConfigError(
            "",
            "file",
            "a Gym config file without a resources_servers.genrm_trio or .genrm_compare block "
            f"(instances in it: {_named([str(name) for name in data])})",
        )
    return None


def judge_from_gym(data: Mapping[str, Any], block: Mapping[str, Any]) -> dict[str, Any] | None:
    """The `judge` block that Gym's genrm_compare implies: its `genrm_model_server` reference
    followed through the (resolved) config to that model server's host and port, called with
    the Responses API at `/v1/responses` as Gym's server does.

    None when the block has its own `judge:` (it wins), no reference, or a reference to a server
    that has no host/port yet (an unresolved file: give `--judge-url`). A reference to a server
    the config does not define is a ConfigError naming it.
    """
    reference = block.get("genrm_model_server")
    if "judge" in block or not isinstance(reference, Mapping):
        return None
    kind = reference.get("type", "responses_api_models")
    name = reference.get("name")
    if not isinstance(name, str) or not name:
        raise ConfigError("", "genrm_model_server.name", "must name a Gym model server")
    instance = data.get(name)
    servers = instance.get(kind) if isinstance(instance, Mapping) else None
    if not isinstance(servers, Mapping) or not servers:
        raise ConfigError(
            "",
            "genrm_model_server",
            f"references {kind}/{name!r}, which the Gym config does not define "
            "(define that server, or give the judge in a judge: block)",
        )
    server = next(iter(servers.values()))
    host = server.get("host") if isinstance(server, Mapping) else None
    port = server.get("port") if isinstance(server, Mapping) else None
    if not host or not isinstance(port, int) or isinstance(port, bool) or port <= 0:
        return None
    shown = f"[{host}]" if ":" in str(host) else str(host)
    return {"base_url": f"http://{shown}:{port}/v1", "api": "genrm_model", "probe": False}


def load_settings(
    path: str | os.PathLike[str] | None,
    *,
    instance: str | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Settings:
    """Load a flat YAML file or a Gym config file; `overrides` are dotted keys from flags."""
    if path is None:
        return settings_from_mapping({}, file="<flags>", overrides=overrides)
    file = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(file, "file", f"cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ConfigError(file, "file", "not UTF-8 text") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark is not None else "yaml"
        raise ConfigError(file, where, f"invalid YAML: {getattr(exc, 'problem', exc)}") from None
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ConfigError(file, "file", "the top level must be a mapping")
    try:
        block = _gym_block(data, instance)
    except ConfigError as exc:
        raise ConfigError(file, exc.key, exc.message) from None
    if block is None:
        if instance is not None:
            raise ConfigError(
                file,
                "--instance",
                "this is not a Gym config file but a flat one (genrm-trio keys at the top "
                "level): --instance picks a block of a Gym config; drop it",
            )
        return settings_from_mapping(data, file=file, overrides=overrides)
    return settings_from_gym(data, block, file=file, overrides=overrides)


def settings_from_gym(
    data: Mapping[str, Any],
    block: Mapping[str, Any],
    *,
    file: str,
    overrides: Mapping[str, Any] | None = None,
) -> Settings:
    """Settings from one genrm block of a Gym config: its keys, and without a `judge:` key the
    judge that its `genrm_model_server` names (`judge_from_gym`), unless a flag gives one."""
    flat = dict(block)
    judge: dict[str, Any] | None = None
    if "judge.base_url" not in (overrides or {}):
        try:
            judge = judge_from_gym(data, block)
        except ConfigError as exc:
            raise ConfigError(file, exc.key, exc.message) from None
        if judge is not None:
            flat["judge"] = judge
            log.info(
                "judge: Gym model server %s at %s (Responses API)",
                block["genrm_model_server"]["name"],
                judge["base_url"],
            )
    return settings_from_mapping(
        flat, file=file, overrides=overrides, model_server_used=judge is not None
    )
