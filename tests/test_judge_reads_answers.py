"""The judge always reads the answers (issue 28 item 1): the judge APIs that put them in the
prompt, the check on the prompt tokens the judge reports (judge/answer_check.py) at the fleet,
and the judge's token counters; against an in-memory "plain OpenAI server" that counts only what its
model would see, and against the simulated judge standing in for Gym's genrm_model server."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import trio
from asgi_judges import plain_openai_server

from genrm_trio.config import settings_from_mapping
from genrm_trio.judge.answer_check import (
    MAX_BYTES_PER_TOKEN,
    MAX_PROMPTS,
    MIN_DIFFERENCE_BYTES,
    AnswerCheck,
)
from genrm_trio.judge.apis import interpret_chat, interpret_responses, judge_api
from genrm_trio.judge.base import JudgeCall, ReplyStatus
from genrm_trio.judge.factory import make_judge
from genrm_trio.metrics import Metrics
from genrm_trio.testing.asgi import sim_asgi_app
from genrm_trio.testing.network import MemoryNetwork, serve_asgi

VERDICT = '{"score_1": 4, "score_2": 2, "ranking": 2}'
HISTORY = [{"role": "user", "content": "Which answer is better?"}]


def call(answer_1: str, answer_2: str, history: list[dict[str, str]] = HISTORY) -> JudgeCall:
    return JudgeCall(history, answer_1, answer_2, None)


# --- the check, pure ------------------------------------------------------------------------------


def test_equal_prompt_tokens_for_answers_that_differ_by_hundreds_of_bytes() -> None:
    check = AnswerCheck()
    short, long = ("a", "b"), ("a" * 400, "b")
    assert check.observe(HISTORY, None, short, 31) is None
    reason = check.observe(HISTORY, None, long, 31)
    assert reason == (
        "two comparisons of one prompt had 31 and 31 prompt tokens for answers of 2 and 401 "
        "bytes: the prompt does not grow with the answers"
    )
    assert (check.finding, check.prompts_unread) == (reason, 1)
    # found once: later evidence counts prompts, says nothing more
    assert check.observe(HISTORY, None, ("c" * 900, "d"), 31) is None
    other = [{"role": "user", "content": "another prompt"}]
    assert check.observe(other, None, short, 20) is None
    assert check.observe(other, None, long, 20) is None
    assert (check.finding, check.prompts_unread) == (reason, 2)


def test_prompt_tokens_that_grow_with_the_answers_are_fine() -> None:
    check = AnswerCheck()
    for size in (10, 400, 2000, 4000):
        # 4 bytes a token, as real tokenizers do on text
        assert check.observe(HISTORY, "be brief", ("x" * size, "y"), 50 + size // 4) is None
    # the loosest growth still accepted: one token per MAX_BYTES_PER_TOKEN bytes
    step = MIN_DIFFERENCE_BYTES
    assert check.observe([], None, ("", ""), 10) is None
    assert check.observe([], None, ("x" * step, ""), 10 + step // MAX_BYTES_PER_TOKEN) is None
    assert (check.finding, check.prompts_unread) == (None, 0)


def test_small_differences_prove_nothing() -> None:
    check = AnswerCheck()
    assert check.observe(HISTORY, None, ("a", "b"), 31) is None
    assert check.observe(HISTORY, None, ("a" * (MIN_DIFFERENCE_BYTES - 1), "b"), 31) is None
    assert check.finding is None


def test_fewer_prompt_tokens_than_the_answers_alone_need() -> None:
    check = AnswerCheck()
    answers = ("x" * 700, "y" * 700)  # 1400 bytes: at least 44 tokens at 32 bytes a token
    reason = check.observe(HISTORY, None, answers, 31)
    assert reason == (
        "the prompt had 31 tokens, fewer than the 1400 bytes of the two answers alone need "
        "(at most 32 bytes a token)"
    )
    assert AnswerCheck().observe(HISTORY, None, answers, 44) is None


def test_the_memory_is_bounded() -> None:
    check = AnswerCheck()
    for n in range(3 * MAX_PROMPTS):
        check.observe([{"role": "user", "content": str(n)}], None, ("a", "b"), 5)
    assert len(check._seen) <= MAX_PROMPTS


# --- the request bodies ---------------------------------------------------------------------------


def test_openai_responses_puts_the_answers_in_input_and_never_streams() -> None:
    api = judge_api("openai_responses", {"model": "m", "max_output_tokens": 64})
    body = api.body(JudgeCall(HISTORY, "one", "two", "be brief"))
    assert body == {
        "model": "m",
        "max_output_tokens": 64,
        "stream": False,
        "input": [
            {"role": "user", "content": "Which answer is better?", "type": "message"},
            {"role": "principle", "content": "be brief", "type": "message"},
            {"role": "response_1", "content": "one", "type": "message"},
            {"role": "response_2", "content": "two", "type": "message"},
        ],
    }
    assert (api.name, api.path, api.custom_roles) == ("openai_responses", "/responses", True)


def test_chat_never_streams_and_genrm_model_is_gyms_protocol() -> None:
    chat = judge_api("chat_completions", {}).body(call("one", "two"))
    assert chat["stream"] is False
    assert [m["role"] for m in chat["messages"]] == ["user", "response_1", "response_2"]
    gym = judge_api("responses", {}).body(call("one", "two"))  # the earlier name
    assert gym["metadata"] == {"response_1": "one", "response_2": "two"}
    assert "stream" not in gym  # Gym's genrm_model protocol, unchanged
    assert judge_api("genrm_model", {}).body(call("one", "two")) == gym


def test_reasoning_tokens_where_the_api_reports_them() -> None:
    responses = interpret_responses(
        {
            "status": "completed",
            "output": [{"type": "message", "content": [{"type": "output_text", "text": "x"}]}],
            "usage": {
                "input_tokens": 10,
                "output_tokens": 7,
                "output_tokens_details": {"reasoning_tokens": 5},
            },
        }
    )
    assert (responses.input_tokens, responses.output_tokens, responses.reasoning_tokens) == (
        10,
        7,
        5,
    )
    chat = interpret_chat(
        {
            "choices": [{"message": {"content": "x"}, "finish_reason": "stop"}],
            "usage": {
                "prompt_tokens": 3,
                "completion_tokens": 4,
                "completion_tokens_details": {"reasoning_tokens": 2},
            },
        }
    )
    assert (chat.input_tokens, chat.output_tokens, chat.reasoning_tokens) == (3, 4, 2)
    plain = interpret_chat(
        {
            "choices": [{"message": {"content": "x"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 4},
        }
    )
    assert plain.reasoning_tokens is None


def test_a_chat_reply_cut_at_length_keeps_its_text_and_says_so() -> None:
    cut = interpret_chat(
        {
            "choices": [{"message": {"content": VERDICT + " and more"}, "finish_reason": "length"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 4},
        }
    )
    assert cut.status is ReplyStatus.BUDGET_EXHAUSTED  # never a completed answer
    assert (cut.text, cut.partial) == ("", VERDICT + " and more")
    assert cut.cut_by == "finish_reason=length (the reply reached max_tokens)"


# --- at the fleet, against servers ----------------------------------------------------------------


ANSWERS = [("a short answer", "b"), ("a much longer answer " * 30, "b")]


async def judged(api: str, app: Any) -> tuple[Any, Metrics]:
    """Two comparisons of one prompt by a judge of `judge.api` `api` served by `app`."""
    settings = settings_from_mapping(
        {"judge": {"base_url": "http://judge.test:8000/v1", "api": api}}
    )
    fleet = make_judge(settings, backend=MemoryNetwork(serve_asgi(app)))
    metrics = Metrics()
    metrics.watch_replicas(fleet.replica_stats)
    with trio.fail_after(5):
        for answers in ANSWERS:
            reply = await fleet.attempt(call(*answers))
            assert reply.status is ReplyStatus.COMPLETED
    await fleet.aclose()
    return fleet, metrics


def unread_metric(metrics: Metrics) -> float | None:
    return metrics.registry.get_sample_value(
        "genrm_trio_judge_replica_answers_unread_prompts_total", {"replica": "judge.test:8000"}
    )


async def test_genrm_model_at_a_plain_server_is_found_at_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    seen: list[int] = []
    with caplog.at_level(logging.ERROR, "genrm_trio.judge"):
        fleet, metrics = await judged("genrm_model", plain_openai_server(seen))
    assert seen[0] == seen[1]  # the model never saw the answers
    [stats] = fleet.replica_stats()
    assert stats.answers_unread is not None and stats.prompts_unread == 1
    assert unread_metric(metrics) == 1.0
    [record] = caplog.records
    assert record.levelno == logging.ERROR
    assert record.getMessage() == (
        "the judge does not read the answers (replica judge.test:8000): two comparisons of one "
        f"prompt had {seen[0]} and {seen[0]} prompt tokens for answers of 15 and 631 bytes: the "
        "prompt does not grow with the answers. Fix: judge.api genrm_model sends the answers in "
        "metadata, which only Gym's genrm_model server shows the model; for vLLM or any other "
        "OpenAI-compatible server set judge.api: chat_completions (or openai_responses)"
    )


@pytest.mark.parametrize("api", ["chat_completions", "openai_responses"])
async def test_the_apis_for_plain_servers_show_the_answers(
    api: str, caplog: pytest.LogCaptureFixture
) -> None:
    seen: list[int] = []
    with caplog.at_level(logging.ERROR, "genrm_trio.judge"):
        fleet, metrics = await judged(api, plain_openai_server(seen))
    assert seen[1] - seen[0] == (len(ANSWERS[1][0]) - len(ANSWERS[0][0])) // 4
    [stats] = fleet.replica_stats()
    assert (stats.answers_unread, stats.prompts_unread) == (None, 0)
    assert unread_metric(metrics) == 0.0
    assert caplog.records == []
    # the token counters are the usage the server reported
    assert (stats.input_tokens, stats.output_tokens) == (sum(seen), 4)
    assert stats.reasoning_tokens == (2 if api == "openai_responses" else 0)
    sample = metrics.registry.get_sample_value
    label = {"replica": "judge.test:8000"}
    assert sample("genrm_trio_judge_replica_input_tokens_total", label) == sum(seen)
    assert sample("genrm_trio_judge_replica_output_tokens_total", label) == 4
    assert (
        sample("genrm_trio_judge_replica_reasoning_tokens_total", label) == stats.reasoning_tokens
    )


@pytest.mark.parametrize("api", ["genrm_model", "chat_completions", "openai_responses"])
async def test_no_false_alarm_where_the_answers_reach_the_prompt(api: str) -> None:
    """The simulated judge counts the answers in its prompt, as Gym's genrm_model server (which
    renders `metadata` into the prompt) does: no finding on any API."""
    fleet, metrics = await judged(api, sim_asgi_app())
    [stats] = fleet.replica_stats()
    assert (stats.answers_unread, stats.prompts_unread) == (None, 0)
    assert stats.input_tokens > 0
    assert unread_metric(metrics) == 0.0
