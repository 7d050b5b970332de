"""`genrm_trio.client` (docs/trainers.md, "The client"): against a live `genrm-trio serve` with the
simulated judge as a server (tests/genrm_server.py: its scripted fault fails the pairs of tagged
answers), under trio, asyncio and blocking; and, with httpx's mock transport, what each status
gives."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import socket
import struct
import traceback
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
import trio.testing
from genrm_server import COLLECT_S, PROMPT, N, Server, answers, server
from procs import start_server, wait_cohort_state

from genrm_trio.client import (
    AsyncGenRMClient,
    GenRMClient,
    GenRMError,
    GenRMReplyError,
    GenRMRequestError,
    GenRMTimeout,
    GenRMUnavailable,
    GroupSettings,
    GroupSizeError,
    MaskedRollout,
    ScoredRollout,
    all_at_once,
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
    assert [r.reward for r in results if type(r) is ScoredRollout] == rewards
    # every request names its attempt: the server logs no legacy (attempt-less) request
    assert "group attempt omitted" not in server.serve.log()
    assert len(set(rewards)) > 1  # the judge told the answers apart
    for index, result in enumerate(results):
        assert type(result) is ScoredRollout
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
    assert [type(result) for result in results] == [
        MaskedRollout,
        MaskedRollout,
        ScoredRollout,
        MaskedRollout,
    ]
    for result in results:
        if type(result) is MaskedRollout:
            assert result.kind == "judge_failed"
            assert result.reason  # the server's failure message
            assert result.row is not None and result.row["mask_sample"] is True
    rewards = client.score_group(PROMPT, completions)
    assert rewards[0] is None and rewards[1] is None and rewards[3] is None
    assert rewards[2] == results[2].reward  # type: ignore[union-attr]


def test_a_group_whose_every_member_is_masked_is_all_none_never_zero(server: Server) -> None:
    client = GenRMClient(server.url)
    results = client.score_group_results(PROMPT, answers("all", failing=set(range(N))))
    assert all(type(result) is MaskedRollout for result in results)
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
    with pytest.raises(
        GroupSizeError,
        match=r"the group's size is 3 but the genrm-trio server scores groups of "
        r"num_rollouts_per_prompt=4: set the group's size to 4, or start the server with "
        r"--num-rollouts-per-prompt 3 \(nothing was sent\)",
    ):
        client.score_group(PROMPT, answers("short")[:3])
    with pytest.raises(GroupSizeError, match="the group's size is 5 "):
        client.score_group(PROMPT, [*answers("long"), "one more"])
    assert httpx.get(server.url + "/cohorts").json() == []  # no cohort was opened


async def test_a_group_missing_members_fails_at_the_servers_deadline(server: Server) -> None:
    async with AsyncGenRMClient(server.url) as client:
        started = trio.current_time()
        results = await client.score_members(
            PROMPT, list(enumerate(answers("partial")[:2])), group_id="client-partial-group"
        )
    assert trio.current_time() - started >= COLLECT_S
    assert [type(result) for result in results] == [MaskedRollout, MaskedRollout]
    for result in results:
        assert type(result) is MaskedRollout and result.kind == "group_failed"
        assert result.row is None and result.reason


def test_an_unreachable_server_raises() -> None:
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    client = GenRMClient(f"http://127.0.0.1:{port}", resends=0)  # resends: see the mock tests
    with pytest.raises(GenRMUnavailable, match="unreachable after 1 tries: ConnectError"):
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


@pytest.mark.parametrize("detail", ["GenRM server is shutting down", "stopping (reworded)"])
async def test_shutting_down_is_read_from_the_reason_not_the_prose(detail: str) -> None:
    async def shutting_down(request: httpx.Request) -> httpx.Response:
        return httpx.Response(503, json={"detail": detail, "reason": "shutting_down"})

    async with mock_client(shutting_down) as client:
        with pytest.raises(
            GenRMUnavailable, match=r"answered 503 \(shutting_down\): " + re.escape(detail)
        ):
            await client.score_group(PROMPT, answers("x"))


@pytest.mark.parametrize("reason", ["group_failed", "superseded"])
async def test_a_group_failure_is_masked_whatever_its_prose(reason: str) -> None:
    message = "GenRM server is shutting down"  # the prose of a shutdown: the reason decides

    async def failed(request: httpx.Request) -> httpx.Response:
        return httpx.Response(503, json={"detail": message, "reason": reason})

    async with mock_client(failed) as client:
        results = await client.score_group_results(PROMPT, answers("x"))
    assert results == [MaskedRollout(message, "group_failed")] * N


@pytest.mark.parametrize("body", [{"detail": "no reason"}, {"detail": "x", "reason": "new_one"}])
async def test_a_503_without_a_known_reason_stops_rather_than_masks(body: dict[str, str]) -> None:
    async def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(503, json=body)

    async with mock_client(handler) as client:
        with pytest.raises(GenRMUnavailable, match="answered 503"):
            await client.score_group(PROMPT, answers("x"))


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
            return httpx.Response(
                503, json={"detail": detail, "reason": "at_capacity"}, headers={"Retry-After": "1"}
            )
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


# --- a connection that breaks: the member is sent again (docs/trainers.md, "The client") --------


@pytest.mark.parametrize(
    "broken",
    [
        httpx.ReadError("[Errno 104] Connection reset by peer"),
        httpx.RemoteProtocolError("Server disconnected without sending a response."),
        httpx.ConnectError("[Errno 111] Connection refused"),  # a restart
        httpx.WriteError("[Errno 32] Broken pipe"),
    ],
)
async def test_a_member_whose_connection_breaks_is_sent_again_the_same(
    broken: httpx.TransportError, autojump_clock: trio.testing.MockClock
) -> None:
    sent: dict[int, list[dict[str, Any]]] = {}

    async def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        tries = sent.setdefault(body["_ng_rollout_index"], [])
        tries.append(body)
        if body["_ng_rollout_index"] == 2 and len(tries) <= 2:
            raise broken
        return httpx.Response(200, json=row(body, body["_ng_rollout_index"] / 4))

    async with mock_client(handler) as client:
        started = trio.current_time()
        assert await client.score_group(PROMPT, answers("x")) == [0.0, 0.25, 0.5, 0.75]
    assert trio.current_time() - started == 0.25 + 0.5  # the back-off, doubling
    assert {index: len(tries) for index, tries in sent.items()} == {0: 1, 1: 1, 2: 3, 3: 1}
    first, *again = sent[2]
    assert again == [first, first]  # the same group id, attempt, index and completion


async def test_a_connection_that_keeps_breaking_is_unavailable_after_the_resends(
    autojump_clock: trio.testing.MockClock,
) -> None:
    calls: list[float] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        calls.append(trio.current_time())
        raise httpx.ConnectError("[Errno 111] Connection refused")

    async with mock_client(handler) as client:
        started = trio.current_time()
        with pytest.raises(GenRMUnavailable, match=r"unreachable after 6 tries: ConnectError"):
            await client.score_members(PROMPT, [(0, "a")], group_id="g")
    assert [t - started for t in calls] == [0.0, 0.25, 0.75, 1.75, 3.75, 7.75]
    async with mock_client(handler, resends=2) as client:
        with pytest.raises(GenRMUnavailable, match=r"unreachable after 3 tries"):
            await client.score_members(PROMPT, [(0, "a")], group_id="g")
    assert len(calls) == 6 + 3


async def test_resends_stay_within_the_groups_timeout(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadError("reset")

    async with mock_client(handler, timeout=1.0) as client:
        started = trio.current_time()
        with pytest.raises(GenRMTimeout, match=r"no answer within 1 s"):
            await client.score_group(PROMPT, answers("x"))
    assert trio.current_time() - started == 1.0


async def test_a_transport_error_that_would_repeat_is_not_sent_again() -> None:
    calls = 0

    async def handler(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        raise httpx.UnsupportedProtocol("Request URL has an unsupported protocol 'htp://'")

    async with mock_client(handler) as client:
        with pytest.raises(GenRMUnavailable, match="unreachable: UnsupportedProtocol"):
            await client.score_members(PROMPT, [(0, "a")], group_id="g")
    assert calls == 1


# --- a client that does not trust its server (docs/reliability.md, "Security") -----------------


def raw_reply(text: str, status: int = 200) -> Any:
    async def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, content=text.encode(), headers={"content-type": "json"})

    return handler


async def test_a_reply_over_the_size_limit_is_refused() -> None:
    async with mock_client(raw_reply("x" * 1001), max_reply_bytes=1000) as client:
        with pytest.raises(GenRMReplyError, match=r"a reply of 1001 bytes, over the client's "):
            await client.score_members(PROMPT, [(0, "a")], group_id="g")

    async def huge_length(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=b"{}", headers={"content-length": "9" * 5000})

    async with mock_client(huge_length) as client:
        with pytest.raises(GenRMReplyError, match=r"a reply of 9999.* bytes, over the client's"):
            await client.score_members(PROMPT, [(0, "a")], group_id="g")


async def test_a_long_refusal_is_cut_in_the_errors_message() -> None:
    async def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(409, json={"detail": "x" * 100_000})

    async with mock_client(handler) as client:
        with pytest.raises(GenRMRequestError) as caught:
            await client.score_members(PROMPT, [(0, "a")], group_id="g")
    assert str(caught.value) == "genrm-trio answered 409: " + "x" * 1000
    assert caught.value.detail == "x" * 100_000  # the whole detail stays on the error


# httpx's inner byte generators, left at the limit, are finalised by trio when collected (with a
# ResourceWarning that pytest reports as unraisable); the reply is refused all the same
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
async def test_a_reply_without_a_length_is_cut_at_the_size_limit() -> None:
    async def chunked(request: httpx.Request) -> httpx.Response:
        async def body() -> Any:  # no Content-Length: counted as it arrives
            for _ in range(100):
                yield b"[" * 100

        return httpx.Response(200, content=body())

    async with mock_client(chunked, max_reply_bytes=1000) as client:
        with pytest.raises(GenRMReplyError, match=r"a reply of over 1100 bytes"):
            await client.score_members(PROMPT, [(0, "a")], group_id="g")


@pytest.mark.parametrize(
    ("reply", "error"),
    [
        ('{"reward": NaN, "mask_sample": false}', r"not JSON: .* \(NaN is not JSON\)"),
        ('{"reward": Infinity, "mask_sample": false}', r"not JSON: .* \(Infinity is not JSON\)"),
        ('{"reward": 1e999, "mask_sample": false}', r"a reward that is not a finite number: inf"),
        ('{"reward": 1' + "0" * 4000 + ', "mask_sample": false}', r"not a finite number: 1000"),
        ('{"reward": 1' + "0" * 5000 + ', "mask_sample": false}', r"not JSON: .* \(Exceeds"),
        ("[" * 100_000 + "]" * 100_000, r"not JSON: .* \(JSON nested too deeply\)"),
        ('{"reward": 1.0, "mask_sample": "evil"}', r"mask_sample is not a boolean: 'evil'"),
        ('{"reward": "1.0", "mask_sample": false}', r"without a numeric reward: '1.0'"),
    ],
)
async def test_a_reply_the_api_does_not_define_is_a_typed_error(reply: str, error: str) -> None:
    async with mock_client(raw_reply(reply)) as client:
        with pytest.raises(GenRMReplyError, match=error):
            await client.score_members(PROMPT, [(0, "a")], group_id="g")


@pytest.mark.parametrize(
    ("settings", "error"),
    [
        (
            '{"num_rollouts_per_prompt": 4, "cohort_collection_timeout_s": Infinity, '
            '"cohort_evaluation_timeout_s": 1}',
            "not JSON",
        ),
        (
            '{"num_rollouts_per_prompt": 4, "cohort_collection_timeout_s": 1e999, '
            '"cohort_evaluation_timeout_s": 1}',
            "cohort_collection_timeout_s is not a positive",
        ),
        (
            '{"num_rollouts_per_prompt": 4, "cohort_collection_timeout_s": 1, '
            '"cohort_evaluation_timeout_s": -5}',
            "cohort_evaluation_timeout_s is not a positive",
        ),
        (
            '{"num_rollouts_per_prompt": 4, "cohort_collection_timeout_s": 1' + "0" * 400 + ", "
            '"cohort_evaluation_timeout_s": 1}',
            "unexpected reply",
        ),
        (
            '{"num_rollouts_per_prompt": 4.5, "cohort_collection_timeout_s": 1, '
            '"cohort_evaluation_timeout_s": 1}',
            "bad num_rollouts_per_prompt 4.5",
        ),
    ],
)
async def test_group_settings_that_are_not_finite_waits_are_refused(
    settings: str, error: str
) -> None:
    http = httpx.AsyncClient(transport=httpx.MockTransport(raw_reply(settings)))
    async with AsyncGenRMClient("http://genrm", http=http) as client:
        with pytest.raises(GenRMReplyError, match=error):
            await client.group_settings()
    await http.aclose()


@pytest.mark.parametrize(
    ("retry_after", "waits"), [("0", 1.0), ("-3", 1.0), ("nan", 1.0), ("soon", 1.0), ("2", 2.0)]
)
async def test_retry_after_has_a_floor(
    retry_after: str, waits: float, autojump_clock: trio.testing.MockClock
) -> None:
    tries: list[float] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        tries.append(trio.current_time())
        if len(tries) < 3:
            return httpx.Response(
                503,
                json={"detail": "at capacity", "reason": "at_capacity"},
                headers={"Retry-After": retry_after},
            )
        return httpx.Response(200, json=row(json.loads(request.content), 0.5))

    async with mock_client(handler) as client:
        started = trio.current_time()
        assert await client.score_members(PROMPT, [(0, "a")], group_id="g") == [
            ScoredRollout(0.5, {"reward": 0.5, "mask_sample": False, "_ng_rollout_index": 0})
        ]
    assert [t - started for t in tries] == [0.0, waits, 2 * waits]


async def test_a_long_retry_after_is_clamped_to_the_clients_timeout(
    autojump_clock: trio.testing.MockClock,
) -> None:
    tries = 0

    async def handler(request: httpx.Request) -> httpx.Response:
        nonlocal tries
        tries += 1
        return httpx.Response(
            503, json={"detail": "busy", "reason": "at_capacity"}, headers={"Retry-After": "1e9"}
        )

    async with mock_client(handler, timeout=45.0) as client:
        started = trio.current_time()
        with pytest.raises(GenRMTimeout):
            await client.score_members(PROMPT, [(0, "a")], group_id="g")
    assert trio.current_time() - started == 45.0
    assert tries == 2  # at 0 and after the 30 s cap, never a 1e9 s wait


def test_proxy_variables_are_not_used(server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as sock:  # a proxy that is not there: a client using it fails
        sock.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{sock.getsockname()[1]}"
    for name in ("HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.setenv(name, dead)
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    rewards = GenRMClient(server.url).score_group(PROMPT, answers("no-proxy"))
    assert all(isinstance(reward, float) for reward in rewards)


def test_bad_client_bounds() -> None:
    with pytest.raises(ValueError, match="resends must be >= 0"):
        AsyncGenRMClient("http://x", resends=-1)
    with pytest.raises(ValueError, match="max_reply_bytes >= 1"):
        AsyncGenRMClient("http://x", max_reply_bytes=0)


# --- live: a server that shuts down mid-step, and a proxy that resets connections ---------------


async def test_a_server_shutting_down_mid_step_is_one_error_not_a_nest_of_groups(
    tmp_path: Path,
) -> None:
    """The real engine's shutdown: two groups wait for their last member when the server gets
    SIGTERM; the step ends with one `GenRMUnavailable` read from the 503's reason, whose
    traceback shows no exception group."""
    config = {"num_rollouts_per_prompt": N, "cohort_collection_timeout_s": 600.0}
    proc = await trio.to_thread.run_sync(start_server, tmp_path, config)
    caught: list[BaseException] = []
    try:
        async with AsyncGenRMClient(proc.url) as client, httpx.AsyncClient() as http:

            async def group(tag: str) -> None:
                members = list(enumerate(answers(tag)))[: N - 1]  # the last never comes
                await client.score_members(PROMPT, members, group_id=f"stop-{tag}")

            async def step() -> None:
                try:
                    await all_at_once([partial(group, "a"), partial(group, "b")])
                except BaseException as exc:
                    caught.append(exc)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(step)
                for tag in "ab":
                    await wait_cohort_state(
                        http, proc.url, f"stop-{tag}", "collecting", requests_waiting=N - 1
                    )
                proc.signal(signal.SIGTERM)
        assert await trio.to_thread.run_sync(proc.wait, 30.0) == 0
    finally:
        await trio.to_thread.run_sync(proc.close)
    (error,) = caught
    assert type(error) is GenRMUnavailable
    assert str(error) == (
        f"genrm-trio at {proc.url} answered 503 (shutting_down): GenRM server is shutting down"
    )
    shown = "".join(traceback.format_exception(error))
    # no group and no chain shown (source lines quoted in it may name ExceptionGroup)
    assert "Exception Group Traceback" not in shown, shown
    assert "During handling" not in shown and "direct cause" not in shown, shown
    assert shown.count("Traceback (most recent call last)") == 1
    assert shown.splitlines()[-1] == f"genrm_trio.client.GenRMUnavailable: {error}"


class ResettingProxy:
    """A TCP proxy on 127.0.0.1 in front of the server that resets every `every`-th connection
    it accepts (RST: SO_LINGER 0): the odd ones before the request reaches the server, the even
    ones after the server answered, when the answer is lost. Every other connection is relayed
    both ways, byte for byte."""

    def __init__(self, target_port: int, every: int) -> None:
        self.target_port = target_port
        self.every = every
        self.accepted = 0
        self.reset_before = 0
        self.reset_after = 0
        self.port = 0

    async def serve(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        task_status.started()
        await trio.serve_listeners(self.handle, listeners)

    @staticmethod
    async def reset(stream: trio.SocketStream) -> None:
        stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        await stream.aclose()

    async def handle(self, client: trio.SocketStream) -> None:
        self.accepted += 1
        number = self.accepted
        doomed = number % self.every == 0
        if doomed and (number // self.every) % 2:
            self.reset_before += 1
            await self.reset(client)
            return
        server = await trio.open_tcp_stream("127.0.0.1", self.target_port)
        async with server, trio.open_nursery() as nursery:

            async def upstream() -> None:
                while data := await client.receive_some(65536):
                    await server.send_all(data)
                nursery.cancel_scope.cancel()

            async def downstream() -> None:
                while data := await server.receive_some(65536):
                    if doomed:  # the server answered: the answer is lost
                        self.reset_after += 1
                        break
                    await client.send_all(data)
                nursery.cancel_scope.cancel()

            nursery.start_soon(upstream)
            nursery.start_soon(downstream)
        if doomed:
            await self.reset(client)
        else:
            await client.aclose()


async def test_steps_through_a_proxy_that_resets_connections_get_exact_rewards(
    server: Server,
) -> None:
    proxy = ResettingProxy(int(server.url.rpartition(":")[2]), every=3)
    steps = [[answers(f"reset-{step}-{group}") for group in range(3)] for step in range(4)]
    got: list[list[list[float | None]]] = []
    async with trio.open_nursery() as nursery:
        await nursery.start(proxy.serve)
        async with AsyncGenRMClient(f"http://127.0.0.1:{proxy.port}") as client:
            for groups in steps:
                rewards: list[list[float | None]] = [[] for _ in groups]

                async def one(
                    into: list[list[float | None]], index: int, completions: list[str]
                ) -> None:
                    into[index] = await client.score_group(PROMPT, completions)

                await all_at_once(partial(one, rewards, i, g) for i, g in enumerate(groups))
                got.append(rewards)
        nursery.cancel_scope.cancel()
    assert proxy.reset_before > 0 and proxy.reset_after > 0  # both kinds of break happened
    for groups, rewards in zip(steps, got, strict=True):
        for completions, group_rewards in zip(groups, rewards, strict=True):
            assert group_rewards == await compare_rewards(server.url, completions)
