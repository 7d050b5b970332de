"""The settings schema: every Gym `genrm_compare` key plus this project's own, each with its
default and its check (docs/configuration.md, "Keys").

One pydantic model validates everything at load time, so a bad value fails the start with one
line naming the file and key, never a traceback and never a failure deferred to the first cohort.
Where settings come from (files, Gym config files, flags) is `genrm_trio.config.sources`.
"""

from __future__ import annotations

import difflib
import logging
import math
import os
from collections.abc import Sequence
from typing import Any, Final, Literal, final
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

log = logging.getLogger("genrm_trio.config")  # one logger name for every config module


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

# The vocabularies of the scoring keys, one source each: the settings fields below use them, and
# genrm_trio.domain.scoring reads them (pair plans check their strategy and balance against these;
# tests/test_scoring_graph.py checks the aggregation table against `AggregatorMethod`).
ComparisonStrategy = Literal["all_pairs", "circular", "regular"]
PositionBalance = Literal["none", "alternate"]
AggregatorMethod = Literal["simple_tiebreaker", "bradley_terry"]
MaskPolicy = Literal["pair", "component"]

DEFAULT_BRADLEY_TERRY_PRIOR = 0.1
"""λ of `bradley_terry_prior` (docs/scoring.md, "Bradley–Terry")."""

DEFAULT_COMPARISONS_PER_ROLLOUT = 4
"""d of `comparison_strategy: regular` (docs/scoring.md, "The regular graph")."""

ONE_WORKER_MESSAGE = (
    "GenRM cohort verification requires one HTTP worker because group state is process-local"
)


def did_you_mean(word: str, candidates: Sequence[str]) -> list[str]:
    """The one candidate close to `word` (difflib ratio >= 0.75), else the one it begins."""
    close = difflib.get_close_matches(word, candidates, n=1, cutoff=0.75)
    if close:
        return close
    started = [candidate for candidate in candidates if candidate.startswith(word)]
    return started if len(word) >= 4 and len(started) == 1 else []


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


class KeyedError(ValueError):
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

JudgeApiName = Literal["chat_completions", "openai_responses", "genrm_model"]
"""Every `judge.api` value: `judge.apis.JUDGE_APIS` has one object for each (mypy checks that
`judge_api_type` covers them all, tests/test_judge_http.py that the table has no other).
`chat_completions` and `openai_responses` put the two answers in the model's prompt, for any
OpenAI-compatible server; `genrm_model` is Gym's `genrm_model` protocol (the answers in
`metadata`), right only behind Gym's `genrm_model` server."""

JUDGE_API_ALIASES: Final[dict[str, JudgeApiName]] = {"responses": "genrm_model"}
"""Earlier `judge.api` names, still accepted: `responses` was the name of Gym's protocol."""

KEEPALIVE_EXPIRY_S: Final = 4.0
"""The default `judge.keepalive_expiry_s`: an idle judge connection is closed after this long,
below the 5 s after which uvicorn (so vLLM) and hypercorn close an idle keep-alive connection."""

MAX_RESPONSE_BYTES: Final = 4 * 1024 * 1024
"""The default `judge.max_response_bytes`: a judge reply longer than this ends the attempt. A
verdict reply is kilobytes (a 32,768-token reasoning reply about 300 KB); every step of reading
one is linear in it, and its JSON decode and counts are single calls that hold the GIL: 32 MiB
made `/health` wait 250 ms, 4 MiB keeps it under 100 (docs/reliability.md, "Security")."""

MAX_RESPONSE_BYTES_TOTAL: Final = 256 * 1024 * 1024
"""The default `judge.max_response_bytes_total`."""

OUTPUT_BUDGET_PARAM: Final = "max_output_tokens"
"""The create param (`genrm_responses_create_params`) that holds the output budget, under its
Responses name; each judge API sends the budget under its own key (`judge.apis`)."""

PromptStyle = Literal["genrm", "instruct"]
"""Every `judge.prompt` value: `genrm` sends the principle and the answers as the GenRM roles
`principle`, `response_1` and `response_2`, whose model's chat template carries the judging
instructions; `instruct` sends a system and a user message that ask any instruct model for the
verdict (`domain.prompt`)."""

DEFAULT_MIN_OUTPUT_TOKENS: Final = 256
"""The default `judge.min_output_tokens`: a fitted budget below it is not worth a resend (a
verdict with any reasoning needs more)."""

MAX_PROMPT_TEMPLATE_BYTES: Final = 64 * 1024
"""The largest `judge.prompt_template` file read."""


JUDGE_API_CHOICES: Final = (
    "chat_completions or openai_responses for vLLM or any OpenAI-compatible server, "
    "genrm_model behind Gym's genrm_model server"
)
"""What to set `judge.api` to, said wherever a judge URL comes without one: no default is right
for every server (docs/configuration.md, "Which judge.api and judge.prompt")."""


@final
class JudgeSettings(_Strict):
    """How to reach the judge: its base URL, or a list of them, the replicas of a fleet (one URL
    is a fleet of one replica; docs/configuration.md, "The judge", "A judge fleet")."""

    base_url: str | list[str] | None = None
    # The reference's protocol. `serve --judge-url` without a file needs `--judge-api`, and the
    # "judge does not read the answers" check catches this one pointed at a plain server.
    api: JudgeApiName = "genrm_model"
    model: str | None = None
    api_key_env: str | None = None
    max_concurrency: int = Field(default=256, ge=1)
    # Gym's model servers have no /models route and start beside this server: not probed.
    probe: bool = True
    budget_escalation: BudgetEscalation | None = None

    max_concurrency_per_replica: int | None = Field(default=None, ge=1)
    eject_after_failures: int = Field(default=EJECT_MAX_FAILURES, ge=1, le=EJECT_MAX_FAILURES)
    eject_backoff_s: float = 5.0
    # Off by default: the right value depends on the judge's longest call (docs/operations.md).
    replica_stall_s: float | None = None
    # The longest wait between two probes of a judge replica that cannot be reached.
    outage_probe_s: float = 5.0
    keepalive_expiry_s: float = KEEPALIVE_EXPIRY_S
    max_response_bytes: int = Field(default=MAX_RESPONSE_BYTES, ge=1024)
    # the replies being read at once, in all: max_concurrency replies at the cap would be 8 GiB
    max_response_bytes_total: int = Field(default=MAX_RESPONSE_BYTES_TOTAL, ge=1024)
    ca_file: str | None = None
    # A hosted judge's limits (docs/configuration.md, "A judge with rate limits"); unset, the
    # replies' x-ratelimit-* headers and 429s pace the calls.
    requests_per_minute: int | None = Field(default=None, ge=1)
    tokens_per_minute: int | None = Field(default=None, ge=1)
    price_per_million_input_tokens: float | None = Field(default=None, ge=0)
    price_per_million_output_tokens: float | None = Field(default=None, ge=0)
    prompt: PromptStyle = "genrm"
    prompt_template: str | None = None
    structured_output: bool = False
    # the judge's context window; None: learned from GET /models (`max_model_len`) if it says
    context_tokens: int | None = Field(default=None, ge=1)
    # an attempt refused for the window is resent once with a budget that fits, if at least this
    min_output_tokens: int = Field(default=DEFAULT_MIN_OUTPUT_TOKENS, ge=1)

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

    @property
    def api_chosen(self) -> bool:
        """Whether `api` was given (by a file, a flag, an override or a Gym config's
        `genrm_model_server`) rather than defaulted. A judge URL needs it: Gym's protocol, the
        default, sent to a plain OpenAI server judges answers the model never sees."""
        return "api" in self.model_fields_set

    @field_validator("api", mode="before")
    @classmethod
    def _api_alias(cls, value: object) -> object:
        return JUDGE_API_ALIASES.get(value, value) if isinstance(value, str) else value

    @field_validator("eject_backoff_s", "keepalive_expiry_s", "outage_probe_s")
    @classmethod
    def _positive_seconds(cls, value: float) -> float:
        return _finite("value", value, positive=True)

    @field_validator("price_per_million_input_tokens", "price_per_million_output_tokens")
    @classmethod
    def _price(cls, value: float | None) -> float | None:
        return None if value is None else _finite("value", value, positive=False)

    @field_validator("replica_stall_s")
    @classmethod
    def _stall_seconds(cls, value: float | None) -> float | None:
        return None if value is None else _finite("value", value, positive=True)

    @field_validator("ca_file", "prompt_template")
    @classmethod
    def _check_file(cls, value: str | None) -> str | None:
        if value is not None and not os.path.isfile(value):
            raise ValueError(f"{value} is not a file")
        return value

    @model_validator(mode="after")
    def _prompt_fits_api(self) -> JudgeSettings:
        if self.prompt_template is not None and self.prompt != "instruct":
            raise KeyedError("judge.prompt_template", "needs judge.prompt: instruct")
        if self.prompt == "instruct" and self.api == "genrm_model" and self.api_chosen:
            # Gym's protocol carries the answers in metadata, never in messages (the default
            # api is never used: a judge URL needs one named, `make_judge`)
            raise KeyedError(
                "judge.prompt",
                "instruct needs judge.api chat_completions or openai_responses "
                "(genrm_model sends the answers in metadata)",
            )
        return self

    @model_validator(mode="after")
    def _reply_budget(self) -> JudgeSettings:
        if self.max_response_bytes_total < self.max_response_bytes:
            raise KeyedError(
                "judge.max_response_bytes_total",
                f"must be >= judge.max_response_bytes ({self.max_response_bytes}): one reply "
                "at the cap would never fit",
            )
        return self

    @property
    def base_urls(self) -> tuple[str, ...]:
        """Every configured base URL: one for a string, the replicas for a list."""
        if self.base_url is None:
            return ()
        if isinstance(self.base_url, str):
            return (self.base_url,)
        return tuple(self.base_url)

    @property
    def total_concurrency(self) -> int:
        """Judge calls in flight at once: `max_concurrency`, or the replicas' caps if lower (and
        while replicas are ejected, only the caps of those in service: `JudgeFleet.capacity`).
        A single URL is a fleet of one replica."""
        cap = self.max_concurrency_per_replica
        if cap is None or not self.base_urls:
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
    # each /compare response is judged against others: the cap bounds one request's judge calls
    max_compare_responses: int = Field(default=512, ge=2)
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
    comparison_strategy: ComparisonStrategy = "circular"
    comparisons_per_rollout: int = DEFAULT_COMPARISONS_PER_ROLLOUT  # `_regular_degree` checks it
    num_judges_per_comparison: int = Field(default=1, ge=1)
    use_principle: bool = False
    default_principle: str = DEFAULT_PRINCIPLE
    aggregator_method: AggregatorMethod = "simple_tiebreaker"
    bradley_terry_prior: float = DEFAULT_BRADLEY_TERRY_PRIOR
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
    position_balance: PositionBalance = "none"
    mask_policy: MaskPolicy = "pair"
    evaluation_deadline_policy: Literal["fail_group", "mask_pending"] = "fail_group"
    retry_backoff: Literal["constant", "exponential"] = "constant"

    # own features
    eager_comparisons: bool = True  # judge a pair once both of its members are in (issue #20)
    state_path: str | None = None
    state_commit_timeout_s: float = 10.0
    judge: JudgeSettings = Field(default_factory=JudgeSettings)
    server: ServerSettings = Field(default_factory=ServerSettings)

    @field_validator(
        "cohort_collection_timeout_s",
        "cohort_evaluation_timeout_s",
        "judge_request_timeout_s",
        "state_commit_timeout_s",
    )
    @classmethod
    def _deadline(cls, value: float) -> float:
        return _finite("deadline", value, positive=True)

    @field_validator("cohort_result_ttl_s")
    @classmethod
    def _ttl(cls, value: float | None) -> float | None:
        return None if value is None else _finite("ttl", value, positive=True)

    @field_validator("bradley_terry_prior")
    @classmethod
    def _prior(cls, value: float) -> float:
        return _finite("bradley_terry_prior", value, positive=True)

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
            close = did_you_mean(unknown[0], sorted(RESPONSES_CREATE_PARAM_KEYS))
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
    def _regular_degree(self) -> Settings:
        """`regular` needs a connected simple d-regular graph on N members (docs/configuration.md,
        "Pairs"); N = 1 compares nothing, so nothing is checked there."""
        if self.comparison_strategy != "regular":
            return self
        d, n = self.comparisons_per_rollout, self.num_rollouts_per_prompt
        key = "comparisons_per_rollout"
        if self.comparison_mode == "fixed_baseline":
            raise KeyedError(
                "comparison_strategy",
                "comparison_strategy: regular compares members with each other; "
                "comparison_mode: fixed_baseline compares each with the baseline (use circular)",
            )
        if n > 1 and not 2 <= d <= n - 1:
            raise KeyedError(
                key,
                f"{d} with num_rollouts_per_prompt: {n}: "
                f"comparison_strategy: regular needs 2 <= d <= N - 1 = {n - 1}",
            )
        if n > 1 and n * d % 2:
            raise KeyedError(
                key,
                f"{d} with num_rollouts_per_prompt: {n}: "
                "comparison_strategy: regular needs N·d even (an odd d needs an even N)",
            )
        return self

    @model_validator(mode="after")
    def _prompt_verdict(self) -> Settings:
        """The shipped instruct prompt and the structured output ask for the overall verdict
        only: a rubric verdict needs a template that asks for it."""
        judge = self.judge
        if self.score_source != "rubric_mean":
            return self
        if judge.structured_output:
            raise KeyedError(
                "judge.structured_output",
                "the verdict schema has no rubric_evaluations: not with score_source: rubric_mean",
            )
        if judge.prompt == "instruct" and judge.prompt_template is None:
            raise KeyedError(
                "judge.prompt",
                "the shipped instruct prompt asks for the overall verdict only: with "
                "score_source: rubric_mean set judge.prompt_template to a template that asks "
                "for rubric_evaluations",
            )
        return self

    @model_validator(mode="after")
    def _escalation_budget(self) -> Settings:
        escalation = self.judge.budget_escalation
        if escalation is None:
            return self
        budget = self.output_budget
        if budget is None:
            raise KeyedError(
                "genrm_responses_create_params.max_output_tokens",
                "judge.budget_escalation needs a configured output budget (an integer >= 1)",
            )
        if escalation.max_output_tokens < budget:
            raise KeyedError(
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
        value = self.genrm_responses_create_params.get(OUTPUT_BUDGET_PARAM)
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
        """The start-up warning lines: N = 1 (D50), D12, an unused `comparisons_per_rollout` and
        D37 (docs/configuration.md, "Start-up warnings"). A trainer's setting is named for each
        trainer genrm-trio knows: the server cannot tell which one will call it."""
        lines: list[str] = []
        if not self.cohorting:
            # Gym's default too, and silent there: a server started without the trainer's group
            # size answers every /verify without a judge call and looks healthy doing so.
            lines.append(
                f"num_rollouts_per_prompt is {self.num_rollouts_per_prompt}: every /verify is "
                f"answered at once with default_score ({self.default_score}) and no judge call; "
                "set num_rollouts_per_prompt (serve --num-rollouts-per-prompt N) to the "
                "rollouts per prompt the trainer sends (NeMo RL: grpo.num_generations_per_prompt; "
                "TRL: num_generations; verl: actor_rollout_ref.rollout.n; slime: "
                "--n-samples-per-prompt; e.g. num_rollouts_per_prompt: 16)"
            )
        elif (
            self.evaluation_deadline_policy == "fail_group"
            and self.judge_request_timeout_s >= self.cohort_evaluation_timeout_s
        ):
            # under mask_pending a hung call masks its own comparison at the group deadline;
            # the value named lets every attempt of a comparison run out within the group's
            # deadline (1800 s and 4 attempts: 300 s, the example of docs/configuration.md)
            fits = self.cohort_evaluation_timeout_s / (self.attempts + 2)
            lines.append(
                f"judge_request_timeout_s ({self.judge_request_timeout_s}s) >= "
                f"cohort_evaluation_timeout_s ({self.cohort_evaluation_timeout_s}s): a hung judge "
                "call fails the whole group instead of masking one comparison; set "
                f"judge_request_timeout_s: {fits:g} (its {self.attempts} attempts then fit in the "
                "group's deadline) or evaluation_deadline_policy: mask_pending"
            )
        if (
            "comparisons_per_rollout" in self.model_fields_set
            and self.comparison_strategy != "regular"
        ):
            # a warning, not an error: switching the strategy by one override keeps working
            lines.append(
                f"comparisons_per_rollout ({self.comparisons_per_rollout}) is ignored under "
                f"comparison_strategy: {self.comparison_strategy} (circular: 2 a pass, "
                "all_pairs: N - 1, fixed_baseline: 1); it sets d of comparison_strategy: regular: "
                "remove the key, or set comparison_strategy: regular"
            )
        lines.append(
            "masked rows carry a placeholder reward 0.0; the trainer must exclude them "
            "(NeMo RL: env.should_mask_flagged_samples: true and grpo.masked_reward_policy: "
            "exclude_infra, or exclude; the default include counts the 0.0; genrm-trio's TRL, "
            "verl and slime rewards leave them out themselves, docs/trainers.md)"
        )
        return lines
