"""The judge client under connection faults of any size and timing (issue #24): a connection
broken or reset at any point of a request is one retryable transport failure of that attempt; a
reply that arrived before the break (an early 413) is read and used; no exception group leaves
the client; a fleet counts each such failure and sends the next attempt elsewhere; neither a
group nor a `/compare` fails as a whole for it. Scripted connections on the in-memory network
in virtual time, one real server on 127.0.0.1, and the HTTP app end to end."""

from __future__ import annotations

import json
import socket
import struct
from typing import Any

import pytest
import trio
import trio.testing
from http_calls import call, member, post_group
from scripted import BROKEN_WRITE, REFUSED, Answer, ByHost, Hangup, Reply, Reset, Script

from genrm_trio.config import Settings, settings_from_mapping
from genrm_trio.engine.engine import open_engine
from genrm_trio.http.app import create_app
from genrm_trio.judge.attempts import Comparator
from genrm_trio.judge.base import (
    JudgeCall,
    JudgeError,
    JudgeHTTPError,
    JudgeTransportError,
    ReplyStatus,
)
from genrm_trio.judge.client import make_http_judge
from genrm_trio.judge.factory import make_judge
from genrm_trio.judge.fleet import JudgeFleet
from genrm_trio.judge.http1 import WATCHED_SEND_BYTES
from genrm_trio.metrics import Metrics
from genrm_trio.testing.network import (
    MemoryNetwork,
    read_request,
    reset,
    response_bytes,
)

VERDICT: dict[str, Any] = {
    "status": "completed",
    "output": [
        {
            "type": "message",
            "content": [
                {"type": "output_text", "text": '{"score_1": 4, "score_2": 2, "ranking": 2}'}
            ],
        }
    ],
}
OK = Reply.json(VERDICT)
SMALL = 100_000  # characters of one answer: a request below WATCHED_SEND_BYTES
LARGE = 1_000_000  # one above it
TOO_LARGE = b"<html>\r\n<h1>413 Request Entity Too Large</h1>\r\n</html>"
BOUND = 600  # every exchange is bounded; virtual seconds unless said otherwise
ROUNDS = 16

assert SMALL + 1000 < WATCHED_SEND_BYTES < LARGE


def call_of(size: int) -> JudgeCall:
    return JudgeCall([{"role": "user", "content": "q"}], "x" * size, "y", None)


def config(base_url: str | list[str] = "http://judge.test:8000/v1", **extra: Any) -> Settings:
    data: dict[str, Any] = {
        "judge": {"api": "genrm_model", "base_url": base_url, **extra.pop("judge", {})},
        "judge_request_timeout_s": 30.0,
        "genrm_parse_retries": 3,
        "genrm_parse_retry_sleep_s": 0.1,
        **extra,
    }
    return settings_from_mapping(data)


async def read_head(stream: trio.abc.Stream, body_bytes: int) -> tuple[int, int]:
    """Read a request's head and then up to `body_bytes` of its body: (its Content-Length, the
    bytes of the body read)."""
    buffer = b""
    while b"\r\n\r\n" not in buffer:
        data = await stream.receive_some()
        assert data, "the client closed before the request head was in"
        buffer += data
    head, _, body = buffer.partition(b"\r\n\r\n")
    length = next(
        (
            int(line.partition(b":")[2])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        ),
        0,  # a GET (the fleet's probe of a replica it took out)
    )
    got = len(body)
    while got < min(body_bytes, length):
        data = await stream.receive_some(65536)
        if not data:
            break
        got += len(data)
    return length, got


def mid_body(kind: str) -> Any:
    """A judge that reads the head and 64 KiB of a request's body, then: resets (`reset`), or
    answers 413 and then resets (`413-reset`), stops reading without closing (`413-stop`), or
    closes lingering, reading the rest (`413-linger`)."""

    async def serve(stream: trio.abc.Stream) -> None:
        await read_head(stream, 64 * 1024)
        if kind == "reset":
            reset(stream)
            return
        await stream.send_all(response_bytes(413, TOO_LARGE, ["connection: close"]))
        if kind == "413-reset":
            reset(stream)
        elif kind == "413-stop":
            assert isinstance(stream, trio.abc.HalfCloseableStream)
            await stream.wait_peer_gone()  # type: ignore[attr-defined]
        else:
            assert isinstance(stream, trio.abc.HalfCloseableStream)
            await stream.send_eof()
            while await stream.receive_some(65536):
                pass

    return serve


# --- one attempt: broken mid-body, above and below WATCHED_SEND_BYTES ---------------------------


@pytest.mark.parametrize("size", [SMALL, LARGE], ids=["below-watched", "above-watched"])
@pytest.mark.parametrize("kind", ["reset", "413-reset", "413-stop", "413-linger"])
async def test_a_connection_broken_mid_body_is_one_failure_or_the_early_answer(
    kind: str, size: int, autojump_clock: trio.testing.MockClock
) -> None:
    network = MemoryNetwork(mid_body(kind))
    judge = make_http_judge(config(), backend=network)
    with trio.fail_after(BOUND):
        try:
            outcome: object = await judge.attempt(call_of(size))
        except Exception as exc:  # anything but a judge error fails the assertions below
            outcome = exc
    assert not isinstance(outcome, BaseExceptionGroup), outcome
    if kind == "reset":  # nothing answered: a transport failure of the attempt, retryable
        assert isinstance(outcome, JudgeTransportError), outcome
        assert outcome.retryable
        assert outcome.type_name in ("WriteError", "ReadError")
        assert "Connection reset by peer" in str(outcome)
    else:  # answered before the break: the answer is read and used
        assert isinstance(outcome, JudgeHTTPError), outcome
        assert (outcome.status, outcome.body) == (413, TOO_LARGE)
        assert not outcome.retryable
    assert judge.open_connections == 0  # a connection whose request was cut is never reused
    assert network.errors == []
    await judge.aclose()


async def test_a_reused_connection_reset_mid_body_is_sent_again_on_a_new_one(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The keep-alive race with a large body: the server drops the idle connection as the body
    goes out (nothing of a reply came back). Not an attempt: sent again on a new connection."""
    connections = 0

    async def serve(stream: trio.abc.Stream) -> None:
        nonlocal connections
        connections += 1
        if connections == 1:
            assert await read_request(stream, b"") is not None  # a small call, answered
            await stream.send_all(OK.bytes())
            await read_head(stream, 64 * 1024)  # the large one on the same connection
            reset(stream)
            return
        assert await read_request(stream, b"") is not None
        await stream.send_all(OK.bytes(close=True))

    network = MemoryNetwork(serve)
    judge = make_http_judge(config(), backend=network)
    with trio.fail_after(BOUND):
        assert (await judge.attempt(call_of(10))).status is ReplyStatus.COMPLETED
        assert (await judge.attempt(call_of(LARGE))).status is ReplyStatus.COMPLETED
    assert (connections, judge.pool.stale_retries, network.errors) == (2, 1, [])
    await judge.aclose()


# --- a fleet: any point of a request, counted, and answered elsewhere ---------------------------

POINTS: list[tuple[str, Answer, str]] = [
    ("connecting", REFUSED, "ConnectError"),
    ("writing the request", BROKEN_WRITE, "WriteError"),
    ("after the request", Reset(), "ReadError"),
    ("in the reply head", Reset(b"HTTP/1.1 200 OK\r\ncontent-le"), "ReadError"),
    ("in the reply body", Reset(OK.bytes()[:-10]), "ReadError"),
    ("closed after the request", Hangup(), "RemoteProtocolError"),
    ("closed in the reply head", Hangup(b"HTTP/1.1 200 OK\r\n"), "RemoteProtocolError"),
    ("closed in the reply body", Hangup(OK.bytes()[:-10]), "RemoteProtocolError"),
]


def fleet_of(a: Any, b: Any, **extra: Any) -> tuple[JudgeFleet, Settings]:
    settings = config(["http://a:8000/v1", "http://b:8000/v1"], **extra)
    judge = make_judge(settings, backend=ByHost({"a:8000": a, "b:8000": b}))
    assert isinstance(judge, JudgeFleet)
    return judge, settings


@pytest.mark.parametrize(("point", "fault", "name"), POINTS, ids=[p[0] for p in POINTS])
async def test_a_fault_at_any_point_is_counted_and_retried_on_the_other_replica(
    point: str, fault: Answer, name: str, autojump_clock: trio.testing.MockClock
) -> None:
    sick, healthy = Script(fault), Script(OK)
    judge, settings = fleet_of(sick.network, healthy.network)
    comparator = Comparator(judge, settings, Metrics())
    start = trio.current_time()
    with trio.fail_after(BOUND):
        result = await comparator.compare(call_of(10), pair=(0, 1), judge_pass=0)
    assert result.attempts == 2
    assert (sick.calls, healthy.calls) == (1, 1)
    assert healthy.times == [start + 0.1]  # after the one retry sleep, on the other replica
    a, b = judge.replica_stats()
    assert (a.calls, a.failures, b.calls, b.failures) == (1, 1, 1, 0)
    assert a.last_error is not None and a.last_error.startswith(f"{name}: ")
    await judge.aclose()


@pytest.mark.parametrize("kind", ["reset", "413-reset"])
async def test_a_large_body_broken_in_a_fleet(
    kind: str, autojump_clock: trio.testing.MockClock
) -> None:
    judge, settings = fleet_of(MemoryNetwork(mid_body(kind)), Script(OK).network)
    comparator = Comparator(judge, settings, Metrics())
    with trio.fail_after(BOUND):
        try:
            outcome: object = await comparator.compare(call_of(LARGE), pair=(0, 1), judge_pass=0)
        except JudgeError as error:
            outcome = error
    a, b = judge.replica_stats()
    if kind == "reset":  # a failure of the replica: counted, and the other one answers
        assert getattr(outcome, "attempts", None) == 2
        assert (a.failures, b.calls) == (1, 1)
    else:  # an answer (413: the request is too large anywhere): not retried, not a failure
        assert isinstance(outcome, JudgeError)
        assert outcome.attempts == 1
        assert outcome.message.startswith("GenRM judge a:8000 /v1/responses pair=(0, 1) ")
        assert "JudgeHTTPError: HTTP 413; response=<html>" in outcome.message
        assert (a.failures, b.calls) == (0, 0)
    await judge.aclose()


# --- a real server that answers 413 and resets ----------------------------------------------------


async def test_a_real_server_answering_413_and_resetting_while_a_large_body_goes_out() -> None:
    """Real sockets, real clock: the server reads the head, answers 413 and closes with the body
    unread, which the kernel turns into a reset (SO_LINGER 0 makes sure of it)."""
    heads = 0

    async def handle(stream: trio.SocketStream) -> None:
        nonlocal heads
        buffer = b""
        while b"\r\n\r\n" not in buffer:
            buffer += await stream.receive_some()
        heads += 1
        await stream.send_all(response_bytes(413, TOO_LARGE, ["connection: close"]))
        stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        await stream.aclose()

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(trio.serve_tcp, handle, 0)
        port = listeners[0].socket.getsockname()[1]
        settings = config(f"http://127.0.0.1:{port}/v1")
        judge = make_http_judge(settings)
        comparator = Comparator(judge, settings, Metrics())
        errors: list[JudgeError] = []
        try:
            with trio.fail_after(30):
                for _ in range(ROUNDS):  # the write or the watch sees the reset first: it varies
                    with pytest.raises(JudgeError) as info:
                        await comparator.compare(call_of(4 * LARGE), pair=(0, 1), judge_pass=0)
                    errors.append(info.value)
        finally:
            await judge.aclose()
            nursery.cancel_scope.cancel()
    assert [error.attempts for error in errors] == [1] * ROUNDS  # the 413 read: not retried
    assert all("JudgeHTTPError: HTTP 413; response=<html>" in e.message for e in errors)
    assert (heads, judge.open_connections) == (ROUNDS, 0)


# --- end to end: /verify masks two rollouts, /compare answers 503, never 500 ----------------------


def judge_server(mode: str) -> MemoryNetwork:
    """A judge answering every request with a verdict, except those with a body over 256 KiB:
    413 and a reset (`413`), or a reset alone (`reset`), while the body is still coming in."""

    async def serve(stream: trio.abc.Stream) -> None:
        while True:
            length, got = await read_head(stream, 64 * 1024)
            if length > WATCHED_SEND_BYTES:
                if mode == "413":
                    await stream.send_all(response_bytes(413, TOO_LARGE, ["connection: close"]))
                reset(stream)
                return
            await read_body(stream, length - got)
            await stream.send_all(OK.bytes())

    return MemoryNetwork(serve)


async def read_body(stream: trio.abc.Stream, length: int) -> None:
    got = 0
    while got < length:
        data = await stream.receive_some(65536)
        assert data
        got += len(data)


def e2e_settings() -> Settings:
    return Settings.model_validate(
        {
            "num_rollouts_per_prompt": 4,
            "genrm_parse_retries": 1,
            "genrm_parse_retry_sleep_s": 0.0,
            "judge_request_timeout_s": 60.0,
            "cohort_collection_timeout_s": 60.0,
            "judge": {"api": "genrm_model", "base_url": "http://judge.test:8000/v1"},
        }
    )


@pytest.mark.parametrize(("mode", "reason"), [("413", "HTTP 413"), ("reset", "reset by peer")])
async def test_a_large_answer_masks_its_comparisons_and_compare_answers_503(
    mode: str, reason: str, autojump_clock: trio.testing.MockClock
) -> None:
    settings = e2e_settings()
    judge = make_judge(settings, backend=judge_server(mode))
    answers = ["short one", "short two", "long " + "x" * (2 * WATCHED_SEND_BYTES), "short four"]
    bodies = [member(i, answer, group=f"big-{mode}") for i, answer in enumerate(answers)]
    with trio.fail_after(BOUND):
        async with open_engine(settings, judge) as engine:
            app = create_app(engine, settings)
            replies = await post_group(app, bodies)
            # circular pairs (1, 2) and (2, 3) carry the long answer: rollouts 1, 2, 3 masked
            # with the judge's reason, rollout 0 scored; no 503 for the group
            assert [status for status, _ in replies] == [200, 200, 200, 200]
            assert replies[0][1]["mask_sample"] is False
            for i in (1, 2, 3):
                assert replies[i][1]["mask_sample"] is True
                assert reason in replies[i][1]["failure_reason"]
            status, reply, _ = await call(
                app,
                "/compare",
                body={
                    "conversation_history": [{"role": "user", "content": "Name a prime."}],
                    "response_objs": [b["response"] for b in bodies[1:3]],
                },
            )
            assert status == 503, reply  # a judge failure: never a 500
            assert reply["detail"].startswith("GenRM judge judge.test:8000 /v1/responses ")
            assert reason in reply["detail"]
            status, _, _ = await call(app, "/compare", body={
                "conversation_history": [{"role": "user", "content": "Name a prime."}],
                "response_objs": [b["response"] for b in (bodies[0], bodies[3])],
            })  # fmt: skip
            assert status == 200  # the judge is fine for everything else
    assert json.dumps(engine.active_cohorts()) == "[]"
