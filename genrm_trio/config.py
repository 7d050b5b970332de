"""Settings: every Gym `genrm_compare` key (SPEC §3) plus this project's own (§15, §16, §17).

One pydantic model validates everything at load time, so a bad value fails the start with one
line naming the file and key, never a traceback and never a failure deferred to the first cohort.
Files are YAML: flat keys, or a Gym config file whose `resources_servers.genrm_compare` block is
used (SPEC §17.1).
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, final
from urllib.parse import urlsplit

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

log = logging.getLogger("genrm_trio.config")

DEFAULT_PRINCIPLE = (
    "Please act as an impartial judge and evaluate the quality of the two responses provided by "
    "AI assistants to the conversation shown. Judge which response better follows the user's "
    "instructions and answers the user's question: consider helpfulness, correctness, relevance, "
    "depth, clarity and level of detail. Avoid any position bias: the order in which the "
    "responses were presented must not influence your decision, nor should their length or the "
    "names of the assistants. Be as objective as possible."
)

# The shipped `genrm_responses_create_params` (SPEC §3.2 shipped YAML values).
DEFAULT_JUDGE_CREATE_PARAMS: dict[str, Any] = {
    "input": [],
    "max_output_tokens": 16384,
    "temperature": 0.6,
    "top_p": 0.95,
}

# OpenAI Responses create-params keys accepted inside create params (SPEC §2.2).
RESPONSES_CREATE_PARAM_KEYS = frozenset(
    {
        "background", "context_management", "conversation", "include", "input", "instructions",
        "max_output_tokens", "max_tool_calls", "metadata", "model", "moderation",
        "parallel_tool_calls", "previous_response_id", "prompt", "prompt_cache_key",
        "prompt_cache_retention", "reasoning", "safety_identifier", "service_tier", "store",
        "stream", "stream_options", "temperature", "text", "tool_choice", "tools",
        "top_logprobs", "top_p", "truncation", "user",
    }
)  # fmt: skip

# Gym keys that mean nothing here: accepted, logged once, ignored (SPEC §17.1).
IGNORED_GYM_KEYS = frozenset(
    {"entrypoint", "domain", "name", "verified", "description", "value", "expose_tools_over_mcp"}
)

ONE_WORKER_MESSAGE = (
    "GenRM cohort verification requires one HTTP worker because group state is process-local"
)


class ConfigError(Exception):
    """A configuration problem, rendered as `{file}: {key}: {message}` (SPEC §17.7)."""

    def __init__(self, file: str, key: str, message: str) -> None:
        super().__init__(f"{file}: {key}: {message}")
        self.file = file
        self.key = key
        self.message = message


def _finite(name: str, value: float, *, positive: bool) -> float:
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite")
    if positive and value <= 0:
        raise ValueError(f"{name} must be > 0")
    return value


class _Strict(BaseModel):
    # strict: YAML `on`/`yes` or a quoted number must not pass as an int or float silently
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True, strict=True)


def _check_url(value: str) -> str:
    """One judge base URL, validated and with trailing `/` removed."""
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("must be an absolute http(s) URL")
    if parts.username is not None or parts.password is not None:
        raise ValueError("must not contain user information")
    # `?`/`#` alone leave query and fragment empty but would still corrupt the
    # concatenated request URL (`.../v1?/responses`).
    if parts.query or parts.fragment or "?" in value or "#" in value:
        raise ValueError("must not contain a query or fragment")
    try:
        parts.port  # noqa: B018 - urlsplit checks the port only when it is read
    except ValueError:
        raise ValueError("must have a numeric port in 0-65535") from None
    trimmed = value.rstrip("/")
    if not trimmed.endswith("/v1"):
        log.warning("judge.base_url %s does not end in /v1; posting under it as given", trimmed)
    return trimmed


def endpoint_of(url: str) -> str:
    """`host:port` of a judge base URL, for the judge-error template."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    host = parts.hostname or ""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


EJECT_MAX_FAILURES = 3
"""The largest `judge.eject_after_failures` accepted."""


@final
class JudgeSettings(_Strict):
    """How to reach the judge (SPEC §16.1), and, with a list of base URLs, a fleet of replicas."""

    base_url: str | list[str] | None = None
    api: Literal["responses", "chat_completions"] = "responses"
    model: str | None = None
    api_key_env: str | None = None
    max_concurrency: int = Field(default=256, ge=1)
    max_concurrency_per_replica: int | None = Field(default=None, ge=1)
    eject_after_failures: int = Field(default=EJECT_MAX_FAILURES, ge=1, le=EJECT_MAX_FAILURES)
    eject_backoff_s: float = 5.0
    keepalive_expiry_s: float = 4.0
    max_response_bytes: int = Field(default=32 * 1024 * 1024, ge=1024)
    ca_file: str | None = None

    @field_validator("base_url", mode="before")
    @classmethod
    def _check_base_url(cls, value: object) -> str | list[str] | None:
        if value is None:
            return None
        if isinstance(value, str):
            return _check_url(value)
        if not isinstance(value, list) or not value:
            raise ValueError("must be a URL or a non-empty list of URLs")
        urls: list[str] = []
        for index, item in enumerate(value):
            if not isinstance(item, str):
                raise ValueError(f"item {index}: must be a URL string")
            try:
                url = _check_url(item)
            except ValueError as exc:
                raise ValueError(f"item {index}: {exc}") from None
            if url in urls:
                raise ValueError(f"item {index}: {url} is listed twice")
            urls.append(url)
        return urls

    @field_validator("eject_backoff_s", "keepalive_expiry_s")
    @classmethod
    def _positive_seconds(cls, value: float) -> float:
        return _finite("value", value, positive=True)

    @field_validator("ca_file")
    @classmethod
    def _check_ca_file(cls, value: str | None) -> str | None:
        if value is not None and not os.path.isfile(value):
            raise ValueError(f"{value} is not a file")
        return value

    @property
    def base_urls(self) -> tuple[str, ...]:
        """Every configured base URL: one for a string, the replicas for a list."""
        if self.base_url is None:
            return ()
        if isinstance(self.base_url, str):
            return (self.base_url,)
        return tuple(self.base_url)

    @property
    def fleet(self) -> bool:
        """Whether `base_url` is a list (a fleet of replicas, even of one)."""
        return isinstance(self.base_url, list)

    @property
    def total_concurrency(self) -> int:
        """Judge calls in flight at once: `max_concurrency`, or the replicas' caps if lower."""
        cap = self.max_concurrency_per_replica
        if cap is None or not self.fleet:
            return self.max_concurrency
        return min(self.max_concurrency, cap * len(self.base_urls))

    @property
    def endpoint(self) -> str:
        """`host:port` for the judge-error template (comma-separated for a fleet)."""
        if self.base_url is None:
            return "unconfigured"
        return ",".join(endpoint_of(url) for url in self.base_urls)


@final
class ServerSettings(_Strict):
    """Service limits (SPEC §17.2)."""

    max_body_bytes: int = Field(default=64 * 1024 * 1024, ge=1)
    max_active_cohorts: int = Field(default=4096, ge=1)
    api_key_env: str | None = None
    shutdown_grace_s: float = 5.0

    @field_validator("shutdown_grace_s")
    @classmethod
    def _grace(cls, value: float) -> float:
        value = _finite("shutdown_grace_s", value, positive=False)
        if value < 0:
            raise ValueError("shutdown_grace_s must be >= 0")
        return value


@final
class Settings(_Strict):
    """Every key of SPEC §3.2, §15, §16 and §17 with its default and validation."""

    # bind address and the one-worker rule (§3.1, §17.1)
    host: str = "127.0.0.1"
    port: int = Field(default=8100, ge=0, le=65535)
    num_workers: int | None = None

    # Gym keys (§3.2)
    genrm_model_server: dict[str, Any] | None = None
    genrm_responses_create_params: dict[str, Any] = Field(
        default_factory=lambda: dict(DEFAULT_JUDGE_CREATE_PARAMS)
    )
    num_rollouts_per_prompt: int = Field(default=1, ge=1)
    cohort_collection_timeout_s: float = 1800.0
    cohort_evaluation_timeout_s: float = 1800.0
    judge_request_timeout_s: float = 1800.0
    cohort_result_ttl_s: float | None = 3600.0
    max_terminal_cohorts: int = Field(default=4096, ge=1)
    comparison_mode: Literal["rollout_cohort", "fixed_baseline"] = "rollout_cohort"
    comparison_strategy: Literal["all_pairs", "circular"] = "circular"
    num_judges_per_comparison: int = Field(default=1, ge=1)
    use_principle: bool = False
    default_principle: str = DEFAULT_PRINCIPLE
    aggregator_method: Literal["simple_tiebreaker"] = "simple_tiebreaker"
    score_source: Literal["overall", "rubric_mean"] = "overall"
    reasoning_bonus: float = 0.0
    answer_bonus: float = 0.0
    top_percentile: float = 0.2
    group_reasoning_length_penalty_coeff: float = 0.0
    group_answer_length_penalty_coeff: float = 0.0
    group_style_penalty_coeff: float = 0.0
    default_score: float = 3.0
    default_ranking: float = 3.5
    debug_logging: bool = False
    genrm_parse_retries: int = Field(default=3, ge=0)
    genrm_parse_retry_sleep_s: float = 0.2

    # decisions (§15)
    validate_verdict_range: bool = True
    position_balance: Literal["none", "alternate"] = "none"
    evaluation_deadline_policy: Literal["fail_group", "mask_pending"] = "fail_group"
    retry_backoff: Literal["constant", "exponential"] = "constant"

    # own features (§16, §17.2)
    state_path: str | None = None
    judge: JudgeSettings = Field(default_factory=JudgeSettings)
    server: ServerSettings = Field(default_factory=ServerSettings)

    @field_validator(
        "cohort_collection_timeout_s", "cohort_evaluation_timeout_s", "judge_request_timeout_s"
    )
    @classmethod
    def _deadline(cls, value: float) -> float:
        return _finite("deadline", value, positive=True)

    @field_validator("cohort_result_ttl_s")
    @classmethod
    def _ttl(cls, value: float | None) -> float | None:
        return None if value is None else _finite("ttl", value, positive=True)

    @field_validator("genrm_parse_retry_sleep_s")
    @classmethod
    def _sleep(cls, value: float) -> float:
        if not math.isfinite(value) or value < 0:
            raise ValueError("must be finite and >= 0")
        return value

    @field_validator("top_percentile")
    @classmethod
    def _top_percentile(cls, value: float) -> float:
        if not (0 < value <= 1):
            raise ValueError("must satisfy 0 < top_percentile <= 1")
        return value

    @field_validator(
        "reasoning_bonus",
        "answer_bonus",
        "group_reasoning_length_penalty_coeff",
        "group_answer_length_penalty_coeff",
        "group_style_penalty_coeff",
        "default_score",
        "default_ranking",
    )
    @classmethod
    def _finite_number(cls, value: float) -> float:
        return _finite("value", value, positive=False)

    @field_validator("genrm_model_server")
    @classmethod
    def _model_server(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is not None and value.get("type", "responses_api_models") != (
            "responses_api_models"
        ):
            raise ValueError("type must be 'responses_api_models'")
        return value

    @field_validator("genrm_responses_create_params")
    @classmethod
    def _create_params(cls, value: dict[str, Any]) -> dict[str, Any]:
        unknown = sorted(set(value) - RESPONSES_CREATE_PARAM_KEYS)
        if unknown:
            raise ValueError(f"unknown create-params key {unknown[0]!r}")
        if "input" not in value:
            raise ValueError("'input' is required (use [])")
        return value

    @model_validator(mode="after")
    def _one_worker(self) -> Settings:
        if self.cohorting and (self.num_workers or 1) > 1:
            raise ValueError(ONE_WORKER_MESSAGE)
        return self

    # --- derived values ---------------------------------------------------------------------

    @property
    def attempts(self) -> int:
        """A: attempts per comparison, one shared budget (SPEC §4.4)."""
        return max(1, int(self.genrm_parse_retries) + 1)

    @property
    def cohorting(self) -> bool:
        """Whether `/verify` groups requests into cohorts (SPEC §8)."""
        return self.num_rollouts_per_prompt > 1 or self.comparison_mode == "fixed_baseline"

    @property
    def judge_create_params(self) -> dict[str, Any]:
        """Create params for judge requests, with `judge.model` overriding `model` (§17.2)."""
        params = dict(self.genrm_responses_create_params)
        if self.judge.model is not None:
            params["model"] = self.judge.model
        return params

    def startup_warnings(self) -> list[str]:
        """The start-up warning lines of D12 and D37 (SPEC §17.10)."""
        lines: list[str] = []
        if self.judge_request_timeout_s >= self.cohort_evaluation_timeout_s:
            lines.append(
                f"judge_request_timeout_s ({self.judge_request_timeout_s}s) >= "
                f"cohort_evaluation_timeout_s ({self.cohort_evaluation_timeout_s}s): a hung judge "
                "call fails the whole group instead of masking one comparison"
            )
        lines.append(
            "masked rows carry a placeholder reward 0.0; the trainer must exclude them "
            "(NeMo RL: env.should_mask_flagged_samples: true and a masked-reward policy or "
            "mask_sample_rules that exclude failure_kind judge_failed)"
        )
        return lines


def read_secret(env_name: str, *, key: str, file: str = "environment") -> str:
    """The bearer token held by `env_name`; unset or empty is a start-up error naming it."""
    value = os.environ.get(env_name, "")
    if not value:
        raise ConfigError(file, key, f"environment variable {env_name} is unset or empty")
    return value


# --- loading ------------------------------------------------------------------------------------


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


def _gym_block(data: Mapping[str, Any], instance: str | None) -> Mapping[str, Any] | None:
    """The `resources_servers.genrm_compare` block of a Gym config, or None for a flat file."""
    blocks: list[tuple[str, Mapping[str, Any]]] = []
    for name, value in data.items():
        if isinstance(value, Mapping):
            servers = value.get("resources_servers")
            if isinstance(servers, Mapping) and isinstance(servers.get("genrm_compare"), Mapping):
                blocks.append((str(name), servers["genrm_compare"]))
    if not blocks:
        return None
    if instance is None:
        return blocks[0][1]
    for name, block in blocks:
        if name == instance:
            return block
    raise ConfigError("", "--instance", f"no genrm_compare instance named {instance!r}")


def settings_from_mapping(
    data: Mapping[str, Any],
    *,
    file: str = "<settings>",
    overrides: Mapping[str, Any] | None = None,
) -> Settings:
    """Validate a flat mapping plus dotted-path `overrides` into Settings, or raise ConfigError."""
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
    if "genrm_model_server" in flat:
        log.info("genrm_model_server is ignored: the judge is reached through judge.base_url")
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
        return Settings.model_validate(flat)
    except ValidationError as exc:
        error = exc.errors()[0]
        key = ".".join(str(part) for part in error["loc"]) or "settings"
        message = str(error["msg"]).removeprefix("Value error, ")
        if error["type"] == "extra_forbidden":
            message = "unknown key"
        if message == ONE_WORKER_MESSAGE:
            key = "num_workers"
        raise ConfigError(file, key, message) from None


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
    if block is None and instance is not None:
        raise ConfigError(file, "--instance", "not a Gym config file (no genrm_compare block)")
    return settings_from_mapping(
        block if block is not None else data, file=file, overrides=overrides
    )
