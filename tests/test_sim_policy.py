"""`genrm-trio sim-judge --policy`: the simulated judge also stands in for the policy model.

Ordinary (not judge-shaped) chat and Responses requests get deterministic answers, a different
one each time a prompt comes again; judge-shaped requests are judged as before, faults included.
In-process over `httpx.ASGITransport` (no sockets).
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from genrm_trio.app import cli
from genrm_trio.testing import FaultRule, PolicyStandIn, SimConfig, sim_asgi_app
from genrm_trio.testing.asgi import SimJudgeApp

PROMPT = [{"role": "user", "content": "What is SKILL?", "type": "message"}]
JUDGE = {"input": [], "metadata": {"response_1": "first", "response_2": "second"}}


def client(app: SimJudgeApp) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://sim/v1")


def responses_text(body: dict[str, Any]) -> str:
    [message] = body["output"]
    text: str = message["content"][0]["text"]
    return text


async def answers(app: SimJudgeApp, n: int) -> list[str]:
    async with client(app) as http:
        replies = [
            await http.post("/responses", json={"model": "policy", "input": PROMPT})
            for _ in range(n)
        ]
    assert {r.status_code for r in replies} == {200}
    return [responses_text(r.json()) for r in replies]


async def test_policy_requests_get_distinct_deterministic_answers() -> None:
    first = await answers(sim_asgi_app(policy=PolicyStandIn()), 16)
    again = await answers(sim_asgi_app(policy=PolicyStandIn()), 16)
    assert first == again  # the n-th answer to a prompt is always the same
    assert len(set(first)) == 16  # a group of 16 rollouts gets 16 different answers
    other_seed = await answers(sim_asgi_app(policy=PolicyStandIn(seed=1)), 16)
    assert other_seed != first


async def test_a_policy_reply_is_a_complete_responses_object() -> None:
    app = sim_asgi_app(policy=PolicyStandIn())
    async with client(app) as http:
        reply = (await http.post("/responses", json={"model": "p", "input": "Hi"})).json()
    # what Gym's openai_model validates as openai's Response
    assert reply["object"] == "response" and reply["status"] == "completed"
    assert reply["model"] == "p"
    assert reply["output"][0]["role"] == "assistant"
    assert set(reply["usage"]) >= {"input_tokens", "output_tokens", "total_tokens"}
    assert {"parallel_tool_calls", "tool_choice", "tools"} <= set(reply)


async def test_chat_policy_requests_are_answered_and_judge_calls_still_judged() -> None:
    app = sim_asgi_app(policy=PolicyStandIn())
    async with client(app) as http:
        chat = await http.post(
            "/chat/completions", json={"model": "p", "messages": [PROMPT[0] | {"type": None}]}
        )
        judged = await http.post("/responses", json=JUDGE)
        stats = (await http.get("http://sim/stats")).json()
    assert chat.status_code == 200
    assert chat.json()["choices"][0]["message"]["content"].startswith(
        ("Short answer:", "Let me think", "## Answer", "The answer is")
    )
    assert judged.status_code == 200
    assert '"score_1"' in responses_text(judged.json())  # a verdict, not a policy answer
    # judge calls and policy calls are counted apart
    assert (stats["calls"], stats["policy_calls"], stats["bad_requests"]) == (1, 1, 0)


async def test_faults_are_the_judges_alone() -> None:
    app = sim_asgi_app(SimConfig(rules=[FaultRule(fault="http_500")]), policy=PolicyStandIn())
    async with client(app) as http:
        policy = await http.post("/responses", json={"input": PROMPT})
        judged = await http.post("/responses", json=JUDGE)
    assert (policy.status_code, judged.status_code) == (200, 500)


async def test_without_the_flag_a_policy_request_is_refused_as_before() -> None:
    async with client(sim_asgi_app()) as http:
        reply = await http.post("/responses", json={"input": PROMPT})
        stats = (await http.get("http://sim/stats")).json()
    assert reply.status_code == 400
    assert reply.json() == {"error": "metadata with response_1 and response_2 is required"}
    assert "policy_calls" not in stats


@pytest.mark.parametrize(("flags", "policy"), [([], False), (["--policy"], True)])
def test_the_flag_reaches_the_served_app(
    flags: list[str], policy: bool, monkeypatch: pytest.MonkeyPatch, restore_logging: None
) -> None:
    served: list[object] = []

    def capture(main: object, config: object, host: str, port: int) -> None:
        served.append(config)

    monkeypatch.setattr(cli.trio, "run", capture)
    assert cli.main(["sim-judge", "--port", "0", "--seed", "3", *flags]) == 0
    [config] = served
    if policy:
        assert isinstance(config, SimJudgeApp) and isinstance(config.policy, PolicyStandIn)
    else:
        assert isinstance(config, SimConfig)
