"""NeMo Gym launches genrm-trio: the resources-server directory and its launch contract.

`gym env start` starts every `<instance>.<server type>.<name>` block that has an `entrypoint` as
`python <entrypoint>` inside a `resources_servers/<name>/` directory that it finds under each
`--search-dir` (then the working directory, then its own install root), with the whole resolved
config in `NEMO_GYM_CONFIG_DICT` (every server's host and port filled in) and the instance's name
in `NEMO_GYM_CONFIG_PATH`. `genrm-trio gym-root` prints the directory holding genrm-trio's
`resources_servers/genrm_trio/`. Its `app.py` calls `genrm_trio.app.cli.gym_main()`, which serves
the instance's `genrm_trio` block (`settings_from_gym_env` here) on the host and port Gym
resolved for it (docs/operations.md, "NeMo Gym launches genrm-trio").
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import yaml

from genrm_trio.config import ConfigError, Settings, settings_from_gym

__all__ = ["BLOCK_NAME", "CONFIG_ENV", "INSTANCE_ENV", "gym_root", "settings_from_gym_env"]

CONFIG_ENV: Final = "NEMO_GYM_CONFIG_DICT"
INSTANCE_ENV: Final = "NEMO_GYM_CONFIG_PATH"
BLOCK_NAME: Final = "genrm_trio"
"""The `resources_servers` key of the block that Gym launches `resources_servers/genrm_trio/app.py`
for."""

_ROOT: Final = Path(__file__).parent / "gym_root"


def gym_root() -> Path:
    """The directory to pass to `gym env start --search-dir`."""
    return _ROOT.resolve()


def settings_from_gym_env(environ: Mapping[str, str]) -> Settings:
    """Settings of the instance Gym launched, from its two environment variables."""
    text = environ.get(CONFIG_ENV, "")
    instance = environ.get(INSTANCE_ENV, "")
    for name, value in ((CONFIG_ENV, text), (INSTANCE_ENV, instance)):
        if not value:
            raise ConfigError(
                "environment",
                name,
                "unset: app.py is started by NeMo Gym (gym env start --search-dir "
                '"$(genrm-trio gym-root)" ...); run genrm-trio serve to start it yourself',
            )
    file = f"{CONFIG_ENV}[{instance}]"
    try:
        data: Any = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(CONFIG_ENV, "yaml", f"invalid YAML: {exc}") from None
    if not isinstance(data, Mapping):
        raise ConfigError(CONFIG_ENV, "yaml", "the top level must be a mapping")
    entry = data.get(instance)
    servers = entry.get("resources_servers") if isinstance(entry, Mapping) else None
    block = servers.get(BLOCK_NAME) if isinstance(servers, Mapping) else None
    if not isinstance(block, Mapping):
        raise ConfigError(
            CONFIG_ENV,
            instance,
            f"has no resources_servers.{BLOCK_NAME} block (instances in the config: "
            f"{', '.join(repr(str(name)) for name in data) or 'none'})",
        )
    return settings_from_gym(data, block, file=file)
