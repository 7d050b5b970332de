"""The HTTP layer's security and bounds over real TCP on 127.0.0.1 (in-process hypercorn, the
scripted judge): WebSocket upgrades go through the bearer check and get a JSON 4xx, never a
traceback (issue #40; docs/reliability.md, "Security"; docs/http-api.md, "Errors").

Real clock (real I/O), every wait bounded.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio
from http_calls import call, live_port, member
from judges import ScriptedJudge, http_error, settings

import genrm_trio.http.app as app_module
from genrm_trio.app.serve import bind_socket, open_bind_warning
from genrm_trio.domain.codec import encode_json
from genrm_trio.engine.engine import open_engine
from genrm_trio.http.app import create_app
from genrm_trio.http.rows import HeldVerify
from genrm_trio.http.schema import (
    ECHO_KEYS,
    MAX_JSON_VALUES,
    AggregateMetricsRequest,
    WireError,
    decode_body,
    parse_aggregate_rows,
    parse_verify,
    split_verify_body,
    validate,
)

TOKEN_ENV = "GENRM_TEST_BOUNDS_TOKEN"
TOKEN = "bounds-token-1"
LIMIT_S = 20.0


@asynccontextmanager
async def served(**overrides: Any) -> AsyncIterator[int]:
    async with live_port(settings(num_rollouts_per_prompt=2, **overrides), ScriptedJudge()) as port:
        yield port


async def exchange(port: int, request: bytes) -> tuple[int, dict[str, str], bytes]:
    """(status, lower-case headers, body) of one raw request on a new connection; the reply
    must carry a Content-Length."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(request)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = await stream.receive_some()
            assert chunk, data
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        length = int(headers["content-length"])
        while len(body) < length:
            chunk = await stream.receive_some()
            assert chunk, body
            body += chunk
    return int(lines[0].split()[1]), headers, body


def upgrade(path: str, *extra: str) -> bytes:
    lines = [
        f"GET {path} HTTP/1.1",
        "Host: 127.0.0.1",
        "Connection: Upgrade",
        "Upgrade: websocket",
        "Sec-WebSocket-Version: 13",
        "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==",
        *extra,
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


async def test_a_websocket_upgrade_gets_the_bearer_check_and_a_json_4xx(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    caplog.set_level(logging.INFO)
    with trio.fail_after(LIMIT_S):
        async with served(server={"api_key_env": TOKEN_ENV}) as port:
            for path in ("/verify", "/ng-rollout/r1/verify", "/metrics", "/anything"):
                status, headers, body = await exchange(port, upgrade(path))
                assert status == 401, (path, body)
                assert headers["content-type"] == "application/json"
                assert headers["www-authenticate"] == "Bearer"
                assert json.loads(body) == {"detail": "missing or invalid bearer token"}
            authorized = f"Authorization: Bearer {TOKEN}"
            for path in ("/verify", "/health"):
                status, headers, body = await exchange(port, upgrade(path, authorized))
                assert status == 404, (path, body)
                assert json.loads(body) == {"detail": "no route speaks WebSocket"}
            status, _, body = await exchange(port, upgrade("/health"))  # public: no token needed
            assert (status, json.loads(body)) == (404, {"detail": "no route speaks WebSocket"})
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []


# --- smaller bounds (#40 item 8) -------------------------------------------------------------


@pytest.mark.parametrize(
    ("host", "key_env", "warns"),
    [
        ("127.0.0.1", None, False),
        ("127.0.0.2", None, False),  # all of 127/8 is loopback
        ("0.0.0.0", None, True),
        ("0.0.0.0", TOKEN_ENV, False),
    ],
)
def test_binding_beyond_loopback_without_auth_warns(
    host: str, key_env: str | None, warns: bool
) -> None:
    sock = bind_socket(host, 0)
    try:
        warning = open_bind_warning(sock, settings(server={"api_key_env": key_env}))
    finally:
        sock.close()
    if warns:
        assert warning == (
            f"listening on {host} without authentication: anyone who can reach this address can "
            "submit work that costs judge calls and read every result; set "
            "server.api_key_env or bind 127.0.0.1"
        )
    else:
        assert warning is None


async def test_compare_responses_are_capped_before_any_judge_call() -> None:
    cfg = settings(num_rollouts_per_prompt=2, server={"max_compare_responses": 3})
    judge = ScriptedJudge()
    history = [{"role": "user", "content": "Name a prime."}]

    def responses(n: int) -> list[dict[str, Any]]:
        return [member(i, f"answer {i}")["response"] for i in range(n)]

    async with open_engine(cfg, judge) as engine:
        app = create_app(engine, cfg)
        body = {"conversation_history": history, "response_objs": responses(4)}
        status, reply, _ = await call(app, "/compare", body=body)
        assert (status, reply) == (
            422,
            {
                "detail": [
                    {
                        "type": "too_long",
                        "loc": ["body", "response_objs"],
                        "msg": "at most 3 responses per request (server.max_compare_responses), "
                        "got 4",
                    }
                ]
            },
        )
        assert judge.calls == []
        # counted before validation: 4 responses that are not even objects are still too many
        body = {"conversation_history": history, "response_objs": [[]] * 4}
        status, reply, _ = await call(app, "/compare", body=body)
        assert (status, reply["detail"][0]["type"]) == (422, "too_long")
        body = {"conversation_history": history, "response_objs": [[]] * 3}
        status, reply, _ = await call(app, "/compare", body=body)
        assert (status, reply["detail"][0]["type"]) == (422, "dict_type")
        body = {"conversation_history": history, "response_objs": responses(3)}
        status, reply, _ = await call(app, "/compare", body=body)
        assert status == 200 and len(reply["rewards"]) == 3
    assert settings().server.max_compare_responses == 512


# --- nothing large runs on the loop (#40 item 3) ---------------------------------------------


def _blocking(real: Callable[..., Any], released: threading.Event) -> Callable[..., Any]:
    """`real`, after waiting (in whatever thread calls it) until /health has answered, 10 s at
    most: on the event loop it would block /health, and the wait would time out."""

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        assert released.wait(10), "the loop did not answer /health meanwhile"
        return real(*args, **kwargs)

    return wrapped


@pytest.mark.parametrize("route", ["/aggregate_metrics", "GET /checkpoint", "POST /checkpoint",
                                   "/verify"])  # fmt: skip
async def test_health_answers_while_a_large_request_is_worked_on(
    route: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    released = threading.Event()
    name = {
        "/aggregate_metrics": "aggregate_metrics",
        "GET /checkpoint": "export_checkpoint",
        "POST /checkpoint": "parse_checkpoint",
        "/verify": "parse_verify",
    }[route]
    monkeypatch.setattr(app_module, name, _blocking(getattr(app_module, name), released))
    cfg = settings(num_rollouts_per_prompt=1)  # a /verify is answered at once
    # a /verify body with more values than are decoded on the loop
    dense = {"extra": [[]] * (app_module.OFF_LOOP_VALUES // 2 + 1)}
    empty = {"version": 1, "cohorts": [], "watermarks": {}}
    requests = {
        "/aggregate_metrics": ("POST", "/aggregate_metrics", {"verify_responses": []}),
        "GET /checkpoint": ("GET", "/checkpoint", None),
        "POST /checkpoint": ("POST", "/checkpoint", empty),
        "/verify": ("POST", "/verify", member(0, "answer", group="big", **dense)),
    }
    method, path, body = requests[route]
    statuses: list[int] = []
    with trio.fail_after(LIMIT_S):
        async with open_engine(cfg, ScriptedJudge()) as engine:
            app = create_app(engine, cfg)

            async def slow() -> None:
                status, _, _ = await call(app, path, method=method, body=body)
                statuses.append(status)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(slow)
                status, reply, _ = await call(app, "/health", method="GET")
                assert (status, reply) == (200, {"status": "ok"})
                released.set()
    assert statuses == [200]


async def test_a_large_masked_verify_builds_its_failsafe_row_off_the_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # (#40 item 3) the masked row of a body of many extra keys was decoded, built and encoded
    # on the loop: seconds for a million keys
    released = threading.Event()
    blocking = _blocking(HeldVerify.failsafe_json_in_steps, released)
    threads: list[str] = []
    started = trio.Event()

    def recorded(held: HeldVerify, message: str) -> bytes:
        threads.append(threading.current_thread().name)
        trio.from_thread.run_sync(started.set)  # raises on the loop's own thread
        return blocking(held, message)  # type: ignore[no-any-return]

    monkeypatch.setattr(HeldVerify, "failsafe_json_in_steps", recorded)
    cfg = settings(num_rollouts_per_prompt=2, genrm_parse_retries=0)
    judge = ScriptedJudge(script=lambda r1, r2, attempt: http_error(500, b"judge down"))
    dense = {"extra": [[]] * (app_module.OFF_LOOP_VALUES // 2 + 1)}
    bodies = [member(0, "a", group="big", **dense), member(1, "b", group="big")]
    rows: dict[int, dict[str, Any]] = {}
    with trio.fail_after(LIMIT_S):
        async with open_engine(cfg, judge) as engine:
            app = create_app(engine, cfg)

            async def send(index: int) -> None:
                status, rows[index], _ = await call(app, "/verify", body=bodies[index])
                assert status == 200

            async with trio.open_nursery() as nursery:
                for index in range(2):
                    nursery.start_soon(send, index)
                await started.wait()
                status, reply, _ = await call(app, "/health", method="GET")
                assert (status, reply) == (200, {"status": "ok"})
                released.set()
    assert len(threads) == 1 and threads[0] != threading.main_thread().name
    big = rows[0]
    assert big["mask_sample"] is True and big["failure_kind"] == "judge_failed"
    assert big["extra"] == dense["extra"] and big["_ng_group_id"] == "big"
    assert "judge down" in big["failure_reason"]
    assert rows[1]["mask_sample"] is True and "extra" not in rows[1]


@pytest.mark.parametrize("path", ["/verify", "/compare", "/aggregate_metrics", "/checkpoint"])
async def test_a_body_of_too_many_values_is_refused_before_it_is_decoded(path: str) -> None:
    # (#40 item 2) a 60 MiB body of `[[],[],…]` decoded to 1.7 GB, even when refused with 422
    count = MAX_JSON_VALUES // 2 + 1  # each "[]," is an opening bracket and a comma
    raw = b"[" + b"[]," * count + b"[]]"
    cfg = settings(num_rollouts_per_prompt=2)
    async with open_engine(cfg, ScriptedJudge()) as engine:
        status, reply, _ = await call(create_app(engine, cfg), path, raw=raw)
    values = 2 * count + 3
    assert (status, reply) == (
        422,
        {
            "detail": [
                {
                    "type": "json_too_large",
                    "loc": ["body"],
                    "msg": f"JSON decode error: up to {values} values, more than the "
                    f"{MAX_JSON_VALUES} a body may hold",
                }
            ]
        },
    )


def test_a_large_body_within_the_value_budget_decodes() -> None:
    raw = b'{"a": "' + b"x" * (2 << 20) + b'", "b": [1, 2]}'  # 2 MiB, a handful of values
    assert decode_body(raw) == {"a": "x" * (2 << 20), "b": [1, 2]}


def test_only_bodies_that_decode_long_leave_the_loop() -> None:
    # an answer of a megabyte is one string: decoded on the loop in about a millisecond
    long_answer = encode_json(member(0, "x" * (1 << 20)))
    assert not app_module._decodes_long(long_answer)
    dense = encode_json(member(0, "a", extra=[[]] * (app_module.OFF_LOOP_VALUES // 2 + 1)))
    assert len(dense) < 512 * 1024 and app_module._decodes_long(dense)
    assert app_module._decodes_long(b'"' + b"x" * app_module.OFF_LOOP_BODY_BYTES + b'"')


def test_a_body_of_many_keys_is_validated_as_one_of_few() -> None:
    # (#40 item 3) the extra keys are never validated; 3 million of them were copied into the
    # model by one call that held the GIL for seconds
    extra = {f"k{i}": [i] for i in range(1000)}
    few, many = member(0, "a"), member(0, "a", **extra)
    assert parse_verify(many).input == parse_verify(few).input
    assert parse_verify(many).body == many
    for bad in ({"_ng_group_attempt": -1}, {"_ng_group_id": 3}, {"response": []}):
        with pytest.raises(WireError) as with_few:
            parse_verify(few | bad)
        with pytest.raises(WireError) as with_many:
            parse_verify(many | bad)
        assert with_many.value.errors == with_few.value.errors
    held = HeldVerify.of(parse_verify(many))
    assert held.body() == many and not held.packed
    declared, packed_rest = split_verify_body(encode_json(many))
    assert set(declared) == set(few)  # the extra keys were never decoded into the body
    packed = HeldVerify.of(parse_verify(declared), packed_rest=packed_rest)
    assert packed.packed and packed.body() == many
    assert list(packed.rest_dict()) == [key for key in many if key not in ECHO_KEYS]
    reason = "judge error: HTTP 500"
    assert packed.failsafe_json_in_steps(reason) == encode_json(held.failsafe_row(reason))
    assert packed.failsafe_json_in_steps(reason) == held.failsafe_json_in_steps(reason)


@pytest.mark.parametrize(
    "value",
    [
        [],
        {},
        {"verify_responses": {}},
        {"verify_responses": [{}, 3, {"a": 1}, [], None, "x"]},
        {"verify_responses": [[]] * 100, "other": 1},  # past MAX_ERRORS
        {"verify_responses": [{"reward": 1.0}], "other": 1},
    ],
)
def test_aggregate_rows_are_checked_as_the_model_checks_them(value: Any) -> None:
    # (#40 item 3) a row at a time: one validation call held the GIL 112 ms for 500,000 rows
    try:
        validate(AggregateMetricsRequest, value)
    except WireError as model_error:
        with pytest.raises(WireError) as stepped:
            parse_aggregate_rows(value)
        assert stepped.value.errors == model_error.errors
    else:
        assert parse_aggregate_rows(value) is value["verify_responses"]
