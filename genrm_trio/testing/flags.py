"""The `sim-judge` command's flag values as simulator objects: a `--fault` spec as a
`FaultRule`, the flags together as a `SimConfig`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

from genrm_trio.testing.core import SimConfig
from genrm_trio.testing.faults import FAULT_KINDS, FaultKind, FaultRule
from genrm_trio.testing.judgment import JUDGMENT_PRESETS, JudgmentModel
from genrm_trio.testing.ratelimit import SimRateLimits
from genrm_trio.testing.verdicts import LENGTH_PRESETS

__all__ = ["judgment_from_args", "parse_fault_rule", "sim_config_from_args"]


def parse_fault_rule(spec: str) -> FaultRule:
    """Parse `KIND[,key=value...]` into a FaultRule (the `--fault` flag of `sim-judge`).

    Keys: match, position, times, status, retry_after, body, delay (seconds), chars. Example:
    `http_500,match=[fail],position=first,times=1`. Values cannot contain commas.
    Raises ValueError with a readable message.
    """
    kind, *pairs = spec.split(",")
    kind = kind.strip()
    if kind not in FAULT_KINDS:
        raise ValueError(f"unknown fault {kind!r}; expected one of {', '.join(FAULT_KINDS)}")
    fields: dict[str, Any] = {}
    names = {
        "match": ("match", str),
        "position": ("position", str),
        "times": ("times", int),
        "status": ("status", int),
        "retry_after": ("retry_after_s", float),
        "body": ("body", str),
        "delay": ("delay_s", float),
        "chars": ("huge_chars", int),
    }
    for pair in pairs:
        key, sep, value = pair.partition("=")
        key = key.strip()
        if not sep or key not in names:
            raise ValueError(f"bad fault option {pair!r}; expected one of {', '.join(names)}=…")
        name, convert = names[key]
        try:
            fields[name] = convert(value)
        except ValueError as error:
            raise ValueError(f"bad value for {key}: {value!r}") from error
    return FaultRule(fault=cast(FaultKind, kind), **fields)


def judgment_from_args(
    family: str | None,
    *,
    noise: float | None = None,
    bias: float | None = None,
    beta: float | None = None,
) -> JudgmentModel | None:
    """The `--judgment` family's preset with the `--judgment-noise/-bias/-beta` overrides; None
    without a family. ValueError for an unknown family or an override without one."""
    given = [n for n, v in (("noise", noise), ("bias", bias), ("beta", beta)) if v is not None]
    if family is None:
        if given:
            raise ValueError(f"--judgment-{given[0]} needs --judgment")
        return None
    preset = JUDGMENT_PRESETS.get(family)
    if preset is None:
        raise ValueError(
            f"unknown judgment family {family!r}; expected one of {', '.join(JUDGMENT_PRESETS)}"
        )
    return JudgmentModel(
        preset.family,
        noise=preset.noise if noise is None else noise,
        bias=preset.bias if bias is None else bias,
        beta=preset.beta if beta is None else beta,
    )


def sim_config_from_args(
    *,
    latency_ms: float = 0.0,
    jitter_ms: float = 0.0,
    seed: int = 0,
    fault_rate: float = 0.0,
    fault_kind: str = "http_500",
    faults: Sequence[str] = (),
    api_key: str | None = None,
    record_calls: bool = False,
    sticky_faults: bool = False,
    length_model: str | None = None,
    capacity: int | None = None,
    judgment: JudgmentModel | None = None,
    rate_limits: SimRateLimits | None = None,
    context_tokens: int | None = None,
) -> SimConfig:
    """Build a SimConfig from `sim-judge` flags (milliseconds, `--fault` specs). ValueError if bad.

    `record_calls` defaults to False here: a long-running server should not keep every call.
    """
    if fault_kind not in FAULT_KINDS:
        raise ValueError(
            f"unknown fault kind {fault_kind!r}; expected one of {', '.join(FAULT_KINDS)}"
        )
    if length_model is not None and length_model not in LENGTH_PRESETS:
        raise ValueError(
            f"unknown length model {length_model!r}; expected one of {', '.join(LENGTH_PRESETS)}"
        )
    return SimConfig(
        latency_s=latency_ms / 1000.0,
        jitter_s=jitter_ms / 1000.0,
        seed=seed,
        fault_rate=fault_rate,
        fault_kind=cast(FaultKind, fault_kind),
        rules=tuple(parse_fault_rule(spec) for spec in faults),
        api_key=api_key,
        record_calls=record_calls,
        sticky_faults=sticky_faults,
        length_model=None if length_model is None else LENGTH_PRESETS[length_model],
        capacity=capacity,
        judgment=judgment,
        rate_limits=rate_limits,
        context_tokens=context_tokens,
    )
