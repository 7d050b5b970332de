"""Settings against docs/configuration.md (keys, file shapes, start-up warnings) and the decisions
D9, D12 and D37 of docs/differences.md.

Every bad configuration must fail at load time as one `ConfigError(file, key, message)` naming
the key, never a traceback and never a failure deferred to the first cohort.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError
from settings_keys import literal_keys

from genrm_trio.config import (
    DEFAULT_PRINCIPLE,
    IGNORED_GYM_KEYS,
    BudgetEscalation,
    ConfigError,
    JudgeSettings,
    ServerSettings,
    Settings,
    load_settings,
    read_secret,
    settings_from_mapping,
)

ONE_WORKER = (
    "GenRM cohort verification requires one HTTP worker because group state is process-local"
)
D12_DEFAULT_LINE = (
    "judge_request_timeout_s (1800.0s) >= cohort_evaluation_timeout_s (1800.0s): a hung judge "
    "call fails the whole group instead of masking one comparison; set judge_request_timeout_s: "
    "300 (its 4 attempts then fit in the group's deadline) or evaluation_deadline_policy: "
    "mask_pending"
)
D37_LINE = (
    "masked rows carry a placeholder reward 0.0; the trainer must exclude them (NeMo RL: "
    "env.should_mask_flagged_samples: true and grpo.masked_reward_policy: exclude_infra, or "
    "exclude; the default include counts the 0.0; genrm-trio's TRL, verl and slime rewards "
    "leave them out themselves, docs/trainers.md)"
)
DEADLINES = (
    "cohort_collection_timeout_s",
    "cohort_evaluation_timeout_s",
    "judge_request_timeout_s",
)
CONFIG_LOGGER = "genrm_trio.config"


def load(data: Mapping[str, Any], **kwargs: Any) -> Settings:
    return settings_from_mapping(data, **kwargs)


def config_error(data: Mapping[str, Any], **kwargs: Any) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        settings_from_mapping(data, **kwargs)
    return info.value


def write(tmp_path: Path, text: str, name: str = "genrm.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def file_error(path: Path, **kwargs: Any) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_settings(path, **kwargs)
    err = info.value
    assert err.file == str(path)
    assert err.key
    assert str(err) == f"{err.file}: {err.key}: {err.message}"
    return err


# --- defaults ------------------------------------------------------------------------------------


def test_config_defaults() -> None:
    """The defaults of docs/configuration.md's key tables."""
    s = Settings()
    assert s.comparison_strategy == "circular"
    assert s.num_judges_per_comparison == 1
    assert s.cohort_collection_timeout_s == 1800.0
    assert s.cohort_result_ttl_s == 3600.0
    assert s.max_terminal_cohorts == 4096
    assert s.use_principle is False
    assert s.aggregator_method == "simple_tiebreaker"
    assert s.default_score == 3.0
    assert s.default_ranking == 3.5


def test_every_top_level_default() -> None:
    expected: dict[str, Any] = {
        "host": "127.0.0.1",
        "port": 8100,
        "num_workers": None,
        "genrm_model_server": None,
        "genrm_responses_create_params": {
            "input": [],
            "max_output_tokens": 16384,
            "temperature": 0.6,
            "top_p": 0.95,
        },
        "num_rollouts_per_prompt": 1,
        "cohort_collection_timeout_s": 1800.0,
        "cohort_evaluation_timeout_s": 1800.0,
        "judge_request_timeout_s": 1800.0,
        "cohort_result_ttl_s": 3600.0,
        "max_terminal_cohorts": 4096,
        "comparison_mode": "rollout_cohort",
        "comparison_strategy": "circular",
        "comparisons_per_rollout": 4,
        "num_judges_per_comparison": 1,
        "use_principle": False,
        "default_principle": DEFAULT_PRINCIPLE,
        "aggregator_method": "simple_tiebreaker",
        "bradley_terry_prior": 0.1,
        "score_source": "overall",
        "reasoning_bonus": 0.0,
        "answer_bonus": 0.0,
        "top_percentile": 0.2,
        "group_reasoning_length_penalty_coeff": 0.0,
        "group_answer_length_penalty_coeff": 0.0,
        "group_style_penalty_coeff": 0.0,
        "default_score": 3.0,
        "default_ranking": 3.5,
        "debug_logging": False,
        "genrm_parse_retries": 3,
        "genrm_parse_retry_sleep_s": 0.2,
        "validate_verdict_range": True,
        "position_balance": "none",
        "mask_policy": "pair",
        "evaluation_deadline_policy": "fail_group",
        "retry_backoff": "constant",
        "eager_comparisons": True,
        "state_path": None,
        "state_commit_timeout_s": 10.0,
    }
    dumped = Settings().model_dump()
    nested = {"judge", "server"}
    assert set(dumped) == set(expected) | nested, "a Settings key has no default test"
    assert {k: v for k, v in dumped.items() if k not in nested} == expected
    assert isinstance(dumped["cohort_collection_timeout_s"], float)


def test_judge_defaults() -> None:
    judge = Settings().judge
    assert judge == JudgeSettings()
    assert judge.model_dump() == {
        "base_url": None,
        "api": "genrm_model",
        "model": None,
        "api_key_env": None,
        "max_concurrency": 256,
        "probe": True,
        "budget_escalation": None,
        "max_concurrency_per_replica": None,
        "eject_after_failures": 3,
        "eject_backoff_s": 5.0,
        "replica_stall_s": None,
        "outage_probe_s": 5.0,
        "keepalive_expiry_s": 4.0,
        "max_response_bytes": 4194304,
        "max_response_bytes_total": 268435456,
        "ca_file": None,
        "requests_per_minute": None,
        "tokens_per_minute": None,
        "price_per_million_input_tokens": None,
        "price_per_million_output_tokens": None,
        "prompt": "genrm",
        "prompt_template": None,
        "structured_output": False,
        "context_tokens": None,
        "min_output_tokens": 256,
    }
    assert judge.endpoint == "unconfigured"


@pytest.mark.parametrize(
    ("key", "value", "fragment"),
    [
        ("requests_per_minute", 0, "greater than or equal to 1"),
        ("tokens_per_minute", -5, "greater than or equal to 1"),
        ("price_per_million_input_tokens", -0.5, "greater than or equal to 0"),
        ("price_per_million_output_tokens", float("inf"), "finite"),
    ],
)
def test_judge_limits_and_prices_are_checked(key: str, value: float, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        settings_from_mapping({"judge": {key: value}})
    assert f"judge.{key}" in str(info.value) and fragment in str(info.value)
    judge = settings_from_mapping({"judge": {key: 3}}).judge
    assert getattr(judge, key) == 3


def test_server_defaults() -> None:
    server = Settings().server
    assert server == ServerSettings()
    assert server.model_dump() == {
        "max_body_bytes": 67108864,
        "max_active_cohorts": 4096,
        "max_compare_responses": 512,
        "api_key_env": None,
        "shutdown_grace_s": 5.0,
    }


def test_defaults_from_an_empty_mapping_equal_the_model_defaults() -> None:
    assert load({}) == Settings()


def test_default_create_params_are_not_shared_between_instances() -> None:
    a, b = Settings(), Settings()
    a.genrm_responses_create_params["temperature"] = 0.0
    assert b.genrm_responses_create_params["temperature"] == 0.6
    assert Settings().genrm_responses_create_params["temperature"] == 0.6


def test_default_derived_values() -> None:
    s = Settings()
    assert s.attempts == 4
    assert s.cohorting is False
    assert s.judge_create_params == s.genrm_responses_create_params


def test_settings_are_frozen() -> None:
    s = Settings()
    with pytest.raises(ValidationError):
        s.num_rollouts_per_prompt = 16
    with pytest.raises(ValidationError):
        s.judge.base_url = "http://127.0.0.1:8000/v1"


# --- deadlines and TTL ---------------------------------------------------------------------------


@pytest.mark.parametrize("key", DEADLINES)
@pytest.mark.parametrize("value", [None, 0, 0.0, -1, -0.5, math.inf, -math.inf, math.nan])
def test_deadline_must_be_finite_positive(key: str, value: float | None) -> None:
    """Each deadline must be finite and positive (×3 keys × {None, 0, −1, inf, nan})."""
    err = config_error({key: value})
    assert err.key == key
    assert err.file == "<settings>"


@pytest.mark.parametrize("key", DEADLINES)
@pytest.mark.parametrize("value", [0.001, 0.2, 1, 1800.0, 1e9])
def test_deadline_accepts_positive_finite(key: str, value: float) -> None:
    s = load({key: value})
    assert getattr(s, key) == value
    assert isinstance(getattr(s, key), float)


@given(
    key=st.sampled_from(DEADLINES),
    value=st.floats(min_value=0.0, exclude_min=True, allow_infinity=False),
)
def test_deadline_property_positive_finite_accepted(key: str, value: float) -> None:
    assert getattr(load({key: value}), key) == value


@given(key=st.sampled_from(DEADLINES), value=st.floats(max_value=0.0))
def test_deadline_property_non_positive_rejected(key: str, value: float) -> None:
    assert config_error({key: value}).key == key


@pytest.mark.parametrize("value", [0, 0.0, -1, math.inf, -math.inf, math.nan])
def test_ttl_rejects_non_positive_and_non_finite(value: float) -> None:
    assert config_error({"cohort_result_ttl_s": value}).key == "cohort_result_ttl_s"


def test_ttl_null_disables_time_expiry() -> None:
    assert load({"cohort_result_ttl_s": None}).cohort_result_ttl_s is None


@pytest.mark.parametrize("value", [0.5, 21600])
def test_ttl_accepts_positive(value: float) -> None:
    assert load({"cohort_result_ttl_s": value}).cohort_result_ttl_s == value


# --- integer bounds ------------------------------------------------------------------------------

AT_LEAST_ONE = [
    "num_rollouts_per_prompt",
    "num_judges_per_comparison",
    "max_terminal_cohorts",
    "judge.max_concurrency",
    "server.max_body_bytes",
    "server.max_active_cohorts",
]


def nested(dotted: str, value: Any) -> dict[str, Any]:
    """`{"a": {"b": value}}` for `"a.b"`: the file shape of a dotted name (docs/configuration.md,
    "Flat")."""
    head, _, rest = dotted.partition(".")
    return {head: nested(rest, value)} if rest else {head: value}


def read(s: Settings, dotted: str) -> Any:
    value: Any = s
    for part in dotted.split("."):
        value = getattr(value, part)
    return value


@pytest.mark.parametrize("key", AT_LEAST_ONE)
@pytest.mark.parametrize("value", [0, -1])
def test_at_least_one(key: str, value: int) -> None:
    assert config_error(nested(key, value)).key == key


@pytest.mark.parametrize("key", AT_LEAST_ONE)
def test_at_least_one_accepts_one(key: str) -> None:
    assert read(load(nested(key, 1)), key) == 1


@pytest.mark.parametrize("key", AT_LEAST_ONE)
def test_integers_reject_fractions(key: str) -> None:
    assert config_error(nested(key, 2.5)).key == key


@pytest.mark.parametrize("port", [-1, 65536])
def test_port_range_rejected(port: int) -> None:
    assert config_error({"port": port}).key == "port"


@pytest.mark.parametrize("port", [0, 1, 8100, 65535])
def test_port_range_accepted(port: int) -> None:
    assert load({"port": port}).port == port


# --- literals ------------------------------------------------------------------------------------


LITERALS = literal_keys(Settings)


def test_the_literal_keys_are_found() -> None:
    """The walk finds the keys the docs list as choices, those added since the list was written
    by hand (`aggregator_method: bradley_terry`, `mask_policy`) included."""
    assert {"comparison_strategy", "aggregator_method", "mask_policy", "judge.api"} <= set(LITERALS)
    assert "bradley_terry" in LITERALS["aggregator_method"]
    assert all(len(values) >= 2 for values in LITERALS.values()), LITERALS


@pytest.mark.parametrize(
    ("key", "value"), [(k, v) for k, values in LITERALS.items() for v in values]
)
def test_literal_values_accepted(key: str, value: str) -> None:
    assert read(load(nested(key, value)), key) == value


def test_judge_api_responses_is_the_earlier_name_of_genrm_model() -> None:
    """Configs written before the rename keep Gym's protocol."""
    assert load(nested("judge.api", "responses")).judge.api == "genrm_model"


@pytest.mark.parametrize("key", list(LITERALS))
@pytest.mark.parametrize("value", ["bogus", "", None, 1])
def test_literal_other_values_rejected(key: str, value: object) -> None:
    assert config_error(nested(key, value)).key == key


@pytest.mark.parametrize("value", ["mean", "majority_vote", "Simple_Tiebreaker"])
def test_aggregator_method_fails_at_load_not_per_cohort(value: str) -> None:
    """D9: the reference accepted any string and failed every cohort; here the start fails."""
    err = config_error({"aggregator_method": value})
    assert err.key == "aggregator_method"
    assert "simple_tiebreaker" in err.message


# --- D5 / D9 numeric validation ------------------------------------------------------------------


@pytest.mark.parametrize("value", [1e-9, 0.2, 0.5, 1, 1.0])
def test_top_percentile_accepts_half_open_unit_interval(value: float) -> None:
    assert load({"top_percentile": value}).top_percentile == value


@pytest.mark.parametrize("value", [0, 0.0, -0.1, 1.0000001, 2, math.inf, math.nan])
def test_top_percentile_rejects_outside_half_open_unit_interval(value: float) -> None:
    assert config_error({"top_percentile": value}).key == "top_percentile"


@pytest.mark.parametrize("value", [0, 1, 3, 100])
def test_parse_retries_accepts_non_negative(value: int) -> None:
    assert load({"genrm_parse_retries": value}).genrm_parse_retries == value


@pytest.mark.parametrize("value", [-1, -10, 1.5, None])
def test_parse_retries_rejects_negative_and_non_integers(value: object) -> None:
    assert config_error({"genrm_parse_retries": value}).key == "genrm_parse_retries"


@pytest.mark.parametrize(("retries", "attempts"), [(0, 1), (1, 2), (3, 4), (15, 16)])
def test_attempts_is_retries_plus_one(retries: int, attempts: int) -> None:
    assert load({"genrm_parse_retries": retries}).attempts == attempts


@given(st.integers(min_value=0, max_value=10_000))
def test_attempts_property(retries: int) -> None:
    assert load({"genrm_parse_retries": retries}).attempts == max(1, retries + 1)


@pytest.mark.parametrize("value", [0, 0.0, 0.2, 30])
def test_retry_sleep_accepts_finite_non_negative(value: float) -> None:
    assert load({"genrm_parse_retry_sleep_s": value}).genrm_parse_retry_sleep_s == value


@pytest.mark.parametrize("value", [-0.1, -1, math.inf, math.nan, None])
def test_retry_sleep_rejects_negative_and_non_finite(value: float | None) -> None:
    assert config_error({"genrm_parse_retry_sleep_s": value}).key == "genrm_parse_retry_sleep_s"


FINITE_FLOATS = [
    "reasoning_bonus",
    "answer_bonus",
    "group_reasoning_length_penalty_coeff",
    "group_answer_length_penalty_coeff",
    "group_style_penalty_coeff",
    "default_score",
    "default_ranking",
]


@pytest.mark.parametrize("key", FINITE_FLOATS)
@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan])
def test_scoring_floats_reject_non_finite(key: str, value: float) -> None:
    assert config_error({key: value}).key == key


@pytest.mark.parametrize("key", FINITE_FLOATS)
@pytest.mark.parametrize("value", [-2.5, 0, 7])
def test_scoring_floats_accept_any_finite(key: str, value: float) -> None:
    """The reference puts no range on bonuses, coefficients and defaults (only finiteness)."""
    assert getattr(load({key: value}), key) == value


@pytest.mark.parametrize("value", [0, 0.5, 60])
def test_shutdown_grace_accepts_finite_non_negative(value: float) -> None:
    assert load({"server": {"shutdown_grace_s": value}}).server.shutdown_grace_s == value


@pytest.mark.parametrize("value", [-1, math.inf, math.nan])
def test_shutdown_grace_rejects_negative_and_non_finite(value: float) -> None:
    assert config_error({"server": {"shutdown_grace_s": value}}).key == "server.shutdown_grace_s"


@pytest.mark.parametrize("key", ["use_principle", "debug_logging", "validate_verdict_range"])
def test_booleans(key: str) -> None:
    assert getattr(load({key: True}), key) is True
    assert getattr(load({key: False}), key) is False
    assert config_error({key: "sometimes"}).key == key


def test_state_path_and_strings() -> None:
    s = load({"state_path": "/tmp/genrm.sqlite", "default_principle": "be fair", "host": "0.0.0.0"})
    assert s.state_path == "/tmp/genrm.sqlite"
    assert s.default_principle == "be fair"
    assert s.host == "0.0.0.0"
    assert config_error({"default_principle": None}).key == "default_principle"


# --- the one-worker rule -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "data",
    [
        {"num_rollouts_per_prompt": 2, "num_workers": 2},
        {"num_rollouts_per_prompt": 16, "num_workers": 8},
        {"comparison_mode": "fixed_baseline", "num_workers": 2},
    ],
)
def test_one_worker_rule(data: dict[str, Any]) -> None:
    err = config_error(data)
    assert err.key == "num_workers"
    assert err.message == ONE_WORKER
    assert str(err) == f"<settings>: num_workers: {ONE_WORKER}"


@pytest.mark.parametrize(
    "data",
    [
        {"num_rollouts_per_prompt": 1, "num_workers": 2},
        {"num_rollouts_per_prompt": 16, "num_workers": 1},
        {"num_rollouts_per_prompt": 16, "num_workers": None},
        {"num_rollouts_per_prompt": 16},
        {"comparison_mode": "fixed_baseline", "num_workers": 1},
    ],
)
def test_one_worker_rule_allows(data: dict[str, Any]) -> None:
    load(data)


def test_one_worker_rule_from_a_file(tmp_path: Path) -> None:
    path = write(tmp_path, "num_rollouts_per_prompt: 16\nnum_workers: 4\n")
    err = file_error(path)
    assert str(err) == f"{path}: num_workers: {ONE_WORKER}"


@pytest.mark.parametrize(
    ("data", "cohorting"),
    [
        ({}, False),
        ({"num_rollouts_per_prompt": 2}, True),
        ({"comparison_mode": "fixed_baseline"}, True),
        ({"comparison_mode": "fixed_baseline", "num_rollouts_per_prompt": 4}, True),
    ],
)
def test_cohorting(data: dict[str, Any], cohorting: bool) -> None:
    assert load(data).cohorting is cohorting


# --- create params, model server and judge.model -------------------------------------------------

# The create-params keys docs/http-api.md lists ("Request").
DOCUMENTED_CREATE_PARAM_KEYS = (
    "background context_management conversation include input instructions max_output_tokens "
    "max_tool_calls metadata model moderation parallel_tool_calls previous_response_id prompt "
    "prompt_cache_key prompt_cache_retention reasoning safety_identifier service_tier store "
    "stream stream_options temperature text tool_choice tools top_logprobs top_p truncation user"
).split()


def test_every_responses_create_param_key_is_accepted() -> None:
    params: dict[str, Any] = dict.fromkeys(DOCUMENTED_CREATE_PARAM_KEYS)
    params["input"] = []
    assert load({"genrm_responses_create_params": params}).genrm_responses_create_params == params


def test_create_params_unknown_key_rejected() -> None:
    err = config_error({"genrm_responses_create_params": {"input": [], "max_tokens": 10}})
    assert err.key == "genrm_responses_create_params"
    assert "max_tokens" in err.message


def test_create_params_need_input() -> None:
    err = config_error({"genrm_responses_create_params": {"max_output_tokens": 10}})
    assert err.key == "genrm_responses_create_params"
    assert "input" in err.message


def test_create_params_replace_the_shipped_value() -> None:
    params = {"input": [], "max_output_tokens": 1341}
    s = load({"genrm_responses_create_params": params})
    assert s.genrm_responses_create_params == params


def test_judge_model_overrides_create_params_model() -> None:
    s = load(
        {
            "genrm_responses_create_params": {"input": [], "model": "from-params"},
            "judge": {"model": "from-judge"},
        }
    )
    assert s.judge_create_params["model"] == "from-judge"
    assert s.genrm_responses_create_params["model"] == "from-params"  # not mutated


def test_judge_model_added_when_create_params_have_none() -> None:
    s = load({"judge": {"model": "qwen"}})
    assert s.judge_create_params == {
        "input": [],
        "max_output_tokens": 16384,
        "temperature": 0.6,
        "top_p": 0.95,
        "model": "qwen",
    }
    assert "model" not in s.genrm_responses_create_params


def test_create_params_model_kept_without_judge_model() -> None:
    s = load({"genrm_responses_create_params": {"input": [], "model": "m"}})
    assert s.judge_create_params["model"] == "m"


def test_judge_create_params_is_a_copy() -> None:
    s = load({"judge": {"model": "qwen"}})
    s.judge_create_params["temperature"] = 9.0
    assert s.judge_create_params["temperature"] == 0.6


def test_genrm_model_server_accepted_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=CONFIG_LOGGER)
    reference = {"type": "responses_api_models", "name": "genrm_model"}
    s = load({"genrm_model_server": reference, "judge": {"base_url": "http://127.0.0.1:1/v1"}})
    assert s.genrm_model_server == reference
    lines = [r for r in caplog.records if "genrm_model_server" in r.getMessage()]
    assert len(lines) == 1
    assert lines[0].levelno == logging.INFO
    # without a judge URL serve's "needs a judge" error follows: no line claiming one is used
    caplog.clear()
    assert load({"genrm_model_server": reference}).genrm_model_server == reference
    assert not [r for r in caplog.records if "genrm_model_server" in r.getMessage()]


def test_genrm_model_server_wrong_type_rejected() -> None:
    err = config_error({"genrm_model_server": {"type": "resources_servers", "name": "x"}})
    assert err.key == "genrm_model_server"


# --- judge.base_url (docs/configuration.md, "The judge") -----------------------------------------


def base_url_warnings(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records
        if r.name == CONFIG_LOGGER and r.levelno == logging.WARNING and "base_url" in r.getMessage()
    ]


@pytest.mark.parametrize(
    ("given_url", "stored"),
    [
        ("http://127.0.0.1:8000/v1", "http://127.0.0.1:8000/v1"),
        ("http://127.0.0.1:8000/v1/", "http://127.0.0.1:8000/v1"),
        ("https://judge.example.com/v1//", "https://judge.example.com/v1"),
        ("https://judge.example.com/prefix/v1", "https://judge.example.com/prefix/v1"),
        ("http://[::1]:8000/v1", "http://[::1]:8000/v1"),
    ],
)
def test_base_url_accepted_and_trimmed(
    given_url: str, stored: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=CONFIG_LOGGER)
    assert load({"judge": {"base_url": given_url}}).judge.base_url == stored
    assert base_url_warnings(caplog) == []


@pytest.mark.parametrize(
    ("given_url", "stored"),
    [
        ("http://127.0.0.1:8000", "http://127.0.0.1:8000"),
        ("http://127.0.0.1:8000/", "http://127.0.0.1:8000"),
        ("https://judge.example.com/openai/", "https://judge.example.com/openai"),
        ("http://h/v1/responses", "http://h/v1/responses"),
    ],
)
def test_base_url_without_v1_accepted_with_one_warning(
    given_url: str, stored: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=CONFIG_LOGGER)
    assert load({"judge": {"base_url": given_url}}).judge.base_url == stored
    warnings = base_url_warnings(caplog)
    assert len(warnings) == 1
    assert stored in warnings[0].getMessage()


@pytest.mark.parametrize(
    "url",
    [
        "127.0.0.1:8000/v1",
        "/v1",
        "",
        "ftp://h/v1",
        "ws://h/v1",
        "file:///v1",
        "http:///v1",
        "http://user:secret@h/v1",
        "http://user@h/v1",
        "http://h/v1?x=1",
        "http://h/v1?",
        "http://h/v1#frag",
        "http://h/v1#",
        "http://h:abc/v1",
        "http://h:70000/v1",
    ],
)
def test_base_url_rejected(url: str) -> None:
    err = config_error({"judge": {"base_url": url}})
    assert err.key == "judge.base_url"
    assert "secret" not in str(err)  # credentials are never echoed


@pytest.mark.parametrize(
    ("url", "endpoint"),
    [
        ("http://127.0.0.1:8000/v1", "127.0.0.1:8000"),
        ("http://judge/v1", "judge:80"),
        ("https://judge/v1", "judge:443"),
        ("https://judge:8443/v1", "judge:8443"),
    ],
)
def test_judge_endpoint_for_error_texts(url: str, endpoint: str) -> None:
    assert load({"judge": {"base_url": url}}).judge.endpoint == endpoint


# --- read_secret (judge.api_key_env, server.api_key_env) -----------------------------------------


def test_read_secret_returns_the_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GENRM_TEST_TOKEN", "s3cr3t")
    assert read_secret("GENRM_TEST_TOKEN", key="judge.api_key_env") == "s3cr3t"


@pytest.mark.parametrize("value", [None, ""])
def test_read_secret_unset_or_empty_is_a_config_error(
    monkeypatch: pytest.MonkeyPatch, value: str | None
) -> None:
    if value is None:
        monkeypatch.delenv("GENRM_TEST_TOKEN", raising=False)
    else:
        monkeypatch.setenv("GENRM_TEST_TOKEN", value)
    with pytest.raises(ConfigError) as info:
        read_secret("GENRM_TEST_TOKEN", key="server.api_key_env", file="cfg.yaml")
    err = info.value
    assert err.file == "cfg.yaml"
    assert err.key == "server.api_key_env"
    assert "GENRM_TEST_TOKEN" in err.message
    assert str(err).startswith("cfg.yaml: server.api_key_env: ")


@pytest.mark.parametrize(
    "value",
    [
        "sk-secret-123\n",  # a key read from a file or a Kubernetes secret
        "sk-secret-123\r\n",
        " sk-secret-123",
        "sk-secret-123 ",
        "sk-secret\x01123",  # (an environment cannot hold NUL)
        "sk-secret 123",
        "sk-secret\t123",
        "sk-secret-\u00e9",  # latin-1 but not ASCII: clients would encode it differently
        "sk-secret-\u20ac",  # not latin-1: no header can carry it
    ],
)
def test_read_secret_refuses_what_a_header_cannot_carry_without_showing_it(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv("GENRM_TEST_TOKEN", value)
    with pytest.raises(ConfigError) as info:
        read_secret("GENRM_TEST_TOKEN", key="judge.api_key_env")
    text = str(info.value)
    assert text.startswith("environment: judge.api_key_env: environment variable GENRM_TEST_TOKEN ")
    assert "\n" not in text  # one line
    assert "sk-secret" not in text


def test_api_key_env_names_are_settings() -> None:
    s = load({"judge": {"api_key_env": "JUDGE_TOKEN"}, "server": {"api_key_env": "SERVER_TOKEN"}})
    assert s.judge.api_key_env == "JUDGE_TOKEN"
    assert s.server.api_key_env == "SERVER_TOKEN"


# --- start-up warnings (D12, D37) ----------------------------------------------------------------


def test_startup_warnings_defaults_have_d12_and_d37() -> None:
    # N = 16: the default N = 1 warns about that instead (tests/test_group_size.py)
    assert load({"num_rollouts_per_prompt": 16}).startup_warnings() == [D12_DEFAULT_LINE, D37_LINE]


def test_startup_warnings_d12_absent_when_judge_deadline_is_shorter() -> None:
    s = load(
        {
            "num_rollouts_per_prompt": 16,
            "judge_request_timeout_s": 300,
            "cohort_evaluation_timeout_s": 1800,
        }
    )
    assert s.startup_warnings() == [D37_LINE]


def test_startup_warnings_d12_absent_under_mask_pending() -> None:
    # a hung call is cancelled at the group deadline and masks only its own comparison
    s = load({"num_rollouts_per_prompt": 16, "evaluation_deadline_policy": "mask_pending"})
    assert s.startup_warnings() == [D37_LINE]


@pytest.mark.parametrize(("judge", "group"), [(5, 5), (10, 2.5)])
def test_startup_warnings_d12_when_judge_deadline_is_not_shorter(
    judge: float, group: float
) -> None:
    s = load(
        {
            "num_rollouts_per_prompt": 16,
            "judge_request_timeout_s": judge,
            "cohort_evaluation_timeout_s": group,
        }
    )
    fits = group / 6  # 4 attempts, and room for their retry sleeps
    assert s.startup_warnings() == [
        f"judge_request_timeout_s ({float(judge)}s) >= cohort_evaluation_timeout_s "
        f"({float(group)}s): a hung judge call fails the whole group instead of masking one "
        f"comparison; set judge_request_timeout_s: {fits:g} (its 4 attempts then fit in the "
        "group's deadline) or evaluation_deadline_policy: mask_pending",
        D37_LINE,
    ]


@pytest.mark.parametrize(
    "config",
    [
        {"num_rollouts_per_prompt": 16},
        {"num_rollouts_per_prompt": 4, "cohort_evaluation_timeout_s": 3, "genrm_parse_retries": 0},
        {"num_rollouts_per_prompt": 16, "comparisons_per_rollout": 6},
        {"comparison_strategy": "all_pairs", "comparisons_per_rollout": 6},
    ],
)
def test_each_startup_warning_names_a_setting_that_silences_it(config: dict[str, Any]) -> None:
    """Every fix a warning names (`set KEY: VALUE`, `or KEY: VALUE`, `e.g. KEY: VALUE`, `remove
    the key`) makes
    that warning go, and the trainer line names the README's setting."""
    s = load(config)
    for line in s.startup_warnings():
        if line == D37_LINE:
            continue
        fixes = re.findall(r"(?:set|or|e\.g\.) ([a-z_.]+): ([\w.]+)", line)
        assert fixes or "remove the key" in line, line
        for key, value in fixes:
            fixed = load({**config, key: yaml.safe_load(value)})
            assert line.split(":")[0] not in " ".join(fixed.startup_warnings()), (key, value)
        if "remove the key" in line:
            key = line.split(" ")[0]
            removed = load({k: v for k, v in config.items() if k != key})
            assert not any(w.startswith(key) for w in removed.startup_warnings()), line
    readme = (Path(__file__).parent.parent / "README.md").read_text()
    [policy] = re.findall(r"masked_reward_policy: (\w+)", readme)
    assert f"grpo.masked_reward_policy: {policy}" in D37_LINE


# --- unknown keys, nested mappings, interpolation, overrides -------------------------------------


def test_unknown_key_is_named() -> None:
    err = config_error({"mystery_knob": 16})
    assert err.key == "mystery_knob"
    assert err.message == "unknown key"  # nothing close: no suggestion


@pytest.mark.parametrize(
    ("data", "key", "hint"),
    [
        ({"num_rollout_per_prompt": 16}, "num_rollout_per_prompt", "'num_rollouts_per_prompt'"),
        ({"judge_request_timeout": 5}, "judge_request_timeout", "'judge_request_timeout_s'"),
        ({"entrypont": "app.py"}, "entrypont", "'entrypoint'"),  # accepted Gym-only keys count
        ({"num_judges": 2}, "num_judges", "'num_judges_per_comparison'"),  # a key it begins
        ({"judges": {}}, "judges", "'judge'"),
        ({"judge": {"modle": "m"}}, "judge.modle", "'judge.model'"),
        (
            {"server": {"max_active_cohort": 8}},
            "server.max_active_cohort",
            "'server.max_active_cohorts'",
        ),
        ({"max_concurency": 8}, "max_concurency", "'judge.max_concurrency'"),  # a nested key
        ({"base_url": "http://j/v1"}, "base_url", "'judge.base_url'"),
        ({"api_key_env": "T"}, "api_key_env", "'judge.api_key_env' or 'server.api_key_env'"),
    ],
)
def test_unknown_key_close_to_a_known_one_gets_a_suggestion(
    data: dict[str, Any], key: str, hint: str
) -> None:
    err = config_error(data)
    assert err.key == key
    assert err.message == f"unknown key (did you mean {hint}?)"


@pytest.mark.parametrize("data", [{"judge": {"url": "http://j/v1"}}, {"cohort_ttl": 60}])
def test_unknown_key_far_from_every_known_one_gets_no_suggestion(data: dict[str, Any]) -> None:
    assert config_error(data).message == "unknown key"


def test_a_top_level_key_inside_a_block_is_told_so() -> None:
    err = config_error({"judge": {"judge_request_timeout_s": 5}})
    assert err.key == "judge.judge_request_timeout_s"
    assert err.message == (
        "unknown key ('judge_request_timeout_s' is a top-level key, not one inside 'judge')"
    )


def test_unknown_create_params_key_gets_a_suggestion() -> None:
    err = config_error({"genrm_responses_create_params": {"input": [], "temprature": 0.6}})
    assert err.key == "genrm_responses_create_params"
    assert err.message == "unknown create-params key 'temprature' (did you mean 'temperature'?)"


def test_top_level_dotted_key_is_unknown() -> None:
    err = config_error({"judge.base_url": "http://127.0.0.1:8000/v1"})
    assert err.key == "judge.base_url"
    assert err.message == "unknown key (write it nested: 'base_url' inside a 'judge' block)"


@pytest.mark.parametrize("block", ["judge", "server"])
def test_unknown_nested_key_is_named(block: str) -> None:
    err = config_error({block: {"bogus": 1}})
    assert err.key == f"{block}.bogus"
    assert err.message == "unknown key"


@pytest.mark.parametrize("block", ["judge", "server"])
def test_nested_block_must_be_a_mapping(block: str) -> None:
    assert config_error({block: "http://127.0.0.1:8000/v1"}).key == block


def test_non_string_key_rejected() -> None:
    assert config_error({1: "x"}).key == "1"  # type: ignore[dict-item]


def test_ignored_gym_keys_are_the_spec_list() -> None:
    spec = "entrypoint domain name verified description value expose_tools_over_mcp"
    assert frozenset(spec.split()) == IGNORED_GYM_KEYS


def test_ignored_gym_keys_accepted_with_one_info_line(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=CONFIG_LOGGER)
    data = {
        "entrypoint": "app.py",
        "domain": "rlhf",
        "name": "genrm_compare",
        "verified": False,
        "description": "GenRM pairwise comparison",
        "value": "Improve helpfulness",
        "expose_tools_over_mcp": False,
        "num_rollouts_per_prompt": 16,
    }
    s = load(data)
    assert s.num_rollouts_per_prompt == 16
    lines = [r for r in caplog.records if r.name == CONFIG_LOGGER and "ignor" in r.getMessage()]
    assert len(lines) == 1
    assert lines[0].levelno == logging.INFO
    for key in IGNORED_GYM_KEYS:
        assert key in lines[0].getMessage()


def test_no_ignored_keys_no_ignore_line(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=CONFIG_LOGGER)
    load({"num_rollouts_per_prompt": 2})
    assert not [r for r in caplog.records if "ignor" in r.getMessage()]


@pytest.mark.parametrize(
    ("data", "key"),
    [
        ({"host": "${oc.env:HOST}"}, "host"),
        ({"default_principle": "prefix ${x} suffix"}, "default_principle"),
        ({"judge": {"base_url": "${judge_url}"}}, "judge.base_url"),
        ({"server": {"api_key_env": "${e}"}}, "server.api_key_env"),
        ({"genrm_model_server": {"name": "${m}"}}, "genrm_model_server.name"),
        (
            {"genrm_responses_create_params": {"input": [{"content": "${q}"}]}},
            "genrm_responses_create_params.input[0].content",
        ),
    ],
)
def test_interpolation_is_an_error_naming_the_key_path(data: dict[str, Any], key: str) -> None:
    err = config_error(data)
    assert err.key == key
    assert "${" in err.message


def test_overrides_win_over_the_mapping() -> None:
    s = load(
        {"host": "0.0.0.0", "port": 9000, "judge": {"base_url": "http://a/v1", "api": "responses"}},
        overrides={"port": 0, "judge.base_url": "http://b:8000/v1", "state_path": "/tmp/s.db"},
    )
    assert s.host == "0.0.0.0"
    assert s.port == 0
    assert s.judge.base_url == "http://b:8000/v1"
    assert s.judge.api == "genrm_model"  # sibling keys of the file's judge block survive
    assert s.state_path == "/tmp/s.db"


def test_override_errors_name_the_dotted_key() -> None:
    err = config_error({}, overrides={"judge.base_url": "not a url"})
    assert err.key == "judge.base_url"
    assert config_error({}, overrides={"port": 70000}).key == "port"


def test_overrides_do_not_mutate_the_input_mapping() -> None:
    data: dict[str, Any] = {"judge": {"base_url": "http://a/v1"}}
    load(data, overrides={"judge.base_url": "http://b/v1"})
    assert data == {"judge": {"base_url": "http://a/v1"}}


def test_error_text_format() -> None:
    err = ConfigError("cfg.yaml", "judge.base_url", "must be an absolute http(s) URL")
    assert str(err) == "cfg.yaml: judge.base_url: must be an absolute http(s) URL"
    assert (err.file, err.key, err.message) == (
        "cfg.yaml",
        "judge.base_url",
        "must be an absolute http(s) URL",
    )


# --- files (docs/configuration.md, "File shapes") ------------------------------------------------

FLAT_FILE = """\
host: 0.0.0.0
port: 8200
num_rollouts_per_prompt: 16
cohort_result_ttl_s: 21600
comparison_strategy: all_pairs
genrm_parse_retries: 1
genrm_responses_create_params:
  input: []
  max_output_tokens: 1341
  temperature: 0.6
  top_p: 0.95
judge:
  base_url: http://127.0.0.1:8000/v1/
  api: chat_completions
  model: Qwen/Qwen3-8B
  max_concurrency: 64
server:
  max_active_cohorts: 128
  shutdown_grace_s: 2.5
"""

GYM_FILE = """\
policy_base_url: http://127.0.0.1:9000/v1
genrm_compare_first:
  resources_servers:
    genrm_compare:
      entrypoint: app.py
      domain: rlhf
      verified: false
      description: GenRM pairwise comparison
      value: Improve helpfulness
      genrm_model_server:
        type: responses_api_models
        name: genrm_model
      genrm_responses_create_params:
        input: []
        max_output_tokens: 16384
        temperature: 0.6
        top_p: 0.95
      num_rollouts_per_prompt: 16
      cohort_result_ttl_s: 21600
      judge:
        base_url: http://127.0.0.1:8000/v1
genrm_model:
  responses_api_models:
    vllm_model:
      entrypoint: app.py
      base_url: ${policy_base_url}
genrm_compare_second:
  resources_servers:
    genrm_compare:
      num_rollouts_per_prompt: 8
      comparison_strategy: all_pairs
genrm_simple_agent:
  responses_api_agents:
    simple_agent:
      entrypoint: app.py
      resources_server:
        type: resources_servers
        name: genrm_compare_first
"""


def test_load_flat_file(tmp_path: Path) -> None:
    s = load_settings(write(tmp_path, FLAT_FILE))
    assert (s.host, s.port) == ("0.0.0.0", 8200)
    assert s.num_rollouts_per_prompt == 16
    assert s.cohort_result_ttl_s == 21600.0
    assert s.comparison_strategy == "all_pairs"
    assert s.attempts == 2
    assert s.genrm_responses_create_params["max_output_tokens"] == 1341
    assert s.judge == JudgeSettings(
        base_url="http://127.0.0.1:8000/v1",
        api="chat_completions",
        model="Qwen/Qwen3-8B",
        max_concurrency=64,
    )
    assert s.server.max_active_cohorts == 128
    assert s.server.shutdown_grace_s == 2.5
    assert s.server.max_body_bytes == 67108864


def test_load_gym_file_takes_the_first_block_in_file_order(tmp_path: Path) -> None:
    s = load_settings(write(tmp_path, GYM_FILE))
    assert s.num_rollouts_per_prompt == 16
    assert s.comparison_strategy == "circular"
    assert s.cohort_result_ttl_s == 21600.0
    assert s.judge.base_url == "http://127.0.0.1:8000/v1"
    assert s.genrm_model_server == {"type": "responses_api_models", "name": "genrm_model"}


def test_load_gym_file_instance_selects_by_name(tmp_path: Path) -> None:
    s = load_settings(write(tmp_path, GYM_FILE), instance="genrm_compare_second")
    assert s.num_rollouts_per_prompt == 8
    assert s.comparison_strategy == "all_pairs"
    assert s.judge.base_url is None
    s = load_settings(write(tmp_path, GYM_FILE), instance="genrm_compare_first")
    assert s.num_rollouts_per_prompt == 16


def test_load_gym_file_unknown_instance(tmp_path: Path) -> None:
    err = file_error(write(tmp_path, GYM_FILE), instance="genrm_compare_third")
    assert err.key == "--instance"
    assert "genrm_compare_third" in err.message


def test_instance_with_a_flat_file_is_an_error(tmp_path: Path) -> None:
    assert file_error(write(tmp_path, FLAT_FILE), instance="x").key == "--instance"


def test_gym_block_unknown_key_named(tmp_path: Path) -> None:
    text = "inst:\n  resources_servers:\n    genrm_compare:\n      num_judges: 2\n"
    err = file_error(write(tmp_path, text))
    assert err.key == "num_judges"
    assert err.message == "unknown key (did you mean 'num_judges_per_comparison'?)"


def test_gym_block_interpolation_named(tmp_path: Path) -> None:
    text = (
        "inst:\n  resources_servers:\n    genrm_compare:\n"
        "      judge:\n        base_url: ${judge_url}\n"
    )
    assert file_error(write(tmp_path, text)).key == "judge.base_url"


def test_gym_block_one_worker_rule(tmp_path: Path) -> None:
    text = (
        "inst:\n  resources_servers:\n    genrm_compare:\n"
        "      num_rollouts_per_prompt: 16\n      num_workers: 2\n"
    )
    err = file_error(write(tmp_path, text))
    assert (err.key, err.message) == ("num_workers", ONE_WORKER)


def test_gym_block_host_and_port_are_the_bind_address(tmp_path: Path) -> None:
    text = (
        "inst:\n  resources_servers:\n    genrm_compare:\n"
        "      host: 10.0.0.1\n      port: 8300\n      entrypoint: app.py\n"
    )
    s = load_settings(write(tmp_path, text), overrides={"port": 8400})
    assert (s.host, s.port) == ("10.0.0.1", 8400)


def test_empty_gym_block_gives_defaults(tmp_path: Path) -> None:
    text = "inst:\n  resources_servers:\n    genrm_compare: {}\n"
    assert load_settings(write(tmp_path, text)) == Settings()


def test_gym_file_without_genrm_block_names_the_instances(tmp_path: Path) -> None:
    # A Gym file is recognised as one: not read as a flat file ("other: unknown key").
    text = "other:\n  resources_servers:\n    math_verify:\n      entrypoint: app.py\n"
    err = file_error(write(tmp_path, text))
    assert err.key == "file"
    assert "without a resources_servers.genrm_trio or .genrm_compare block" in err.message
    assert "(instances in it: 'other')" in err.message


def test_file_top_level_dotted_key_is_unknown(tmp_path: Path) -> None:
    err = file_error(write(tmp_path, "judge.base_url: http://127.0.0.1:8000/v1\n"))
    assert (err.key, err.message) == (
        "judge.base_url",
        "unknown key (write it nested: 'base_url' inside a 'judge' block)",
    )


def test_file_unknown_key(tmp_path: Path) -> None:
    path = write(tmp_path, "num_rollouts_per_prompt: 4\nmystery_knob: 3\n")
    err = file_error(path)
    assert str(err) == f"{path}: mystery_knob: unknown key"


def test_file_overrides_by_dotted_path(tmp_path: Path) -> None:
    s = load_settings(
        write(tmp_path, FLAT_FILE),
        overrides={
            "host": "127.0.0.1",
            "port": 0,
            "judge.base_url": "http://127.0.0.1:9999/v1",
            "state_path": "state.sqlite",
        },
    )
    assert (s.host, s.port, s.state_path) == ("127.0.0.1", 0, "state.sqlite")
    assert s.judge.base_url == "http://127.0.0.1:9999/v1"
    assert s.judge.api == "chat_completions"
    assert s.judge.model == "Qwen/Qwen3-8B"


def test_gym_file_overrides(tmp_path: Path) -> None:
    s = load_settings(
        write(tmp_path, GYM_FILE),
        instance="genrm_compare_second",
        overrides={"judge.base_url": "http://127.0.0.1:9999/v1"},
    )
    assert s.judge.base_url == "http://127.0.0.1:9999/v1"
    assert s.num_rollouts_per_prompt == 8


def test_no_file_uses_defaults_and_flags() -> None:
    assert load_settings(None) == Settings()
    s = load_settings(None, overrides={"port": 0, "judge.base_url": "http://127.0.0.1:1/v1"})
    assert s.port == 0
    assert s.judge.base_url == "http://127.0.0.1:1/v1"
    with pytest.raises(ConfigError) as info:
        load_settings(None, overrides={"port": -5})
    assert (info.value.file, info.value.key) == ("<flags>", "port")


def test_validation_error_names_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, "cohort_collection_timeout_s: .inf\n")
    err = file_error(path)
    assert err.key == "cohort_collection_timeout_s"


@pytest.mark.parametrize("text", ["judge_request_timeout_s: .nan\n", "judge_request_timeout_s:\n"])
def test_yaml_nan_and_null_deadlines(tmp_path: Path, text: str) -> None:
    assert file_error(write(tmp_path, text)).key == "judge_request_timeout_s"


def test_yaml_null_ttl_disables(tmp_path: Path) -> None:
    assert load_settings(write(tmp_path, "cohort_result_ttl_s: null\n")).cohort_result_ttl_s is None


def test_empty_file_gives_defaults(tmp_path: Path) -> None:
    assert load_settings(write(tmp_path, "")) == Settings()
    assert load_settings(write(tmp_path, "# only a comment\n")) == Settings()


def test_path_like_accepted(tmp_path: Path) -> None:
    path = write(tmp_path, "port: 1234\n")
    assert load_settings(path).port == 1234
    assert load_settings(str(path)).port == 1234


@pytest.mark.parametrize(
    "text",
    [
        "a: [1\n",
        "a: b: c\n",
        "a: 1\n---\nb: 2\n",
        "key: 'unterminated\n",
        "\tport: 1\n",
    ],
)
def test_bad_yaml(tmp_path: Path, text: str) -> None:
    err = file_error(write(tmp_path, text))
    assert "YAML" in err.message


@pytest.mark.parametrize("text", ["- 1\n- 2\n", "just a string\n", "42\n"])
def test_non_mapping_file(tmp_path: Path, text: str) -> None:
    err = file_error(write(tmp_path, text))
    assert "mapping" in err.message


def test_missing_file(tmp_path: Path) -> None:
    err = file_error(tmp_path / "absent.yaml")
    assert "cannot read" in err.message


def test_directory_is_not_a_file(tmp_path: Path) -> None:
    err = file_error(tmp_path)
    assert "cannot read" in err.message


def test_non_utf8_file(tmp_path: Path) -> None:
    path = tmp_path / "latin1.yaml"
    path.write_bytes("default_principle: juge impartial, très\n".encode("latin-1"))
    err = file_error(path)
    assert "UTF-8" in err.message


def test_utf8_file_with_non_ascii(tmp_path: Path) -> None:
    path = write(tmp_path, "default_principle: 公正に判断してください\n")
    assert load_settings(path).default_principle == "公正に判断してください"


@pytest.mark.parametrize(
    ("mapping", "key"),
    [
        ({"num_rollouts_per_prompt": True}, "num_rollouts_per_prompt"),
        ({"cohort_collection_timeout_s": "1800"}, "cohort_collection_timeout_s"),
        ({"use_principle": "yes"}, "use_principle"),
        ({"judge": {"max_concurrency": 2.5}}, "judge.max_concurrency"),
    ],
)
def test_values_are_not_coerced_across_types(mapping: dict[str, object], key: str) -> None:
    # YAML `yes` or a quoted number is a mistake worth one clear line, not a silent coercion
    with pytest.raises(ConfigError) as info:
        settings_from_mapping(mapping, file="f.yaml")
    assert info.value.key == key


def test_an_int_is_accepted_where_a_float_is_expected() -> None:
    assert (
        settings_from_mapping({"cohort_collection_timeout_s": 5}).cohort_collection_timeout_s == 5.0
    )


# --- judge.budget_escalation ----------------------------------------------------------------------


def escalation(block: object, **params: Any) -> dict[str, Any]:
    data: dict[str, Any] = {"judge": {"budget_escalation": block}}
    if params:
        data["genrm_responses_create_params"] = {"input": [], **params}
    return data


@pytest.mark.parametrize(
    "data", [{}, {"judge": {}}, escalation(None)], ids=["absent", "no", "null"]
)
def test_budget_escalation_is_off_when_absent_or_null(data: dict[str, Any]) -> None:
    s = load(data)
    assert s.judge.budget_escalation is None
    assert s.output_budget == 16384  # the shipped create params


def test_budget_escalation_empty_block_takes_the_defaults() -> None:
    block = load(escalation({})).judge.budget_escalation
    assert block == BudgetEscalation(factor=2.0, max_output_tokens=32768)


def test_budget_escalation_values_and_steps() -> None:
    s = load(escalation({"factor": 1.5, "max_output_tokens": 4000}, max_output_tokens=1341))
    block = s.judge.budget_escalation
    assert block is not None and s.output_budget == 1341
    assert [block.next_budget(b) for b in (1341, 2012, 3018, 4000)] == [2012, 3018, 4000, 4000]
    assert load(escalation({"factor": 3})).judge.budget_escalation == BudgetEscalation(factor=3.0)


@pytest.mark.parametrize("factor", [1, 1.0, 0.5, 0, -2, math.inf, math.nan])
def test_budget_escalation_factor_must_exceed_one(factor: float) -> None:
    err = config_error(escalation({"factor": factor}))
    assert (err.key, err.message) == ("judge.budget_escalation.factor", "must be > 1 and finite")


def test_budget_escalation_cap_below_the_budget_is_an_error() -> None:
    err = config_error(escalation({"max_output_tokens": 1340}, max_output_tokens=1341))
    assert err.key == "judge.budget_escalation.max_output_tokens"
    assert err.message == (
        "the cap must be >= genrm_responses_create_params.max_output_tokens (1341)"
    )
    equal = load(escalation({"max_output_tokens": 1341}, max_output_tokens=1341))
    assert equal.judge.budget_escalation == BudgetEscalation(max_output_tokens=1341)


@pytest.mark.parametrize("budget", [None, True, 0, -5, 1341.0, "1341"])
def test_budget_escalation_needs_an_integer_budget(budget: object) -> None:
    params = {} if budget is None else {"max_output_tokens": budget}
    data = escalation({}) | {"genrm_responses_create_params": {"input": [], **params}}
    err = config_error(data)
    assert err.key == "genrm_responses_create_params.max_output_tokens"
    assert err.message == (
        "judge.budget_escalation needs a configured output budget (an integer >= 1)"
    )
    off = load({"genrm_responses_create_params": {"input": [], **params}})
    assert off.output_budget is None  # without escalation such a budget is passed through as is


@pytest.mark.parametrize(
    ("block", "key"),
    [
        ({"max_output_tokens": 0}, "judge.budget_escalation.max_output_tokens"),
        ({"max_output_tokens": "32768"}, "judge.budget_escalation.max_output_tokens"),
        ({"factor": "2"}, "judge.budget_escalation.factor"),
        ({"cap": 4096}, "judge.budget_escalation.cap"),
        (2.0, "judge.budget_escalation"),
    ],
)
def test_budget_escalation_bad_values(block: object, key: str) -> None:
    assert config_error(escalation(block)).key == key


def test_budget_escalation_from_a_file(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "genrm_responses_create_params:\n  input: []\n  max_output_tokens: 1341\n"
        "judge:\n  budget_escalation:\n    factor: 2.0\n    max_output_tokens: 32768\n",
    )
    s = load_settings(path)
    assert s.judge.budget_escalation == BudgetEscalation(factor=2.0, max_output_tokens=32768)
    bad = write(tmp_path, "judge:\n  budget_escalation:\n    max_output_tokens: 100\n", "b.yaml")
    assert file_error(bad).key == "judge.budget_escalation.max_output_tokens"
