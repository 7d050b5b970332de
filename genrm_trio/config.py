"""Settings: every Gym `genrm_compare` key plus this project's own (docs/configuration.md, "Keys").

One pydantic model validates everything at load time, so a bad value fails the start with one
line naming the file and key, never a traceback and never a failure deferred to the first cohort.
Files are YAML: flat keys, or a Gym config file whose `resources_servers.genrm_trio` or
`resources_servers.genrm_compare` block is used (docs/configuration.md, "File shapes").
"""

from __future__ import annotations

import difflib
import logging
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final, Literal, final
from urllib.parse import urlsplit

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

log = logging.getLogger("genrm_trio.config")

# NeMo Gym's default principle, verbatim, so a judge sees the same prompt from either server
# (resources_servers/genrm_compare/app.py in NeMo Gym 0.7.0; Copyright (c) 2025 NVIDIA
# CORPORATION & AFFILIATES, Apache License 2.0, http://www.apache.org/licenses/LICENSE-2.0).
DEFAULT_PRINCIPLE = (
    "Please act as an impartial judge and evaluate the quality of the responses provided by two "
    "AI assistants to the user prompt. Begin your evaluation by generating your own answer to the "
    "prompt. You must provide your answer before judging any answers. When evaluating the "
    "assistants' answers, compare both assistants' answers with your answer. You must identify "
    "and correct any mistakes or inaccurate information. Then consider if the assistant's answers "
    "are helpful, relevant, and concise. Helpful means the answer correctly responds to the "
    "prompt or follows the instructions. Note when user prompt has any ambiguity or more than one "
    "interpretation, it is more helpful and appropriate to ask for clarifications or more "
    "information from the user than providing an answer based on assumptions. Relevant means all "
    "parts of the response closely connect or are appropriate to what is being asked. Concise "
    "means the response is clear and not verbose or excessive. Then consider the creativity and "
    "novelty of the assistant's answers when needed. Finally, identify any missing important "
    "information in the assistants' answers that would be beneficial to include when responding "
    "to the user prompt."
)

# The shipped `genrm_responses_create_params` (Gym's YAML; docs/configuration.md, "The judge").
DEFAULT_JUDGE_CREATE_PARAMS: dict[str, Any] = {
    "input": [],
    "max_output_tokens": 16384,
    "temperature": 0.6,
    "top_p": 0.95,
}

# OpenAI Responses create-params keys accepted inside create params (docs/http-api.md, "Request").
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

# Gym keys that mean nothing here: accepted, logged once, ignored (docs/configuration.md,
# "Accepted and ignored Gym keys").
IGNORED_GYM_KEYS = frozenset(
    {"entrypoint", "domain", "name", "verified", "description", "value", "expose_tools_over_mcp"}
)

ONE_WORKER_MESSAGE = (
    "GenRM cohort verification requires one HTTP worker because group state is process-local"
)


class ConfigError(Exception):
    """A configuration problem, rendered as `{file}: {key}: {message}` (docs/configuration.md)."""

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


class _KeyedError(ValueError):
    """A cross-field check of `Settings` that belongs to one dotted key, not to `settings`."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key


@final
class BudgetEscalation(_Strict):
    """`judge.budget_escalation`: after an attempt runs out of its output budget, the
    comparison's next attempt asks for `min(ceil(budget x factor), max_output_tokens)`."""

    factor: float = 2.0
    max_output_tokens: int = Field(default=32768, ge=1)

    @field_validator("factor")
    @classmethod
    def _factor(cls, value: float) -> float:
        if not (math.isfinite(value) and value > 1):
            raise ValueError("must be > 1 and finite")
        return value

    def next_budget(self, budget: int) -> int:
        """The budget after one escalation step from `budget` (never below `budget`)."""
        return max(budget, min(math.ceil(budget * self.factor), self.max_output_tokens))


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
    """How to reach the judge, and, with a list of base URLs, a fleet of replicas
    (docs/configuration.md, "The judge", "A judge fleet")."""

    base_url: str | list[str] | None = None
    api: Literal["responses", "chat_completions"] = "responses"
    model: str | None = None
    api_key_env: str | None = None
    max_concurrency: int = Field(default=256, ge=1)
    # Gym's model servers have no /models route and start beside this server: not probed.
    probe: bool = True
    budget_escalation: BudgetEscalation | None = None

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
    """Service limits (docs/configuration.md, "Service")."""

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
    """Every key of docs/configuration.md with its default and validation."""

    # bind address and the one-worker rule
    host: str = "127.0.0.1"
    port: int = Field(default=8100, ge=0, le=65535)
    num_workers: int | None = None

    # Gym keys
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

    # decisions (docs/differences.md)
    validate_verdict_range: bool = True
    position_balance: Literal["none", "alternate"] = "none"
    evaluation_deadline_policy: Literal["fail_group", "mask_pending"] = "fail_group"
    retry_backoff: Literal["constant", "exponential"] = "constant"

    # own features
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
            close = _did_you_mean(unknown[0], sorted(RESPONSES_CREATE_PARAM_KEYS))
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValueError(f"unknown create-params key {unknown[0]!r}{hint}")
        if "input" not in value:
            raise ValueError("'input' is required (use [])")
        return value

    @model_validator(mode="after")
    def _one_worker(self) -> Settings:
        if self.cohorting and (self.num_workers or 1) > 1:
            raise ValueError(ONE_WORKER_MESSAGE)
        return self

    @model_validator(mode="after")
    def _escalation_budget(self) -> Settings:
        escalation = self.judge.budget_escalation
        if escalation is None:
            return self
        budget = self.output_budget
        if budget is None:
            raise _KeyedError(
                "genrm_responses_create_params.max_output_tokens",
                "judge.budget_escalation needs a configured output budget (an integer >= 1)",
            )
        if escalation.max_output_tokens < budget:
            raise _KeyedError(
                "judge.budget_escalation.max_output_tokens",
                f"the cap must be >= genrm_responses_create_params.max_output_tokens ({budget})",
            )
        return self

    # --- derived values ---------------------------------------------------------------------

    @property
    def attempts(self) -> int:
        """A: attempts per comparison, one shared budget (docs/configuration.md, "Verdicts and
        retries")."""
        return max(1, int(self.genrm_parse_retries) + 1)

    @property
    def cohorting(self) -> bool:
        """Whether `/verify` groups requests into cohorts (docs/configuration.md, "Bind address and
        workers")."""
        return self.num_rollouts_per_prompt > 1 or self.comparison_mode == "fixed_baseline"

    @property
    def output_budget(self) -> int | None:
        """The configured `max_output_tokens` of every judge request, when it is an integer >= 1
        (the judge's own default applies otherwise, and nothing can escalate from it)."""
        value = self.genrm_responses_create_params.get("max_output_tokens")
        if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
            return value
        return None

    @property
    def judge_create_params(self) -> dict[str, Any]:
        """Create params for judge requests, with `judge.model` overriding `model`."""
        params = dict(self.genrm_responses_create_params)
        if self.judge.model is not None:
            params["model"] = self.judge.model
        return params

    def startup_warnings(self) -> list[str]:
        """The start-up warning lines of D12 and D37 (docs/configuration.md, "Start-up
        warnings")."""
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
    return {"base_url": f"http://{shown}:{port}/v1", "api": "responses", "probe": False}


def _did_you_mean(word: str, candidates: Sequence[str]) -> list[str]:
    """The one candidate close to `word` (difflib ratio >= 0.75), else the one it begins."""
    close = difflib.get_close_matches(word, candidates, n=1, cutoff=0.75)
    if close:
        return close
    started = [candidate for candidate in candidates if candidate.startswith(word)]
    return started if len(word) >= 4 and len(started) == 1 else []


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
    suggestions = [prefix + key for key in _did_you_mean(name, here)]
    if not parents:
        nested = _nested_keys()
        block, dot, leaf = name.partition(".")
        if dot and name in nested:
            return f" (write it nested: {leaf!r} inside a {block!r} block)"
        if not suggestions:
            leaves = sorted({key.partition(".")[2] for key in nested})
            for match in _did_you_mean(name, leaves):
                suggestions = [key for key in nested if key.partition(".")[2] == match]
        if not suggestions:
            suggestions = _did_you_mean(name, nested)
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
    if "genrm_model_server" in flat and not model_server_used:
        log.info("genrm_model_server is not used: the judge is reached through judge.base_url")
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
        cause = error.get("ctx", {}).get("error")
        if isinstance(cause, _KeyedError):
            key, message = cause.key, str(cause)
        if error["type"] == "extra_forbidden":
            message = "unknown key" + _unknown_key_hint(tuple(str(part) for part in error["loc"]))
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
    if block is None:
        if instance is not None:
            raise ConfigError(
                file, "--instance", "not a Gym config file (no genrm_trio or genrm_compare block)"
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
