"""The service over real TCP on 127.0.0.1: in-process hypercorn, the simulated judge on a socket.

Real clock (real I/O lets an autojump clock fire deadlines early), every wait bounded. Covers
the partial-masking PR's validation case 14 (16 members over HTTP, one and two failed
comparisons), a 16-rollout group through the chat-completions judge API, disconnect and exact
re-attachment during collection and during judging, and graceful shutdown while judging (D28).
"""

from __future__ import annotations

import os
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any

import httpx
import pytest
import trio

from genrm_trio.app.serve import serve
from genrm_trio.config import Settings, settings_from_mapping
from genrm_trio.testing import FaultRule, SimConfig, serve_sim_judge, sim_asgi_app
from genrm_trio.testing.asgi import SimJudgeApp

SHUTTING_DOWN = "GenRM server is shutting down"


def row(rollout: int, group_id: str, answer: str, attempt: int = 0) -> dict[str, Any]:
    return {
        "responses_create_params": {
            "input": [{"role": "user", "content": "Explain why the sky is blue.", "phase": None}],
            "tools": [],
        },
        "response": {
            "id": f"resp-{group_id}-{rollout}",
            "output": [
                {
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": answer}],
                }
            ],
        },
        "_ng_group_id": group_id,
        "_ng_group_attempt": attempt,
        "_ng_rollout_index": rollout,
    }


def answers(n: int, marked: dict[int, str] | None = None) -> list[str]:
    marked = marked or {}
    return [f"answer {i} [quality={1 + i % 5}] {marked.get(i, '')}" for i in range(n)]


@dataclass
class Stack:
    base: str
    judge: SimJudgeApp
    client: httpx.AsyncClient

    async def verify_group(self, group_id: str, texts: list[str]) -> list[httpx.Response]:
        replies: list[httpx.Response | None] = [None] * len(texts)

        async def one(i: int) -> None:
            replies[i] = await self.client.post(
                f"{self.base}/verify", json=row(i, group_id, texts[i])
            )

        async with trio.open_nursery() as nursery:
            for i in range(len(texts)):
                nursery.start_soon(one, i)
        assert all(r is not None for r in replies)
        return [r for r in replies if r is not None]

    async def wait_for_state(
        self,
        group_id: str,
        state: str,
        members: int | None = None,
        waiting: int | None = None,
        *,
        within: float = 10.0,
    ) -> None:
        """Poll /cohorts until the group's cohort is in `state` (with that many members present
        and requests waiting, when given); fail after `within` seconds showing its last view."""
        views: list[dict[str, Any]] = []
        with trio.move_on_after(within):
            while True:
                cohorts = (await self.client.get(f"{self.base}/cohorts")).json()
                views = [c for c in cohorts if c["group_id"] == group_id]
                if any(
                    c["state"] == state
                    and (members is None or c["members_present"] == members)
                    and (waiting is None or c["requests_waiting"] == waiting)
                    for c in views
                ):
                    return
                await trio.sleep(0.01)
        raise AssertionError(
            f"cohort {group_id!r} not {state} (members={members}, waiting={waiting}) within "
            f"{within}s: {views}"
        )


@asynccontextmanager
async def running_stack(
    sim: SimConfig, extra: dict[str, Any] | None = None, *, api: str = "responses"
) -> AsyncIterator[Stack]:
    """The simulated judge on a socket and `serve()` on 127.0.0.1, both in this process."""
    judge_app = sim_asgi_app(sim)
    async with trio.open_nursery() as nursery:
        judge_port = await nursery.start(partial(serve_sim_judge, judge_app, port=0))
        mapping: dict[str, Any] = {
            "port": 0,
            "num_rollouts_per_prompt": 16,
            "cohort_collection_timeout_s": 20.0,
            "cohort_evaluation_timeout_s": 20.0,
            "judge_request_timeout_s": 10.0,
            "genrm_parse_retries": 1,
            "genrm_parse_retry_sleep_s": 0.0,
            "judge": {"base_url": f"http://127.0.0.1:{judge_port}/v1", "api": api},
            "server": {"shutdown_grace_s": 2.0},
        }
        mapping.update(extra or {})
        settings: Settings = settings_from_mapping(mapping)
        port = await nursery.start(partial(serve, settings))
        async with httpx.AsyncClient(trust_env=False, timeout=30.0) as client:
            yield Stack(f"http://127.0.0.1:{port}", judge_app, client)
        nursery.cancel_scope.cancel()


def masked_indices(replies: list[httpx.Response]) -> set[int]:
    assert all(r.status_code == 200 for r in replies)
    return {r.json()["_ng_rollout_index"] for r in replies if r.json()["mask_sample"]}


@pytest.mark.parametrize("api", ["responses", "chat_completions"])
async def test_sixteen_members_one_and_two_failed_comparisons(
    api: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # "[fail-first]" fails only when that answer is shown first: under circular that is the one
    # comparison (5, 6). "[fail-any]" fails both comparisons of member 5: (4, 5) and (5, 6).
    sim = SimConfig(
        rules=[
            FaultRule("http_500", match="[fail-first]", position="first"),
            FaultRule("budget_exhausted", match="[fail-any]", position="either"),
        ]
    )
    with trio.fail_after(30):
        async with running_stack(sim, api=api) as stack:
            one = await stack.verify_group("g-one", answers(16, {5: "[fail-first]"}))
            assert masked_indices(one) == {5, 6}
            two = await stack.verify_group("g-two", answers(16, {5: "[fail-any]"}))
            assert masked_indices(two) == {4, 5, 6}
            calls = stack.judge.sim.statistics().calls
    capsys.readouterr()
    # circular N=16 is 16 comparisons per group; each failing one costs A = 2 attempts; and the
    # answer probe when the engine starts watching the judge
    assert calls == (16 + 1) + (16 + 2) + 1
    for replies, masked, failed in ((one, {5, 6}, 1), (two, {4, 5, 6}, 2)):
        for reply in replies:
            body = reply.json()
            if body["_ng_rollout_index"] in masked:
                assert body["failure_kind"] == "judge_failed"
                assert body["reward"] == 0.0
                assert body["instance_config"] == {"mask_sample": True}
                assert body["_ng_failure_class"] == "judge_failed"
                assert body["failure_reason"] == body["_ng_failure_judge_error"]
                assert f"({failed} of 16 comparisons failed)" in body["failure_reason"]
                assert body["response"]["output"][0]["content"][0]["text"].startswith("answer")
            else:
                assert body["failure_kind"] is None
                assert body["genrm_failed_comparison_rate_per_group"] == failed / 16
                assert body["genrm_masked_rollout_rate_per_group"] == len(masked) / 16


async def _send_and_forget(
    client: httpx.AsyncClient, base: str, body: dict[str, Any], scope: trio.CancelScope
) -> None:
    with scope:
        await client.post(f"{base}/verify", json=body)


async def test_disconnect_during_collection_then_exact_reattachment(
    capsys: pytest.CaptureFixture[str],
) -> None:
    texts = answers(4)
    group = "g-dc-collect"
    replies: dict[int, httpx.Response] = {}
    with trio.fail_after(30):
        async with running_stack(SimConfig(), {"num_rollouts_per_prompt": 4}) as stack:

            async def member(i: int) -> None:
                replies[i] = await stack.client.post(
                    f"{stack.base}/verify", json=row(i, group, texts[i])
                )

            # a separate client, closed after the cancel, so the TCP connection really drops
            async with (
                httpx.AsyncClient(trust_env=False, timeout=30.0) as doomed,
                trio.open_nursery() as nursery,
            ):
                scope = trio.CancelScope()
                nursery.start_soon(
                    _send_and_forget, doomed, stack.base, row(0, group, texts[0]), scope
                )
                await stack.wait_for_state(group, "collecting", members=1, waiting=1)
                scope.cancel()
            # the member and its answer stay, with no request waiting; a different answer for
            # the slot is refused
            await stack.wait_for_state(group, "collecting", members=1, waiting=0)
            conflict = await stack.client.post(
                f"{stack.base}/verify", json=row(0, group, texts[0] + " regenerated")
            )
            assert conflict.status_code == 409
            assert "already has a different response" in conflict.json()["detail"]
            async with trio.open_nursery() as nursery:
                nursery.start_soon(member, 0)  # the exact retry re-attaches while collecting
                await stack.wait_for_state(group, "collecting", members=1, waiting=1)
                for i in range(1, 4):
                    nursery.start_soon(member, i)
            calls = stack.judge.sim.statistics().calls
    capsys.readouterr()
    assert sorted(replies) == [0, 1, 2, 3]
    assert {r.status_code for r in replies.values()} == {200}
    assert not masked_indices(list(replies.values()))
    assert calls == 4 + 1  # one evaluation: circular N=4; and the answer probe


async def test_disconnect_during_judging_then_exact_reattachment(
    capsys: pytest.CaptureFixture[str],
) -> None:
    texts = answers(4)
    sim = SimConfig(latency_s=0.5)
    with trio.fail_after(30):
        async with running_stack(sim, {"num_rollouts_per_prompt": 4}) as stack:
            replies: dict[int, httpx.Response] = {}

            async def member(i: int) -> None:
                replies[i] = await stack.client.post(
                    f"{stack.base}/verify", json=row(i, "g-dc-judge", texts[i])
                )

            # a separate client, closed after the cancel, so the TCP connection really drops
            async with (
                httpx.AsyncClient(trust_env=False, timeout=30.0) as doomed,
                trio.open_nursery() as nursery,
            ):
                scope = trio.CancelScope()
                nursery.start_soon(
                    _send_and_forget, doomed, stack.base, row(0, "g-dc-judge", texts[0]), scope
                )
                for i in range(1, 4):
                    nursery.start_soon(member, i)
                await stack.wait_for_state("g-dc-judge", "judging", waiting=4)
                scope.cancel()
                # the cohort keeps judging without that request; the exact retry re-attaches
                await stack.wait_for_state("g-dc-judge", "judging", members=4, waiting=3)
                nursery.start_soon(member, 0)
            calls = stack.judge.sim.statistics().calls
    capsys.readouterr()
    assert sorted(replies) == [0, 1, 2, 3]
    assert {r.status_code for r in replies.values()} == {200}
    assert not masked_indices(list(replies.values()))
    assert calls == 4 + 1  # and the answer probe


async def test_graceful_shutdown_while_judging_delivers_503s(
    capsys: pytest.CaptureFixture[str],
) -> None:
    sim = SimConfig(latency_s=10.0)
    replies: list[httpx.Response] = []
    judge_app = sim_asgi_app(sim)
    with trio.fail_after(30):
        async with trio.open_nursery() as outer:
            judge_port = await outer.start(partial(serve_sim_judge, judge_app, port=0))
            settings = settings_from_mapping(
                {
                    "port": 0,
                    "num_rollouts_per_prompt": 4,
                    "judge": {
                        "base_url": f"http://127.0.0.1:{judge_port}/v1",
                        "api": "genrm_model",
                    },
                    "server": {"shutdown_grace_s": 2.0},
                }
            )
            async with httpx.AsyncClient(trust_env=False, timeout=30.0) as client:
                async with trio.open_nursery() as nursery:
                    port = await nursery.start(partial(serve, settings))
                    base = f"http://127.0.0.1:{port}"
                    stack = Stack(base, judge_app, client)

                    async def member(i: int) -> None:
                        replies.append(
                            await client.post(f"{base}/verify", json=row(i, "g-stop", f"a{i}"))
                        )

                    for i in range(4):
                        nursery.start_soon(member, i)
                    await stack.wait_for_state("g-stop", "judging")
                    while judge_app.sim.statistics().in_flight < 4:  # noqa: ASYNC110
                        await trio.sleep(0.01)
                    os.kill(os.getpid(), signal.SIGTERM)
                # serve() returned only after the 503s went out
                with pytest.raises(httpx.ConnectError):
                    await client.get(f"{base}/health")
            # the judge saw its four calls cancelled (the client disconnected)
            while judge_app.sim.statistics().in_flight:  # noqa: ASYNC110
                await trio.sleep(0.01)
            outer.cancel_scope.cancel()
    capsys.readouterr()
    assert len(replies) == 4
    assert all(r.status_code == 503 for r in replies)
    assert all(r.json() == {"detail": SHUTTING_DOWN, "reason": "shutting_down"} for r in replies)
