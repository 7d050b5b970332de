"""Configuration, read by every layer: the settings schema (`settings`), validation of a mapping
of keys (`mapping`), and where settings come from (`sources`: files, Gym config files, the
environment). The names below are the package's public face; docs/configuration.md is the
contract."""

from genrm_trio.config.mapping import settings_from_mapping
from genrm_trio.config.settings import (
    DEFAULT_BRADLEY_TERRY_PRIOR,
    DEFAULT_COMPARISONS_PER_ROLLOUT,
    DEFAULT_JUDGE_CREATE_PARAMS,
    DEFAULT_PRINCIPLE,
    EJECT_MAX_FAILURES,
    IGNORED_GYM_KEYS,
    KEEPALIVE_EXPIRY_S,
    MAX_RESPONSE_BYTES,
    ONE_WORKER_MESSAGE,
    RESPONSES_CREATE_PARAM_KEYS,
    AggregatorMethod,
    BudgetEscalation,
    ComparisonStrategy,
    ConfigError,
    JudgeApiName,
    JudgeSettings,
    MaskPolicy,
    PositionBalance,
    ServerSettings,
    Settings,
    endpoint_of,
)
from genrm_trio.config.sources import (
    GYM_BLOCK_NAMES,
    gym_instances,
    judge_from_gym,
    load_settings,
    read_secret,
    settings_from_gym,
)

__all__ = [
    "DEFAULT_BRADLEY_TERRY_PRIOR",
    "DEFAULT_COMPARISONS_PER_ROLLOUT",
    "DEFAULT_JUDGE_CREATE_PARAMS",
    "DEFAULT_PRINCIPLE",
    "EJECT_MAX_FAILURES",
    "GYM_BLOCK_NAMES",
    "IGNORED_GYM_KEYS",
    "KEEPALIVE_EXPIRY_S",
    "MAX_RESPONSE_BYTES",
    "ONE_WORKER_MESSAGE",
    "RESPONSES_CREATE_PARAM_KEYS",
    "AggregatorMethod",
    "BudgetEscalation",
    "ComparisonStrategy",
    "ConfigError",
    "JudgeApiName",
    "JudgeSettings",
    "MaskPolicy",
    "PositionBalance",
    "ServerSettings",
    "Settings",
    "endpoint_of",
    "gym_instances",
    "judge_from_gym",
    "load_settings",
    "read_secret",
    "settings_from_gym",
    "settings_from_mapping",
]
