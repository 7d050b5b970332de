"""The HTTP layer through Quart's test client: the routes, statuses and templates of
docs/http-api.md."""

from __future__ import annotations

import dataclasses
import json
import logging
import math
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

import pytest
import trio
import trio.testing
from fake_engine import SCORED_RESULT, FakeEngine, Outcome
from fake_replicas import replica_stats
from http_calls import call, member, post_group
from quart import request
from quart_trio import QuartTrio

from genrm_trio.config import ConfigError, Settings, settings_from_mapping
from genrm_trio.domain.model import (
    CohortView,
    CompareFailed,
    CompareInput,
    CompareResult,
    GroupFailed,
    Masked,
    Rejection,
    RequestRejected,
    Scored,
    Unavailable,
    VerifyInput,
)
from genrm_trio.engine.engine import open_engine
from genrm_trio.http.app import create_app, replica_view
from genrm_trio.http.asgi import PUBLIC_PATHS, current_rollout_id
from genrm_trio.http.openapi import openapi_document
from genrm_trio.http.rows import failsafe_row
from genrm_trio.testing import FaultRule, SimConfig, SimJudge

TOKEN = "t0ken-for-tests"


def settings(**server: Any) -> Settings:
    return Settings.model_validate({"server": server} if server else {})


def verify_body(**extra: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "responses_create_params": {
            "input": [{"role": "user", "content": "2+2?", "type": "message", "phase": None}],
            "tools": [],
            "parallel_tool_calls": True,
        },
        "response": {"id": "resp_1", "output": [], "usage": {"input_tokens": 3}},
        "_ng_group_id": "g1",
        "_ng_rollout_index": 1,
    }
    base.update(extra)
    return base


def outcome(value: Outcome | BaseException) -> Callable[[VerifyInput], Awaitable[Outcome]]:
    async def run(item: VerifyInput) -> Outcome:
        if isinstance(value, BaseException):
            raise value
        return value

    return run


def app_for(engine: FakeEngine, **server: Any) -> QuartTrio:
    return create_app(engine, settings(**server))


# --- /verify ------------------------------------------------------------------------------------


async def test_verify_scored_row() -> None:
    engine = FakeEngine()
    body = verify_body(_ng_task_index=2, principle="p", agent_ref={"name": "a"}, _ng_rollout_id="x")
    status, row, headers = await call(app_for(engine), "/verify", body=body)
    assert status == 200
    assert headers["content-type"] == "application/json"
    assert list(row) == [
        "responses_create_params",
        "response",
        *SCORED_RESULT,
        "_ng_group_id",
        "_ng_group_attempt",
        "_ng_rollout_index",
    ]
    assert row["responses_create_params"] == body["responses_create_params"]
    assert row["response"] == body["response"]
    assert (row["_ng_group_id"], row["_ng_group_attempt"], row["_ng_rollout_index"]) == ("g1", 0, 1)
    [item] = engine.verified
    assert (item.group_id, item.rollout_index, item.task_index, item.principle) == ("g1", 1, 2, "p")
    assert item.group_attempt_given is False
    assert engine.rollout_ids == [None]


async def test_verify_reply_is_ascii_and_echoes_lone_surrogates() -> None:
    engine = FakeEngine()
    raw = (
        b'{"responses_create_params":{"input":"caf\xc3\xa9 \\udc80"},'
        b'"response":{"id":"r","text":"\\ud83d"}}'
    )
    client = app_for(engine).test_client()
    response = await client.post("/verify", data=raw)
    data = await response.get_data(as_text=False)
    assert response.status_code == 200
    assert data.isascii()
    assert data.startswith(
        b'{"responses_create_params":{"input":"caf\\u00e9 \\udc80"},'
        b'"response":{"id":"r","text":"\\ud83d"},'
    )


async def test_verify_masked_row() -> None:
    engine = FakeEngine(verify_outcome=outcome(Masked("GenRM rollout_index=1 lost a comparison")))
    body = verify_body(instance_config={"seed": 1}, _ng_rollout_id="cap", dataset="hs3")
    status, row, _ = await call(app_for(engine), "/verify", body=body)
    assert status == 200
    assert row["reward"] == 0.0
    assert row["mask_sample"] is True
    assert row["failure_kind"] == "judge_failed"
    assert row["failure_reason"] == "GenRM rollout_index=1 lost a comparison"
    assert row["_ng_failure_class"] == "judge_failed"
    assert row["_ng_failure_judge_error"] == row["failure_reason"]
    assert row["instance_config"] == {"seed": 1, "mask_sample": True}
    assert row["dataset"] == "hs3"
    assert row["response"] == body["response"]
    assert "_ng_rollout_id" not in row
    assert row["principle"] is None and row["_ng_task_index"] is None
    assert row["_ng_group_attempt"] == 0


async def test_verify_judge_group_failure_is_a_failsafe_row() -> None:
    message = "GenRM masked every rollout of the group after judge failures: " + "x" * 3000
    engine = FakeEngine(verify_outcome=outcome(GroupFailed("judge", message)))
    status, row, _ = await call(app_for(engine), "/verify", body=verify_body())
    assert status == 200
    assert row["mask_sample"] is True
    assert row["failure_reason"] == message[:2000]


async def test_verify_cohort_group_failure_is_503() -> None:
    message = "GenRM cohort 'group_id::g1::group_attempt::0' is missing rollout_index=[2, 3]"
    engine = FakeEngine(verify_outcome=outcome(GroupFailed("cohort", message)))
    status, reply, headers = await call(app_for(engine), "/verify", body=verify_body())
    assert (status, reply) == (503, {"detail": message, "reason": "group_failed"})
    assert headers["content-type"] == "application/json"


@pytest.mark.parametrize(
    ("reason", "retry_after_s", "status", "detail", "extra"),
    [
        (
            Rejection.CONFLICT,
            None,
            409,
            "GenRM group 'g1' attempt 0 was superseded by attempt 1",
            {},
        ),
        (Rejection.INVALID, None, 422, "_ng_rollout_index must be in [0, 4); got 7", {}),
        (Rejection.INVALID, None, 422, "score_source=rubric_mean requires expected_rubric_ids", {}),
        (Rejection.UNAVAILABLE, None, 503, "GenRM server is shutting down", {}),
        (
            Rejection.UNAVAILABLE,
            1.0,
            503,
            "GenRM server is at capacity (4096 active cohorts); retry later",
            {"Retry-After": "1"},
        ),
        (Rejection.UNAVAILABLE, 2.5, 503, "retry later", {"Retry-After": "3"}),
    ],
)
async def test_verify_rejections(
    reason: Rejection, retry_after_s: float | None, status: int, detail: str, extra: dict[str, str]
) -> None:
    """The HTTP layer alone turns an engine rejection into a status and headers; a 503 carries
    the rejection's machine-readable reason."""
    unavailable: Unavailable | None = None
    if reason is Rejection.UNAVAILABLE:
        unavailable = "shutting_down" if retry_after_s is None else "at_capacity"
    rejection = RequestRejected(
        reason, detail, retry_after_s=retry_after_s, unavailable=unavailable
    )
    engine = FakeEngine(verify_outcome=outcome(rejection))
    got, reply, headers = await call(app_for(engine), "/verify", body=verify_body())
    expected: dict[str, object] = {"detail": detail}
    if unavailable is not None:
        expected["reason"] = unavailable
    assert (got, reply) == (status, expected)
    for key, value in extra.items():
        assert headers[key.lower()] == value
    if not extra:
        assert "retry-after" not in headers


async def test_verify_schema_and_json_errors_are_422_and_never_reach_the_engine() -> None:
    engine = FakeEngine()
    app = app_for(engine)
    status, reply, _ = await call(app, "/verify", body=verify_body(_ng_group_attempt=-1))
    assert status == 422
    assert reply == {
        "detail": [
            {
                "type": "greater_than_equal",
                "loc": ["body", "_ng_group_attempt"],
                "msg": "Input should be greater than or equal to 0",
            }
        ]
    }
    body = verify_body()
    body["responses_create_params"]["input"][0]["role"] = "tool"
    status, reply, _ = await call(app, "/verify", body=body)
    assert status == 422
    assert reply["detail"][0]["loc"] == ["body", "responses_create_params", "input", 0, "role"]
    for raw in (b"", b"{", b'{"a": NaN}', b"\xff", b"[" * 513 + b"]" * 513, b"{} []"):
        status, reply, _ = await call(app, "/verify", raw=raw)
        assert status == 422
        [item] = reply["detail"]
        assert (item["type"], item["loc"]) == ("json_invalid", ["body"])
    assert engine.verified == []


async def test_unexpected_errors_are_500_with_a_fixed_body(
    caplog: pytest.LogCaptureFixture,
) -> None:
    engine = FakeEngine(verify_outcome=outcome(RuntimeError("secret internals")))
    with caplog.at_level(logging.ERROR, logger="genrm_trio.http"):
        status, reply, headers = await call(app_for(engine), "/verify", body=verify_body())
    assert (status, reply) == (500, {"detail": "internal error"})
    assert headers["content-type"] == "application/json"
    assert "secret internals" in caplog.text  # the traceback goes to the log only


async def test_non_finite_reward_is_a_bug_not_a_reply() -> None:
    engine = FakeEngine(verify_outcome=outcome(Scored({**SCORED_RESULT, "reward": math.nan})))
    status, reply, _ = await call(app_for(engine), "/verify", body=verify_body())
    assert (status, reply) == (500, {"detail": "internal error"})


async def test_exception_group_from_the_engine_is_500() -> None:
    engine = FakeEngine(
        verify_outcome=outcome(ExceptionGroup("boom", [ValueError("a"), KeyError("b")]))
    )
    status, reply, _ = await call(app_for(engine), "/verify", body=verify_body())
    assert (status, reply) == (500, {"detail": "internal error"})


async def test_client_disconnect_cancels_only_the_handler() -> None:
    started = trio.Event()
    cancelled = trio.Event()

    async def hang(item: VerifyInput) -> Outcome:
        started.set()
        try:
            await trio.sleep_forever()
        except trio.Cancelled:
            cancelled.set()
            raise
        raise AssertionError("unreachable")

    engine = FakeEngine(verify_outcome=hang)
    app = app_for(engine)
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/ng-rollout/r9/verify",
        "raw_path": b"/ng-rollout/r9/verify",
        "query_string": b"",
        "root_path": "",
        "headers": [(b"content-type", b"application/json")],
        "client": ("127.0.0.1", 5000),
        "server": ("127.0.0.1", 8100),
    }
    incoming = [{"type": "http.request", "body": json.dumps(verify_body()).encode()}]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        if incoming:
            return incoming.pop(0)
        await started.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    with trio.fail_after(5):
        asgi: Any = app
        await asgi(scope, receive, send)  # returns once the handler is cancelled
    assert cancelled.is_set()
    assert sent == []
    assert engine.rollout_ids == ["r9"]


# --- /compare -----------------------------------------------------------------------------------

COMPARE = {
    "conversation_history": [{"role": "user", "content": "hi"}],
    "response_objs": [{"id": "a"}, {"id": "b"}],
}


async def test_compare_success() -> None:
    result = CompareResult(
        rewards=[4.0, 2.5],
        comparison_results=[
            {
                "response_i": 0,
                "response_j": 1,
                "judge_idx": 0,
                "score_1": 4,
                "score_2": 2,
                "ranking": 2,
            }
        ],
        metrics={"mean_individual_score": 3.25, "std_individual_score": 0.75},
    )

    async def run(item: CompareInput) -> CompareResult:
        return result

    engine = FakeEngine(compare_outcome=run)
    status, reply, _ = await call(
        app_for(engine), "/compare", body={**COMPARE, "expected_rubric_ids": [2, 1, 2]}
    )
    assert status == 200
    assert reply == {
        "rewards": [4.0, 2.5],
        "comparison_results": result.comparison_results,
        "metrics": result.metrics,
    }
    [item] = engine.compared
    assert item.expected_rubric_ids == (1, 2)
    assert item.history == COMPARE["conversation_history"]


async def test_compare_small_batch_from_engine() -> None:
    status, reply, _ = await call(
        app_for(FakeEngine()), "/compare", body={**COMPARE, "response_objs": [{"id": "a"}]}
    )
    assert (status, reply) == (200, {"rewards": [3.0], "comparison_results": None, "metrics": None})


@pytest.mark.parametrize(
    ("exc", "status", "detail"),
    [
        (CompareFailed("JudgeHTTPError: HTTP 500 deadline=1800.0s"), 503, None),
        (CompareFailed("GenRM compare deadline exceeded after 1800.0s"), 503, None),
        (
            RequestRejected(
                Rejection.INVALID, "score_source=rubric_mean requires expected_rubric_ids"
            ),
            422,
            None,
        ),
        (RuntimeError("bug"), 500, "internal error"),
    ],
)
async def test_compare_failures(exc: Exception, status: int, detail: str | None) -> None:
    async def run(item: CompareInput) -> CompareResult:
        raise exc

    engine = FakeEngine(compare_outcome=run)
    got, reply, _ = await call(app_for(engine), "/compare", body=COMPARE)
    assert got == status
    expected: dict[str, object] = {"detail": detail if detail is not None else str(exc)}
    if status == 503:
        expected["reason"] = "compare_failed"
    assert reply == expected


async def test_compare_bad_role_is_422() -> None:
    body = {**COMPARE, "conversation_history": [{"role": "principle", "content": "x"}]}
    engine = FakeEngine()
    status, reply, _ = await call(app_for(engine), "/compare", body=body)
    assert status == 422
    assert reply["detail"][0]["loc"] == ["body", "conversation_history", 0, "role"]
    assert engine.compared == []


# --- Gym's other routes -------------------------------------------------------------------------


async def test_seed_session() -> None:
    app = app_for(FakeEngine())
    row = {"responses_create_params": {"input": "x"}, "agent_ref": {"name": "a"}, "extra": 1}
    for body in ({}, row, {"resources_session_id": "s", "episode_id": "e", "task_id": 1}):
        status, reply, _ = await call(app, "/seed_session", body=body)
        assert (status, reply) == (200, {})
    env = {"resources_session_id": "s-1", "episode_id": "e", "task_id": 3, "task_data": {}}
    assert (await call(app, "/seed_session", body=env))[:2] == (
        200,
        {"resources_session_id": "s-1"},
    )
    for bad in (b"[]", b"1", b"{"):
        status, reply, _ = await call(app, "/seed_session", raw=bad)
        assert status == 422
        assert reply["detail"][0]["loc"] == ["body"]


async def test_close_session() -> None:
    app = app_for(FakeEngine())
    body = {"resources_session_id": "s-1", "episode_id": "e"}
    assert (await call(app, "/close_session", body=body))[:2] == (
        200,
        {"resources_session_id": "s-1"},
    )
    status, reply, _ = await call(app, "/close_session", body={"episode_id": "e"})
    assert status == 422
    assert reply["detail"] == [
        {"type": "missing", "loc": ["body", "resources_session_id"], "msg": "Field required"}
    ]


async def test_reverify_mode() -> None:
    app = app_for(FakeEngine())
    assert (await call(app, "/reverify_mode", method="GET"))[:2] == (200, "unsupported")


async def test_group_settings() -> None:
    """What a client needs before it sends a group: its size and the server's two deadlines."""
    config = Settings.model_validate(
        {
            "num_rollouts_per_prompt": 4,
            "cohort_collection_timeout_s": 30.0,
            "cohort_evaluation_timeout_s": 45.5,
        }
    )
    app: Any = create_app(FakeEngine(), config)
    for prefix in ("", "/ng-rollout/r-1"):
        assert (await call(app, prefix + "/group_settings", method="GET"))[:2] == (
            200,
            {
                "num_rollouts_per_prompt": 4,
                "cohort_collection_timeout_s": 30.0,
                "cohort_evaluation_timeout_s": 45.5,
            },
        )


@pytest.mark.parametrize("path", ["/", "/health", "/healthz", "/readyz", "/livez"])
async def test_health_routes(path: str) -> None:
    app = app_for(FakeEngine())
    assert (await call(app, path, method="GET"))[:2] == (200, {"status": "ok"})
    assert (await call(app, "/ng-rollout/r-1" + path, method="GET"))[:2] == (
        200,
        {"status": "ok"},
    )


async def test_metrics_route() -> None:
    engine = FakeEngine()
    engine.metrics.masked_rollouts.labels("alone").inc(2)
    status, text, headers = await call(app_for(engine), "/metrics", method="GET")
    assert status == 200
    assert headers["content-type"].startswith("text/plain")
    for name in (
        "genrm_trio_judge_calls_total",
        "genrm_trio_judge_attempt_seconds",
        'genrm_trio_masked_rollouts_total{cause="alone"} 2.0',
        "genrm_trio_active_cohorts",
        "genrm_trio_deadline_failures_total",
        "genrm_trio_judge_budget_escalations_total 0.0",
    ):
        assert name in text


async def test_cohorts_route() -> None:
    view = CohortView(
        key="group_id::g::group_attempt::0",
        group_id="g",
        group_attempt=0,
        state="collecting",
        members_present=3,
        members_expected=4,
        requests_waiting=2,
        comparisons_total=4,
        comparisons_done=0,
        comparisons_failed=0,
        comparisons_pending=4,
        deadline="collection",
        deadline_s_left=12.5,
        age_s=7.25,
    )
    app = app_for(FakeEngine(cohorts=[view]))
    status, reply, _ = await call(app, "/cohorts", method="GET")
    assert status == 200
    assert reply == [
        {
            "key": "group_id::g::group_attempt::0",
            "group_id": "g",
            "group_attempt": 0,
            "state": "collecting",
            "members_present": 3,
            "members_expected": 4,
            "requests_waiting": 2,
            "comparisons_total": 4,
            "comparisons_done": 0,
            "comparisons_failed": 0,
            "comparisons_pending": 4,
            "deadline": "collection",
            "deadline_s_left": 12.5,
            "age_s": 7.25,
        }
    ]
    assert (await call(app_for(FakeEngine()), "/cohorts", method="GET"))[:2] == (200, [])


async def test_judge_replicas_route() -> None:
    stats = replica_stats(
        "10.0.0.2:8000",
        calls=10,
        failures=3,
        in_flight=1,
        ejected=True,
        ejections=1,
        consecutive_failures=3,
        stalls=1,
        back_in_s=4.5,
        latency_sum_s=2.0,
        latency_count=8,
        last_error="ConnectError: [Errno 111] Connection refused",
    )
    app = app_for(FakeEngine(replicas=[stats]))
    status, reply, _ = await call(app, "/judge/replicas", method="GET")
    assert status == 200
    assert reply == [
        {
            "replica": "10.0.0.2:8000",
            "url": "http://10.0.0.2:8000/v1",
            "calls": 10,
            "failures": 3,
            "in_flight": 1,
            "ejected": True,
            "ejections": 1,
            "consecutive_failures": 3,
            "stalls": 1,
            "back_in_s": 4.5,
            "latency_sum_s": 2.0,
            "latency_count": 8,
            "latency_mean_s": 0.25,
            "last_error": "ConnectError: [Errno 111] Connection refused",
            "input_tokens": 0,
            "output_tokens": 0,
            "reasoning_tokens": 0,
            "answers_unread": None,
            "prompts_unread": 0,
            "roles_refused": None,
            "context_overflows": 0,
        }
    ]
    assert (await call(app_for(FakeEngine()), "/judge/replicas", method="GET"))[:2] == (200, [])


async def test_readyz_is_503_while_the_judge_does_not_read_the_answers() -> None:
    reading = replica_stats("a:1", calls=4, latency_sum_s=1.0, latency_count=4)
    unread = dataclasses.replace(
        reading, replica="b:2", answers_unread="equal prompt tokens", prompts_unread=1
    )
    assert (await call(app_for(FakeEngine(replicas=[reading])), "/readyz", method="GET"))[:2] == (
        200,
        {"status": "ok"},
    )
    status, reply, _ = await call(
        app_for(FakeEngine(replicas=[reading, unread])), "/readyz", method="GET"
    )
    assert status == 503
    assert reply == {
        "status": "not ready",
        "reason": "the judge does not read the answers (replica b:2): equal prompt tokens. "
        "Fix: judge.api genrm_model sends the answers in metadata, which only Gym's genrm_model "
        "server shows the model; for vLLM or any other OpenAI-compatible server set judge.api: "
        "chat_completions (or openai_responses)",
    }
    # the other health routes stay 200: the process is alive
    health = await call(app_for(FakeEngine(replicas=[unread])), "/healthz", method="GET")
    assert health[:2] == (200, {"status": "ok"})


async def test_readyz_is_503_while_no_judge_replica_can_be_reached() -> None:
    why = "judge unreachable for 17s: no judge replica can be reached"
    status, reply, _ = await call(app_for(FakeEngine(unreachable=why)), "/readyz", method="GET")
    assert (status, reply) == (503, {"status": "not ready", "reason": why})
    for path in ("/", "/health", "/healthz", "/livez"):  # alive all the same
        health = await call(app_for(FakeEngine(unreachable=why)), path, method="GET")
        assert health[:2] == (200, {"status": "ok"})


async def test_openapi_route() -> None:
    status, doc, _ = await call(app_for(FakeEngine()), "/openapi.json", method="GET")
    assert status == 200
    assert doc["openapi"] == "3.1.0"
    assert doc["info"]["title"] == "genrm-trio"
    assert "/verify" in doc["paths"] and "/compare" in doc["paths"]
    assert "VerifyBody" in doc["components"]["schemas"]


# --- /aggregate_metrics --------------------------------------------------------------------------


async def aggregate(rows: Any) -> tuple[int, Any]:
    status, reply, _ = await call(
        app_for(FakeEngine()), "/aggregate_metrics", body={"verify_responses": rows}
    )
    return status, reply


async def test_aggregate_empty() -> None:
    assert await aggregate([]) == (
        200,
        {"group_level_metrics": [], "agent_metrics": {}, "key_metrics": {}},
    )


async def test_aggregate_worked_example_with_masked_rows() -> None:
    rows = [
        {"reward": 1.0, "_ng_task_index": 0, "_ng_rollout_index": 0, "x": 2, "mask_sample": False},
        {"reward": 3.0, "_ng_task_index": 0, "_ng_rollout_index": 1, "name": "text"},
        {"reward": 0.0, "_ng_task_index": 0, "mask_sample": True, "x": 100},
        {"reward": 0.0, "_ng_task_index": 1, "mask_sample": True},
        {"reward": 5.0, "_ng_task_index": 2, "flag": True, "_ng_group_attempt": 7},
    ]
    status, reply = await aggregate(rows)
    assert status == 200
    agent = reply["agent_metrics"]
    assert agent == {
        "mean/reward": 3.0,
        "mean/x": 2.0,
        "max/reward": 5.0,
        "max/x": 2,
        "min/reward": 1.0,
        "min/x": 2,
        "median/reward": 3.0,
        "median/x": 2.0,
        "std/reward": 2.0,
        "std/x": 0.0,
        "coverage/measured_rollouts": 3,
        "coverage/masked_rollouts": 2,
        "coverage/measured_tasks": 2,
        "coverage/fully_masked_tasks": 1,
    }
    assert reply["key_metrics"] == {"mean/reward": 3.0, "mean/x": 2.0}
    groups = reply["group_level_metrics"]
    assert [g["_ng_task_index"] for g in groups] == [0, 2]
    assert groups[0]["mean/reward"] == 2.0
    assert groups[0]["std/reward"] == pytest.approx(math.sqrt(2))
    assert groups[0]["median/reward"] == 2.0
    assert groups[0]["mean/x"] == 2.0
    assert groups[1] == {
        "_ng_task_index": 2,
        "mean/reward": 5.0,
        "max/reward": 5.0,
        "min/reward": 5.0,
        "median/reward": 5.0,
        "std/reward": 0.0,
    }


async def test_aggregate_without_masking_has_no_coverage_keys() -> None:
    rows = [{"reward": 1.0}, {"reward": 2.0}, {"reward": 4.0}, {"reward": 3.0}]
    status, reply = await aggregate(rows)
    assert status == 200
    assert reply["agent_metrics"]["median/reward"] == 2.5
    assert reply["agent_metrics"]["mean/reward"] == 2.5
    assert not any(k.startswith("coverage/") for k in reply["agent_metrics"])
    assert [g["_ng_task_index"] for g in reply["group_level_metrics"]] == [0]


async def test_aggregate_all_masked() -> None:
    status, reply = await aggregate([{"reward": 0.0, "mask_sample": True, "_ng_task_index": 4}])
    assert status == 200
    assert reply == {
        "group_level_metrics": [],
        "agent_metrics": {
            "coverage/measured_rollouts": 0,
            "coverage/masked_rollouts": 1,
            "coverage/measured_tasks": 0,
            "coverage/fully_masked_tasks": 1,
        },
        "key_metrics": {},
    }


async def test_aggregate_bad_bodies() -> None:
    app = app_for(FakeEngine())
    for body, loc in [
        ([], ["body"]),
        ({}, ["body", "verify_responses"]),
        ({"verify_responses": {}}, ["body", "verify_responses"]),
        ({"verify_responses": [{}, 3]}, ["body", "verify_responses", 1]),
    ]:
        status, reply, _ = await call(app, "/aggregate_metrics", body=body)
        assert status == 422
        assert reply["detail"][0]["loc"] == loc


# --- routing, prefix, errors --------------------------------------------------------------------


async def test_not_found_and_method_not_allowed_are_json() -> None:
    app = app_for(FakeEngine())
    assert await call(app, "/nope", method="GET") == (
        404,
        {"detail": "Not Found"},
        {"content-type": "application/json", "content-length": "22"},
    )
    status, reply, headers = await call(app, "/verify", method="GET")
    assert (status, reply) == (405, {"detail": "Method Not Allowed"})
    assert "POST" in headers["allow"]
    assert headers["content-type"] == "application/json"
    status, reply, _ = await call(app, "/health", method="POST")
    assert (status, reply) == (405, {"detail": "Method Not Allowed"})
    status, reply, _ = await call(app, "/verify", method="OPTIONS")
    assert (status, reply) == (405, {"detail": "Method Not Allowed"})


@pytest.mark.parametrize("rollout_id", ["abc", "A1", "r.1_x-2", "0"])
async def test_prefix_sets_the_rollout_id(rollout_id: str) -> None:
    engine = FakeEngine()
    app = app_for(engine)
    status, _, _ = await call(app, f"/ng-rollout/{rollout_id}/verify", body=verify_body())
    assert status == 200
    status, _, _ = await call(app, f"/ng-rollout/{rollout_id}/compare", body=COMPARE)
    assert status == 200
    assert engine.rollout_ids == [rollout_id, rollout_id]
    assert current_rollout_id.get() is None
    status, _, _ = await call(app, "/verify", body=verify_body())
    assert engine.rollout_ids[-1] is None


@pytest.mark.parametrize(
    "path",
    [
        "/ng-rollout/-bad/verify",
        "/ng-rollout/.x/verify",
        "/ng-rollout/a%20b/verify",
        "/ng-rollout//verify",
        "/ng-rollout/ok/unknown",
        "/ng-rollout/ok/ng-rollout/x/verify",
    ],
)
async def test_prefix_bad_ids_and_unknown_routes_are_404(path: str) -> None:
    engine = FakeEngine()
    status, reply, _ = await call(app_for(engine), path, body=verify_body())
    assert (status, reply) == (404, {"detail": "Not Found"})
    assert engine.verified == []


# --- body limit ---------------------------------------------------------------------------------


async def test_413_from_content_length() -> None:
    engine = FakeEngine()
    app = app_for(engine, max_body_bytes=100)
    raw = json.dumps(verify_body(pad="x" * 200)).encode()
    status, reply, headers = await call(
        app, "/verify", raw=raw, headers={"Content-Length": str(len(raw))}
    )
    assert (status, reply) == (413, {"detail": "request body exceeds 100 bytes"})
    assert headers["content-type"] == "application/json"
    assert engine.verified == []


async def test_413_while_streaming() -> None:
    engine = FakeEngine()
    app = app_for(engine, max_body_bytes=100)
    client = app.test_client()
    with trio.fail_after(5):
        async with client.request("/compare", method="POST") as connection:
            for _ in range(3):
                await connection.send(b" " * 40)
            await connection.send_complete()
            response = await connection.as_response()
    assert response.status_code == 413
    assert json.loads(await response.get_data()) == {"detail": "request body exceeds 100 bytes"}
    assert engine.compared == []


async def test_body_at_the_limit_is_accepted() -> None:
    raw = json.dumps(COMPARE).encode()
    app = app_for(FakeEngine(), max_body_bytes=len(raw))
    status, _, _ = await call(app, "/compare", raw=raw, headers={"Content-Length": str(len(raw))})
    assert status == 200
    client = app.test_client()
    async with client.request("/compare", method="POST") as connection:
        await connection.send(raw[:10])
        await connection.send(raw[10:])
        await connection.send_complete()
        response = await connection.as_response()
    assert response.status_code == 200


# --- bearer auth (docs/http-api.md, "Authentication") --------------------------------------------


@pytest.fixture
def auth_app(monkeypatch: pytest.MonkeyPatch) -> tuple[QuartTrio, FakeEngine]:
    monkeypatch.setenv("GENRM_TEST_TOKEN", TOKEN)
    engine = FakeEngine()
    return app_for(engine, api_key_env="GENRM_TEST_TOKEN"), engine


PROTECTED: list[tuple[str, str]] = [
    ("POST", "/verify"),
    ("POST", "/compare"),
    ("POST", "/seed_session"),
    ("POST", "/close_session"),
    ("POST", "/aggregate_metrics"),
    ("GET", "/reverify_mode"),
    ("GET", "/metrics"),
    ("GET", "/cohorts"),
    ("GET", "/judge/replicas"),
    ("GET", "/openapi.json"),
    ("POST", "/ng-rollout/r1/verify"),
    ("GET", "/unknown"),
]
# and every other route the OpenAPI document lists (which is every route served:
# tests/test_http_fast_path.py), so that a new route is refused here without a list of its own
PROTECTED += [
    (method.upper(), path)
    for path, operations in openapi_document(title="t", version="1", auth=True)["paths"].items()
    if path not in PUBLIC_PATHS
    for method in operations
    if (method.upper(), path) not in PROTECTED
]


@pytest.mark.parametrize(("method", "path"), PROTECTED)
@pytest.mark.parametrize(
    "header",
    [None, "", "Bearer", "Bearer wrong", f"Basic {TOKEN}", f"Bearer {TOKEN}x", f"Bearer{TOKEN}"],
)
async def test_auth_refuses(
    auth_app: tuple[QuartTrio, FakeEngine], method: str, path: str, header: str | None
) -> None:
    app, engine = auth_app
    headers = {} if header is None else {"Authorization": header}
    status, reply, got = await call(app, path, method=method, body={}, headers=headers)
    assert (status, reply) == (401, {"detail": "missing or invalid bearer token"})
    assert got["www-authenticate"] == "Bearer"
    assert engine.verified == [] and engine.compared == []


async def test_auth_accepts(auth_app: tuple[QuartTrio, FakeEngine]) -> None:
    app, _ = auth_app
    for scheme in ("Bearer", "bearer"):
        headers = {"Authorization": f"{scheme} {TOKEN}"}
        status, _, _ = await call(app, "/verify", body=verify_body(), headers=headers)
        assert status == 200
        status, _, _ = await call(app, "/ng-rollout/r1/compare", body=COMPARE, headers=headers)
        assert status == 200
    status, reply, _ = await call(
        app, "/unknown", method="GET", headers={"Authorization": f"Bearer {TOKEN}"}
    )
    assert (status, reply) == (404, {"detail": "Not Found"})
    status, doc, _ = await call(
        app, "/openapi.json", method="GET", headers={"Authorization": f"Bearer {TOKEN}"}
    )
    assert status == 200 and "securitySchemes" in doc["components"]


@pytest.mark.parametrize("path", ["/", "/health", "/healthz", "/readyz", "/livez"])
async def test_auth_spares_health(auth_app: tuple[QuartTrio, FakeEngine], path: str) -> None:
    app, _ = auth_app
    assert (await call(app, path, method="GET"))[:2] == (200, {"status": "ok"})


async def test_auth_token_with_non_ascii_header(auth_app: tuple[QuartTrio, FakeEngine]) -> None:
    app, _ = auth_app
    status, _, _ = await call(
        app, "/cohorts", method="GET", headers={"Authorization": "Bearer töken"}
    )
    assert status == 401


def test_auth_env_unset_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GENRM_TEST_TOKEN", raising=False)
    with pytest.raises(ConfigError) as info:
        app_for(FakeEngine(), api_key_env="GENRM_TEST_TOKEN")
    assert info.value.key == "server.api_key_env"
    assert "GENRM_TEST_TOKEN" in str(info.value)
    monkeypatch.setenv("GENRM_TEST_TOKEN", "")
    with pytest.raises(ConfigError):
        app_for(FakeEngine(), api_key_env="GENRM_TEST_TOKEN")


async def test_debug_logging_path(caplog: pytest.LogCaptureFixture) -> None:
    app = create_app(FakeEngine(), Settings(debug_logging=True))
    # INFO: what `genrm-trio serve` and Gym's app.py log at (DEBUG records never showed there).
    with caplog.at_level(logging.INFO, logger="genrm_trio.http"):
        assert (await call(app, "/verify", body=verify_body(_ng_task_index=7)))[0] == 200
        assert (await call(app, "/compare", body=COMPARE))[0] == 200
    assert "verify task_index=7 group_id='g1' rollout_index=1 -> Scored" in caplog.text
    assert "compare rewards" in caplog.text


# --- end to end: the real engine and the in-process simulated judge ----------------------------

ROW_KEYS = {
    "responses_create_params",
    "response",
    "reward",
    "mask_sample",
    "failure_kind",
    "failure_reason",
    "reasoning_text",
    "answer_text",
    "reward_score_raw",
    "reward_rubric_aggregate_valid",
    "reward_overall_score_raw",
    "reward_overall_score",
    "reward_length_adjustment",
    "genrm_parse_failure_rate_per_group",
    "genrm_rubric_parse_failure_rate_per_group",
    "genrm_input_tokens_per_comparison_mean",
    "genrm_input_tokens_per_comparison_p50",
    "genrm_input_tokens_per_comparison_p95",
    "genrm_output_tokens_per_comparison_mean",
    "genrm_output_tokens_per_comparison_p50",
    "genrm_output_tokens_per_comparison_p95",
    "genrm_output_tokens_total_per_group",
    "genrm_max_output_tokens_hit_rate_per_group",
    "genrm_failed_comparison_rate_per_group",
    "genrm_masked_rollout_rate_per_group",
    "genrm_eager_comparison_rate_per_group",  # eager_comparisons: true, the default (D48)
    "_ng_group_id",
    "_ng_group_attempt",
    "_ng_rollout_index",
}


def e2e_settings() -> Settings:
    return Settings(
        num_rollouts_per_prompt=4,
        genrm_parse_retries=0,
        genrm_parse_retry_sleep_s=0.0,
        cohort_collection_timeout_s=60.0,
    )


async def test_e2e_group_replay_conflict_and_compare() -> None:
    judge = SimJudge(SimConfig())
    settings_ = e2e_settings()
    bodies = [member(i, f"[quality={q}] answer {i}") for i, q in enumerate((5, 1, 3, 4))]
    with trio.fail_after(20):
        async with open_engine(settings_, judge) as engine:
            app = create_app(engine, settings_)
            replies = await post_group(app, bodies)
            for i, (status, row) in enumerate(replies):
                assert status == 200
                assert set(row) == ROW_KEYS
                assert row["mask_sample"] is False
                assert row["_ng_rollout_index"] == i
                assert row["response"] == bodies[i]["response"]
            rewards = [row["reward"] for _, row in replies]
            assert rewards[0] == max(rewards) and rewards[1] == min(rewards)

            # an identical retry replays the same row without judging again
            status, again, _ = await call(app, "/verify", body=bodies[2])
            assert (status, again) == (200, replies[2][1])
            # a regenerated answer for a scored slot is a 409
            status, reply, _ = await call(app, "/verify", body=member(2, "something else"))
            assert status == 409
            assert "already has a different response for rollout_index=2" in reply["detail"]
            # a slot outside [0, N) is a 422 from the engine
            status, reply, _ = await call(app, "/verify", body=member(7, "x", group="other"))
            assert (status, reply) == (
                422,
                {"detail": "_ng_rollout_index must be in [0, 4); got 7"},
            )

            status, result, _ = await call(
                app,
                "/compare",
                body={
                    "conversation_history": [{"role": "user", "content": "Name a prime."}],
                    "response_objs": [b["response"] for b in bodies[:3]],
                },
            )
            assert status == 200
            assert len(result["rewards"]) == 3
            assert result["rewards"][0] > result["rewards"][1]
            assert isinstance(result["comparison_results"], list)
            assert "mean_individual_score" in result["metrics"]

            status, text, _ = await call(app, "/metrics", method="GET")
            assert status == 200 and "genrm_trio_cohorts_terminal_total" in text


async def test_every_key_of_a_verify_row_is_in_the_openapi_schema() -> None:
    """The rows tie the schema: with every option that adds a key on (position balance,
    Bradley–Terry with decided triangles, budget escalation, eager starts), a scored row's keys
    are exactly `VerifyRow`'s properties, and a default row holds every required one. A new row
    key missing from the schema fails here."""
    schema = openapi_document(title="t", version="1", auth=False)["components"]["schemas"]
    verify_row = schema["VerifyRow"]
    properties, required = set(verify_row["properties"]), set(verify_row["required"])
    everything = settings_from_mapping(
        {
            "num_rollouts_per_prompt": 4,
            "comparison_strategy": "all_pairs",
            "position_balance": "alternate",
            "aggregator_method": "bradley_terry",
            "judge": {"budget_escalation": {}},
            "genrm_parse_retries": 0,
            "cohort_collection_timeout_s": 60.0,
        }
    )
    with trio.fail_after(20):
        for config, group in ((everything, "every-option"), (e2e_settings(), "default")):
            async with open_engine(config, SimJudge(SimConfig())) as engine:
                app = create_app(engine, config)
                bodies = [
                    member(i, f"[quality={q}] answer {i}", group=group)
                    for i, q in enumerate((5, 1, 3, 4))
                ]
                replies = await post_group(app, bodies)
            for status, row in replies:
                assert status == 200
                assert required <= set(row) <= properties, set(row) ^ properties
                if config is everything:
                    assert set(row) == properties


def test_a_failsafe_row_has_exactly_the_schemas_keys() -> None:
    """A masked member's row (`failsafe_row`, for a body of declared fields only) and the
    `FailsafeRow` schema agree: a new request field, echoed by every failsafe row, fails here
    until the schema lists it."""
    schema = openapi_document(title="t", version="1", auth=False)["components"]["schemas"]
    failsafe = schema["FailsafeRow"]
    row = failsafe_row({"responses_create_params": {"input": []}, "response": {}}, "why")
    assert set(row) == set(failsafe["properties"]), set(row) ^ set(failsafe["properties"])
    assert set(failsafe["required"]) <= set(row)


async def test_a_judge_replica_has_exactly_the_schemas_keys() -> None:
    """`GET /judge/replicas` rows (`replica_view`) and the `JudgeReplica` schema agree."""
    stats = replica_stats("r:1")
    doc = openapi_document(title="t", version="1", auth=False)
    schema = doc["components"]["schemas"]["JudgeReplica"]
    reply = doc["paths"]["/judge/replicas"]["get"]["responses"]["200"]["content"]
    assert reply["application/json"]["schema"]["items"] == {
        "$ref": "#/components/schemas/JudgeReplica"
    }
    assert set(replica_view(stats)) == set(schema["properties"]) == set(schema["required"])


async def test_e2e_partial_masking_and_cohorts_view() -> None:
    judge = SimJudge(SimConfig(rules=[FaultRule("http_500", match="BAD")]))
    settings_ = e2e_settings()
    bodies = [member(i, f"answer {i}" + (" BAD" if i == 2 else ""), group="m") for i in range(4)]
    with trio.fail_after(20):
        async with open_engine(settings_, judge) as engine:
            app = create_app(engine, settings_)
            async with trio.open_nursery() as nursery:
                for body in bodies[:2]:
                    nursery.start_soon(partial(call, app, "/verify", body=body))
                await trio.testing.wait_all_tasks_blocked()
                status, views, _ = await call(app, "/cohorts", method="GET")
                assert status == 200
                [view] = views
                assert view["group_id"] == "m"
                assert (view["state"], view["deadline"]) == ("collecting", "collection")
                assert (view["members_present"], view["members_expected"]) == (2, 4)
                nursery.cancel_scope.cancel()
            replies = await post_group(app, bodies)
            # circular pairs (1,2) and (2,3) fail: members 1, 2, 3 are masked, 0 is scored
            statuses = [status for status, _ in replies]
            assert statuses == [200, 200, 200, 200]
            assert replies[0][1]["mask_sample"] is False
            assert replies[0][1]["genrm_masked_rollout_rate_per_group"] == 0.75
            for i in (1, 2, 3):
                row = replies[i][1]
                assert row["mask_sample"] is True
                assert row["reward"] == 0.0
                assert row["failure_kind"] == row["_ng_failure_class"] == "judge_failed"
                assert f"rollout_index={i} lost a comparison" in row["failure_reason"]
                assert row["instance_config"] == {"mask_sample": True}
                assert row["_ng_task_index"] == 0
    assert engine.active_cohorts() == []


def masked_series(metrics_text: str) -> dict[str, float]:
    """`genrm_trio_masked_rollouts_total` by its `cause` label, from a `/metrics` text."""
    from prometheus_client.parser import text_string_to_metric_families

    return {
        sample.labels["cause"]: sample.value
        for family in text_string_to_metric_families(metrics_text)
        for sample in family.samples
        if sample.name == "genrm_trio_masked_rollouts_total"
    }


async def test_masked_rollouts_total_equals_the_rows_answered_mask_sample() -> None:
    """What an operator sees is what the trainer drops: after a group with one failed pair (its
    two rollouts masked alone) and after a group whose every comparison failed (masked whole),
    the series summed equal the rows answered with `mask_sample: true`, split by cause."""
    judge = SimJudge(SimConfig(rules=[FaultRule("http_500", match="BAD", position="both")]))
    settings_ = e2e_settings()  # 4 rollouts, circular pairs (0,1) (1,2) (2,3) (3,0)
    groups = {
        "one-pair": ["BAD 0", "answer 1", "answer 2", "BAD 3"],  # only (3, 0) fails
        "whole": [f"BAD {i}" for i in range(4)],  # every comparison fails
        "clean": [f"answer {i}" for i in range(4)],
    }
    expected = {
        "one-pair": {"alone": 2.0, "whole_group": 0.0},
        "whole": {"alone": 2.0, "whole_group": 4.0},
        "clean": {"alone": 2.0, "whole_group": 4.0},
    }
    masked_rows = 0
    with trio.fail_after(20):
        async with open_engine(settings_, judge) as engine:
            app = create_app(engine, settings_)
            _, text, _ = await call(app, "/metrics", method="GET")
            assert masked_series(text) == {"alone": 0.0, "whole_group": 0.0}
            for group, answers in groups.items():
                bodies = [member(i, answer, group=group) for i, answer in enumerate(answers)]
                replies = await post_group(app, bodies)
                assert [status for status, _ in replies] == [200] * 4
                masked_rows += sum(1 for _, row in replies if row["mask_sample"] is True)
                _, text, _ = await call(app, "/metrics", method="GET")
                series = masked_series(text)
                assert series == expected[group], group
                assert sum(series.values()) == masked_rows, group
    assert masked_rows == 6


async def test_aggregate_task_index_of_any_json_type() -> None:
    rows = [
        {"reward": 1.0, "_ng_task_index": None},
        {"reward": 2.0, "_ng_task_index": "a"},
        {"reward": 3.0, "_ng_task_index": 10},
        {"reward": 4.0, "_ng_task_index": 2},
        {"reward": 5.0, "_ng_task_index": 2},
        {"reward": 0.0, "_ng_task_index": [1], "mask_sample": True},
    ]
    status, reply = await aggregate(rows)
    assert status == 200
    groups = reply["group_level_metrics"]
    assert [g["_ng_task_index"] for g in groups] == [2, 10, "a", None]
    assert groups[0]["mean/reward"] == 4.5
    assert reply["agent_metrics"]["coverage/fully_masked_tasks"] == 1
    assert reply["agent_metrics"]["coverage/measured_tasks"] == 4


async def test_aggregate_huge_integer_metric_is_422() -> None:
    status, reply, _ = await call(
        app_for(FakeEngine()),
        "/aggregate_metrics",
        raw=b'{"verify_responses": [{"reward": 1' + b"0" * 400 + b"}]}",
    )
    assert status == 422
    assert reply["detail"][0]["type"] == "number_too_large"


async def test_prefix_rewrites_path_and_raw_path_for_the_app() -> None:
    seen: list[tuple[str, bytes]] = []
    app = app_for(FakeEngine())

    @app.get("/probe-path")
    async def probe() -> str:
        seen.append((request.path, request.scope["raw_path"]))
        return "ok"

    status, _, _ = await call(app, "/ng-rollout/x_1/probe-path", method="GET")
    assert status == 200
    assert seen == [("/probe-path", b"/probe-path")]
    status, _, _ = await call(app, "/ng-rollout/x_1", method="GET")
    assert status == 200  # the bare prefix is "/"
