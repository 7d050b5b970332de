"""`genrm_trio.client` (docs/trainers.md, "The client"): against a live `genrm-trio serve` with the
simulated judge as a server (tests/genrm_server.py: its scripted fault fails the pairs of tagged
answers), under trio, asyncio and blocking; and, with httpx's mock transport, what each status
gives."""

from __future__ import annotations

import asyncio
import json
import socket
from typing import Any

import httpx
import pytest
import trio
import trio.testing
from genrm_server import COLLECT_S, PROMPT, N, Server, answers, server

from genrm_trio.client import (
    AsyncGenRMClient,
    GenRMClient,
    GenRMError,
    GenRMRequestError,
    GenRMTimeout,
    GenRMUnavailable,
    GroupSettings,
    GroupSizeError,
    Masked,
    Scored,
    one_error,
    verify_body,
)

pytestmark = pytest.mark.slow
__all__ = ["server"]  # the module's live server (a fixture)


async def compare_rewards(url: str, completions: list[str]) -> list[float]:
    """The same answers through `/compare`, the server's other route: the rewards a whole
    group gets when every comparison succeeds."""
    body = {
        "conversation_history": [{"role": "user", "content": PROMPT}],
        "response_objs": [
            verify_body(PROMPT, text, group_id="x", rollout_index=0)["response"]
            for text in completions
        ],
    }
    async with httpx.AsyncClient() as http:
        response = await http.post(url + "/compare", json=body, timeout=30)
    assert response.status_code == 200, response.text
    rewards: list[float] = response.json()["rewards"]
    return rewards


# --- a live server --------------------------------------------------------------------------------


async def test_a_whole_group_gets_the_servers_rewards_under_trio(server: Server) -> None:
    completions = answers("trio")
    async with AsyncGenRMClient(server.url) as client:
        assert await client.num_rollouts_per_prompt() == N
        rewards = await client.score_group(PROMPT, completions)
        results = await client.score_group_results(PROMPT, completions)  # a new group
    assert rewards == await compare_rewards(server.url, completions)
    assert [r.reward for r in results if type(r) is Scored] == rewards
    # every request names its attempt: the server logs no legacy (attempt-less) request
    assert "group attempt omitted" not in server.serve.log()
    assert len(set(rewards)) > 1  # the judge told the answers apart
    for index, result in enumerate(results):
        assert type(result) is Scored
        assert result.row["_ng_rollout_index"] == index
        assert result.row["mask_sample"] is False


def test_the_same_under_asyncio(server: Server) -> None:
    completions = answers("asyncio", failing={2})

    async def main() -> list[float | None]:
        async with AsyncGenRMClient(server.url) as client:
            return await client.score_group(PROMPT, completions)

    rewards = asyncio.run(main())
    # member 2's comparisons (1, 2) and (2, 3) fail: 1, 2 and 3 are masked, 0 keeps its score
    assert rewards[1:] == [None, None, None]
    assert isinstance(rewards[0], float)


def test_blocking_client_masks_only_the_failed_pairs(server: Server) -> None:
    client = GenRMClient(server.url)
    completions = answers("blocking", failing={0})
    results = client.score_group_results(PROMPT, completions)
    # (3, 0) and (0, 1) fail: 3, 0 and 1 are masked; 2 is scored
    assert [type(result) for result in results] == [Masked, Masked, Scored, Masked]
    for result in results:
        if type(result) is Masked:
            assert result.kind == "judge_failed"
            assert result.reason  # the server's failure message
            assert result.row is not None and result.row["mask_sample"] is True
    rewards = client.score_group(PROMPT, completions)
    assert rewards[0] is None and rewards[1] is None and rewards[3] is None
    assert rewards[2] == results[2].reward  # type: ignore[union-attr]


def test_a_group_whose_every_member_is_masked_is_all_none_never_zero(server: Server) -> None:
    client = GenRMClient(server.url)
    results = client.score_group_results(PROMPT, answers("all", failing=set(range(N))))
    assert all(type(result) is Masked for result in results)
    assert rewards_none(client.score_group(PROMPT, answers("all2", failing=set(range(N)))))


def rewards_none(rewards: list[float | None]) -> bool:
    return rewards == [None] * N


def test_conversational_prompts_and_completions(server: Server) -> None:
    client = GenRMClient(server.url)
    texts = answers("chat")
    plain = client.score_group(PROMPT, texts)
    chat = client.score_group(
        [{"role": "user", "content": PROMPT}],
        [[{"role": "assistant", "content": text}] for text in texts],
    )
    assert chat == plain  # the same prompt and answers, in TRL's conversational format


def test_a_group_of_the_wrong_size_is_refused_before_anything_is_sent(server: Server) -> None:
    client = GenRMClient(server.url)
    with pytest.raises(GroupSizeError, match=r"a group of 3 completions.*=4 \(nothing was sent"):
        client.score_group(PROMPT, answers("short")[:3])
    with pytest.raises(GroupSizeError, match="a group of 5"):
        client.score_group(PROMPT, [*answers("long"), "one more"])
    assert httpx.get(server.url + "/cohorts").json() == []  # no cohort was opened


async def test_a_group_missing_members_fails_at_the_servers_deadline(server: Server) -> None:
    async with AsyncGenRMClient(server.url) as client:
        started = trio.current_time()
        results = await client.score_members(
            PROMPT, list(enumerate(answers("partial")[:2])), group_id="client-partial-group"
        )
    assert trio.current_time() - started >= COLLECT_S
    assert [type(result) for result in results] == [Masked, Masked]
    for result in results:
        assert type(result) is Masked and result.kind == "group_failed"
        assert result.row is None and result.reason


def test_an_unreachable_server_raises() -> None:
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    client = GenRMClient(f"http://127.0.0.1:{port}")
    with pytest.raises(GenRMUnavailable, match="unreachable: ConnectError"):
        client.score_group(PROMPT, answers("x"))


# --- each status, through httpx's mock transport ------------------------------------------------

SETTINGS = GroupSettings(N, 10.0, 10.0)


def mock_client(handler: Any, **kwargs: Any) -> AsyncGenRMClient:
    http = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    return AsyncGenRMClient("http://genrm", http=http, group_settings=SETTINGS, **kwargs)


async def never_answers(request: httpx.Request) -> httpx.Response:
    """A server that takes the request and never replies."""
    await trio.sleep_forever()
    raise AssertionError  # pragma: no cover


def row(body: dict[str, Any], reward: float) -> dict[str, Any]:
    return {"reward": reward, "mask_sample": False, "_ng_rollout_index": body["_ng_rollout_index"]}


async def test_requests_carry_one_fresh_group_id_and_each_members_index() -> None:
    seen: list[dict[str, Any]] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        seen.append(body)
        assert request.headers["authorization"] == "Bearer k"
        return httpx.Response(200, json=row(body, float(body["_ng_rollout_index"])))

    async with mock_client(handler, api_key="k") as client:
        assert await client.score_group(PROMPT, answers("a"), principle="be brief") == [
            0.0,
            1.0,
            2.0,
            3.0,
        ]
        await client.score_group(PROMPT, answers("b"))
    first, second = seen[:N], seen[N:]
    assert {body["_ng_group_id"] for body in first} != {body["_ng_group_id"] for body in second}
    for group in (first, second):
        assert len({body["_ng_group_id"] for body in group}) == 1
        assert sorted(body["_ng_rollout_index"] for body in group) == list(range(N))
        assert {body["_ng_group_attempt"] for body in group} == {0}
    assert {body["principle"] for body in first} == {"be brief"}
    assert all("principle" not in body for body in second)
    assert first[0]["responses_create_params"] == {"input": [{"role": "user", "content": PROMPT}]}


async def test_the_group_settings_are_read_once_from_the_server() -> None:
    gets: list[str] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        if request.method == "GET":
            gets.append(request.url.path)
            return httpx.Response(
                200,
                json={
                    "num_rollouts_per_prompt": 2,
                    "cohort_collection_timeout_s": 1.0,
                    "cohort_evaluation_timeout_s": 2.0,
                },
            )
        return httpx.Response(200, json=row(json.loads(request.content), 0.5))

    http = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    async with AsyncGenRMClient("http://genrm/", http=http) as client:
        assert await client.score_group(PROMPT, ["a", "b"]) == [0.5, 0.5]
        assert await client.score_group(PROMPT, ["c", "d"]) == [0.5, 0.5]
        assert (await client.group_settings()).group_timeout_s() == 1.0 + 2.0 + 60.0
    assert gets == ["/group_settings"]
    await http.aclose()


@pytest.mark.parametrize(
    ("status", "detail"),
    [(409, "GenRM group 'g' attempt 0 was superseded by attempt 1"), (422, "bad"), (401, "no")],
)
async def test_a_refused_request_raises_with_its_status(status: int, detail: str) -> None:
    async def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, json={"detail": detail})

    async with mock_client(handler) as client:
        with pytest.raises(GenRMRequestError) as caught:
            await client.score_group(PROMPT, answers("x"))
    assert (caught.value.status, caught.value.detail) == (status, detail)


async def test_members_failing_at_once_raise_the_first_error_naming_every_one() -> None:
    arrived: list[int] = []
    everyone_in = trio.Event()

    async def handler(request: httpx.Request) -> httpx.Response:
        index = json.loads(request.content)["_ng_rollout_index"]
        arrived.append(index)
        if len(arrived) < N:
            await everyone_in.wait()  # members 0 and 1 are refused at the same moment:
        else:  # the last one in passes no checkpoint, where the first refusal would cancel it
            everyone_in.set()
        if index in (0, 1):
            return httpx.Response(409 + 13 * index, json={"detail": f"refused {index}"})
        return httpx.Response(200, json=row(json.loads(request.content), 0.5))

    async with mock_client(handler) as client:
        with pytest.raises(GenRMRequestError) as caught:  # the error itself, not a group
            await client.score_group(PROMPT, answers("x"))
    # trio wakes the members in either order: the first error is either refusal
    assert (caught.value.status, caught.value.detail) in {(409, "refused 0"), (422, "refused 1")}
    (note,) = caught.value.__notes__
    assert note.startswith("2 errors: ")
    assert set(note.removeprefix("2 errors: ").split("; ")) == {
        "GenRMRequestError: genrm-trio answered 409: refused 0",
        "GenRMRequestError: genrm-trio answered 422: refused 1",
    }


def test_one_error_reads_nested_groups_and_names_every_different_leaf() -> None:
    unreachable = [GenRMUnavailable("genrm-trio at x unreachable") for _ in range(3)]
    same = ExceptionGroup("g", [unreachable[0], ExceptionGroup("inner", unreachable[1:])])
    assert one_error(same) is unreachable[0]
    assert not hasattr(unreachable[0], "__notes__")  # the same error three times: no note
    refused = GenRMRequestError(409, "superseded")
    mixed = ExceptionGroup("g", [ExceptionGroup("inner", [refused]), GenRMTimeout("late")])
    assert one_error(mixed) is refused
    assert refused.__notes__ == [
        "2 errors: GenRMRequestError: genrm-trio answered 409: superseded; GenRMTimeout: late"
    ]


async def test_a_reply_that_is_not_json_is_the_clients_error() -> None:
    async def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, text="<html>proxy</html>")

    async with mock_client(handler) as client:
        with pytest.raises(GenRMError, match=r"/verify: a 200 reply that is not JSON: '<html>"):
            await client.score_group(PROMPT, answers("x"))


async def test_shutting_down_raises_and_a_group_failure_is_masked() -> None:
    async def shutting_down(request: httpx.Request) -> httpx.Response:
        return httpx.Response(503, json={"detail": "GenRM server is shutting down"})

    async with mock_client(shutting_down) as client:
        with pytest.raises(GenRMUnavailable, match="shutting down"):
            await client.score_group(PROMPT, answers("x"))

    message = "GenRM cohort 'k' is missing rollouts [3] after 1800s"

    async def failed(request: httpx.Request) -> httpx.Response:
        return httpx.Response(503, json={"detail": message})

    async with mock_client(failed) as client:
        results = await client.score_group_results(PROMPT, answers("x"))
    assert results == [Masked(message, "group_failed")] * N


async def test_at_capacity_is_retried_after_retry_after(
    autojump_clock: trio.testing.MockClock,
) -> None:
    tries: dict[int, int] = {}

    async def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        index = body["_ng_rollout_index"]
        tries[index] = tries.get(index, 0) + 1
        if index == 1 and tries[index] < 3:
            detail = "GenRM server is at capacity (8 active cohorts); retry later"
            return httpx.Response(503, json={"detail": detail}, headers={"Retry-After": "1"})
        return httpx.Response(200, json=row(body, 0.25))

    async with mock_client(handler) as client:
        started = trio.current_time()
        assert await client.score_group(PROMPT, answers("x")) == [0.25] * N
    assert trio.current_time() - started == 2.0
    assert tries == {0: 1, 1: 3, 2: 1, 3: 1}


async def test_a_group_is_bounded_by_the_timeout(autojump_clock: trio.testing.MockClock) -> None:
    async with mock_client(never_answers, timeout=7.5) as client:
        started = trio.current_time()
        with pytest.raises(GenRMTimeout, match=r"no answer within 7\.5 s"):
            await client.score_group(PROMPT, answers("x"))
    assert trio.current_time() - started == 7.5


async def test_the_default_timeout_is_the_servers_deadlines_and_a_margin(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with mock_client(never_answers) as client:
        started = trio.current_time()
        with pytest.raises(GenRMTimeout):
            await client.score_group(PROMPT, answers("x"))
    assert trio.current_time() - started == SETTINGS.group_timeout_s() == 80.0


async def test_members_with_a_bad_or_repeated_index_are_refused_before_anything_is_sent() -> None:
    sent: list[httpx.Request] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return httpx.Response(200, json=row(json.loads(request.content), 0.5))

    async with mock_client(handler) as client:
        with pytest.raises(GroupSizeError, match=r"rollout index 1 twice in one call"):
            await client.score_members(PROMPT, [(1, "a"), (1, "b")], group_id="g")
        with pytest.raises(GroupSizeError, match=rf"rollout index {N} outside \[0, {N}\)"):
            await client.score_members(PROMPT, [(0, "a"), (N, "b")], group_id="g")
    assert sent == []


async def test_group_settings_that_never_come_are_a_timeout(
    autojump_clock: trio.testing.MockClock,
) -> None:
    http = httpx.AsyncClient(transport=httpx.MockTransport(never_answers))
    async with AsyncGenRMClient("http://genrm", http=http) as client:
        started = trio.current_time()
        with pytest.raises(GenRMTimeout, match=r"GET /group_settings: no answer within 30 s"):
            await client.score_group(PROMPT, answers("x"))
    assert trio.current_time() - started == 30.0
    await http.aclose()


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="timeout must be a positive number"):
        GenRMClient("http://x", timeout=0)
    with pytest.raises(ValueError, match="timeout must be a positive number"):
        AsyncGenRMClient("http://x", timeout=float("nan"))
