"""The HTTP judges (docs/configuration.md, "Judge requests and replies"): request shapes, reply
classification, usage, error mapping, URLs and tokens, through the production pool over scripted
bytes (tests/scripted.py); the keep-alive pool over real sockets (reuse, interrupted bodies,
cancellation without leaks, a closed port)."""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
import socket
import ssl
import subprocess
import threading
from collections.abc import MutableMapping
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
import trio.testing
from asgi_judges import reply_json, request_json
from real_sockets import (
    CALL,
    HISTORY,
    VERDICT_TEXT,
    Script,
    TinyServer,
    real_judge,
    responses_reply,
    scripted_judge,
    serve_tls,
    settings,
    tiny_server,
)
from scripted import REFUSED, Fixed, Reply
from scripted import Script as Answers

import genrm_trio.judge.client as client_module
from genrm_trio.config import ConfigError, settings_from_mapping
from genrm_trio.domain.codec import values_outside_strings_at_most
from genrm_trio.judge.apis import JUDGE_APIS, chat_params, interpret_chat, interpret_responses
from genrm_trio.judge.base import (
    JudgeBadJSON,
    JudgeCall,
    JudgeHTTPError,
    JudgeReply,
    JudgeTransportError,
    ReplyStatus,
)
from genrm_trio.judge.client import (
    TRANSPORT_ERRORS,
    HttpJudge,
    Redactor,
    make_http_judge,
    parse_retry_after,
    transport_error,
)
from genrm_trio.judge.http1 import ResponseTooLarge
from genrm_trio.judge.pool import CertificateError, KeepAlivePool, UnreachableError
from genrm_trio.testing.network import (
    MemoryNetwork,
    Request,
    response_bytes,
    serve_asgi,
)

TOKEN = "sk-test-secret-token-1234"


def chat_reply(
    content: object = VERDICT_TEXT, finish: str | None = "stop", **extra: Any
) -> dict[str, Any]:
    reply: dict[str, Any] = {
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content}}]
    }
    reply["choices"][0]["finish_reason"] = finish
    reply.update(extra)
    return reply


class Recorder(Answers):
    """A `Script` of answers whose requests (`requests`, `bodies`) the tests read."""

    @property
    def received(self) -> list[Request]:
        return [r for r in self.requests if r is not None]


def url_of(request: Request, scheme: str = "http") -> str:
    """The URL a request the judge received was sent to."""
    return f"{scheme}://{request.headers['host']}{request.target}"


def judge_with(recorder: Recorder, **judge: Any) -> HttpJudge:  # a judge over scripted bytes
    return make_http_judge(settings(**judge), backend=recorder.network)


def ok(payload: object, *headers: str) -> Reply:
    return Reply.json(payload, 200, *headers)


@pytest.fixture(scope="module")
def judge_tls(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, ssl.SSLContext]:
    """(a CA file a judge trusts, the server context of a judge at j.test with that cert)."""
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command")
    folder = tmp_path_factory.mktemp("judge-cert")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=j.test", "-addext", "subjectAltName=DNS:j.test",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    return str(cert), context


# --- URLs, endpoint, path -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("base_url", "api", "url", "path"),
    [
        ("http://j.test:8000/v1", "responses", "http://j.test:8000/v1/responses", "/v1/responses"),
        ("http://j.test:8000/v1/", "responses", "http://j.test:8000/v1/responses", "/v1/responses"),
        ("http://j.test:8000/v1", "chat_completions", "http://j.test:8000/v1/chat/completions",
         "/v1/chat/completions"),
        ("https://j.test/a/v1", "responses", "https://j.test/a/v1/responses", "/a/v1/responses"),
        ("http://j.test:9/gym", "responses", "http://j.test:9/gym/responses", "/gym/responses"),
    ],
)  # fmt: skip
async def test_url_is_base_url_plus_path_keeping_v1(
    base_url: str, api: str, url: str, path: str, request: pytest.FixtureRequest
) -> None:
    answer = ok(responses_reply() if api == "responses" else chat_reply())
    scheme, keys, tls = "http", {}, None
    if base_url.startswith("https:"):  # TLS over the in-memory connection, a cert for j.test
        ca_file, tls = request.getfixturevalue("judge_tls")
        scheme, keys = "https", {"ca_file": ca_file}
    recorder = Recorder(answer, tls=tls)
    judge = judge_with(recorder, base_url=base_url, api=api, **keys)
    assert judge.url == url
    assert judge.path == path
    with trio.fail_after(5):
        reply = await judge.attempt(CALL)
    assert reply.status is ReplyStatus.COMPLETED
    assert url_of(recorder.received[0], scheme) == url
    assert recorder.received[0].method == "POST"
    await judge.aclose()


def test_endpoint_is_host_and_port() -> None:
    assert make_http_judge(settings()).endpoint == "judge.test:8000"
    assert make_http_judge(settings(base_url="https://judge.test/v1")).endpoint == "judge.test:443"


def test_missing_base_url_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"judge\.base_url"):
        make_http_judge(settings_from_mapping({}))


def test_unset_token_variable_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GENRM_TEST_JUDGE_TOKEN", raising=False)
    with pytest.raises(ConfigError, match="GENRM_TEST_JUDGE_TOKEN"):
        make_http_judge(settings(api_key_env="GENRM_TEST_JUDGE_TOKEN"))


# --- request bodies -------------------------------------------------------------------------


async def test_responses_body_carries_history_and_answers_in_metadata() -> None:
    recorder = Recorder(ok(responses_reply()))
    judge = make_http_judge(
        settings_from_mapping(
            {
                "judge": {
                    "api": "genrm_model",
                    "base_url": "http://judge.test:8000/v1",
                    "model": "judge-model",
                },
                "genrm_responses_create_params": {
                    "input": [{"role": "user", "content": "ignored"}],
                    "max_output_tokens": 128,
                    "temperature": 0.3,
                },
            }
        ),
        backend=recorder.network,
    )
    with trio.fail_after(5):
        await judge.attempt(JudgeCall(HISTORY, "answer one", "None", None))
    body = recorder.bodies[0]
    assert body == {
        "input": [
            {"role": "system", "content": "Be fair.", "type": "message"},
            {"role": "user", "content": "What is 2+2?", "type": "message"},
        ],
        "max_output_tokens": 128,
        "temperature": 0.3,
        "model": "judge-model",
        "metadata": {"response_1": "answer one", "response_2": "None"},
    }
    assert "top_p" not in body  # only explicitly set create params
    request = recorder.received[0]
    assert request.headers["content-type"] == "application/json"
    assert "authorization" not in request.headers


@pytest.mark.parametrize("principle", ["Be strict.", ""])
async def test_responses_principle_in_metadata_only_when_given(principle: str) -> None:
    recorder = Recorder(ok(responses_reply()))
    judge = judge_with(recorder)
    with trio.fail_after(5):
        await judge.attempt(JudgeCall(HISTORY, "a", "b", principle))
        await judge.attempt(JudgeCall(HISTORY, "a", "b", None))
    with_principle, without = recorder.bodies
    assert with_principle["metadata"] == {
        "response_1": "a",
        "response_2": "b",
        "principle": principle,
    }
    assert without["metadata"] == {"response_1": "a", "response_2": "b"}
    assert all(m["role"] in ("system", "user") for m in with_principle["input"])


async def test_lone_surrogates_are_sent_as_json_escapes() -> None:
    recorder = Recorder(ok(responses_reply()))
    judge = judge_with(recorder)
    with trio.fail_after(5):
        await judge.attempt(JudgeCall(HISTORY, "bad \ud800 text", "ünïcode", None))
    assert recorder.received[0].body.isascii()
    assert recorder.bodies[0]["metadata"]["response_1"] == "bad \ud800 text"
    assert recorder.bodies[0]["metadata"]["response_2"] == "ünïcode"


async def test_chat_body_appends_principle_and_answers_after_history() -> None:
    recorder = Recorder(ok(chat_reply()))
    judge = make_http_judge(
        settings_from_mapping(
            {
                "judge": {"base_url": "http://judge.test:8000/v1", "api": "chat_completions"},
                "genrm_responses_create_params": {
                    "input": [],
                    "max_output_tokens": 512,
                    "temperature": 0.6,
                    "top_p": 0.95,
                    "model": "m",
                    "metadata": {"x": "y"},
                    "truncation": "auto",
                    "reasoning": {"effort": "low"},
                    "instructions": "You are a judge.",
                },
            }
        ),
        backend=recorder.network,
    )
    with trio.fail_after(5):
        await judge.attempt(JudgeCall(HISTORY, "one", "two", "Prefer brevity."))
        await judge.attempt(JudgeCall(HISTORY, "one", "two", None))
    first, second = recorder.bodies
    assert first == {
        "max_tokens": 512,
        "temperature": 0.6,
        "top_p": 0.95,
        "model": "m",
        "reasoning_effort": "low",
        "n": 1,
        "stream": False,
        "messages": [
            {"role": "system", "content": "You are a judge."},
            {"role": "system", "content": "Be fair."},
            {"role": "user", "content": "What is 2+2?"},
            {"role": "principle", "content": "Prefer brevity."},
            {"role": "response_1", "content": "one"},
            {"role": "response_2", "content": "two"},
        ],
    }
    assert [m["role"] for m in second["messages"]] == [
        "system", "system", "user", "response_1", "response_2"
    ]  # fmt: skip
    assert url_of(recorder.received[0]) == "http://judge.test:8000/v1/chat/completions"


def test_chat_params_mapping() -> None:
    params, instructions, dropped = chat_params(
        {
            "input": [],
            "metadata": {},
            "max_output_tokens": 7,
            "top_logprobs": 2,
            "stream": False,
            "tools": [],
            "text": {"format": {"type": "json_schema", "name": "v", "schema": {}, "strict": True}},
        }
    )
    assert params == {
        "max_tokens": 7,
        "top_logprobs": 2,
        "logprobs": True,
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "v", "schema": {}, "strict": True},
        },
        "n": 1,
    }
    assert instructions is None
    assert sorted(dropped) == ["stream", "tools"]
    assert chat_params({"text": {"format": {"type": "json_object"}}})[0]["response_format"] == {
        "type": "json_object"
    }


# --- tokens ---------------------------------------------------------------------------------


async def test_bearer_token_sent_and_never_echoed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GENRM_TEST_JUDGE_TOKEN", TOKEN)
    recorder = Recorder(ok(responses_reply()), Reply(401, b"judge offline"), REFUSED)
    judge = judge_with(recorder, api_key_env="GENRM_TEST_JUDGE_TOKEN")
    with trio.fail_after(5):
        await judge.attempt(CALL)
        with pytest.raises(JudgeHTTPError) as http_error:
            await judge.attempt(CALL)
        with pytest.raises(JudgeTransportError) as transport_error:
            await judge.attempt(CALL)
    assert recorder.received[0].headers["authorization"] == f"Bearer {TOKEN}"
    for text in (
        http_error.value.describe(),
        transport_error.value.describe(),
        repr(judge),
        str(http_error.value),
    ):
        assert TOKEN not in text
    assert http_error.value.describe() == "JudgeHTTPError: HTTP 401; response=judge offline"


async def test_error_body_echoing_credentials_is_redacted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A judge or proxy that echoes the request headers must not put the token into failure
    # reasons or logs (found by the reliability suite with a real echoing judge).
    monkeypatch.setenv("GENRM_TEST_JUDGE_TOKEN", TOKEN)
    echoed = f"refused (authorization: Bearer {TOKEN}; x-other: {TOKEN}; bearer abc.def)"
    recorder = Recorder(Reply(500, echoed.encode()))
    judge = judge_with(recorder, api_key_env="GENRM_TEST_JUDGE_TOKEN")
    with trio.fail_after(5), pytest.raises(JudgeHTTPError) as error:
        await judge.attempt(CALL)
    described = error.value.describe()
    assert TOKEN not in described
    assert "abc.def" not in described
    assert described == (
        "JudgeHTTPError: HTTP 500; response=refused (authorization: Bearer [redacted]; "
        "x-other: [redacted]; bearer [redacted])"
    )


@pytest.mark.parametrize(
    "echo",
    [
        TOKEN,
        TOKEN.upper(),
        "".join(f"\\u{ord(c):04x}" for c in TOKEN),
        "".join(f"\\u{ord(c):04X}" if i % 2 else c for i, c in enumerate(TOKEN)),
        "".join(f"%{b:02x}" for b in TOKEN.encode()),
        "".join(f"%{b:02X}" if i % 3 else chr(b) for i, b in enumerate(TOKEN.encode())),
        "".join(f"\\x{b:02x}" for b in TOKEN.encode()),
        TOKEN.replace("-", "\\-"),
    ],
)
def test_the_redaction_catches_every_escaped_form_of_the_token(echo: str) -> None:
    redact = Redactor(TOKEN)
    assert redact(f"key={echo};".encode()) == b"key=[redacted];"
    assert redact.text(f"key={echo};") == "key=[redacted];"


@pytest.mark.parametrize("start", [0, 40, 79, 80, 81])
def test_an_excerpt_is_cut_after_redaction(start: int) -> None:
    # The 80-byte preview of a non-JSON reply: a token straddling the cut shows no byte of it.
    body = b"x" * start + TOKEN.encode() + b"y" * 200
    head = Redactor(TOKEN)(body, 80)
    # the first 80 bytes as sent, the token wholly replaced even where it runs past them
    after = b"y" * max(0, 80 - start - len(TOKEN))
    expected = b"x" * start + b"[redacted]" + after if start < 80 else b"x" * 80
    assert head == expected
    assert Redactor(TOKEN)(b"Bearer " + b"z" * 300, 80) == b"Bearer [redacted]"
    assert Redactor(None)(body, 80) == body[:80]


async def test_a_transport_error_quoting_a_header_value_is_redacted() -> None:
    # httpx quotes an illegal header value in full: the key from a file with its newline
    exc = httpx.LocalProtocolError(f"Illegal header value b'Bearer {TOKEN}\\n'")
    assert transport_error(exc, Redactor(TOKEN)).describe() == (
        "LocalProtocolError: Illegal header value b'Bearer [redacted]'"
    )
    exc = httpx.DecodingError(f"unsupported Content-Encoding '{TOKEN}'")
    assert transport_error(exc, Redactor(TOKEN)).describe() == (
        "DecodingError: unsupported Content-Encoding '[redacted]'"
    )


async def test_a_non_json_preview_never_shows_part_of_the_token(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("GENRM_TEST_JUDGE_TOKEN", TOKEN)
    body = b"x" * 70 + TOKEN.encode() + b" and more"
    recorder = Recorder(Reply(200, body, ("content-type: text/plain",)))
    judge = judge_with(recorder, api_key_env="GENRM_TEST_JUDGE_TOKEN")
    with trio.fail_after(5), pytest.raises(JudgeBadJSON) as error:
        await judge.attempt(CALL)
    described = error.value.describe()
    assert TOKEN[:10] not in described
    assert f"first '{'x' * 70}[redacted]'…" in described


# --- reply classification -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reply", "status"),
    [
        (responses_reply(), ReplyStatus.COMPLETED),
        (responses_reply(status=None), ReplyStatus.COMPLETED),
        ({k: v for k, v in responses_reply().items() if k != "status"}, ReplyStatus.COMPLETED),
        (responses_reply(status="incomplete", incomplete_details={"reason": "max_output_tokens"}),
         ReplyStatus.BUDGET_EXHAUSTED),
        (responses_reply(None, status="incomplete",
                         incomplete_details={"reason": "max_output_tokens"}),
         ReplyStatus.BUDGET_EXHAUSTED),
        (responses_reply(status="incomplete", incomplete_details={"reason": "content_filter"}),
         ReplyStatus.UNUSABLE),
        (responses_reply(status="incomplete"), ReplyStatus.UNUSABLE),
        (responses_reply(status="failed"), ReplyStatus.UNUSABLE),
        (responses_reply(status="cancelled"), ReplyStatus.UNUSABLE),
        (responses_reply(status="queued"), ReplyStatus.UNUSABLE),
        (responses_reply(None), ReplyStatus.UNUSABLE),
        (responses_reply(""), ReplyStatus.UNUSABLE),
        (responses_reply(" \n\t"), ReplyStatus.UNUSABLE),
        ({"status": "completed", "output": []}, ReplyStatus.UNUSABLE),
        ({"status": "completed", "output": [{"type": "reasoning", "summary": []}]},
         ReplyStatus.UNUSABLE),
        ({"status": "completed", "output": "text"}, ReplyStatus.UNUSABLE),
        (None, ReplyStatus.UNUSABLE),
        ({}, ReplyStatus.UNUSABLE),
        ([], ReplyStatus.UNUSABLE),
        ("completed", ReplyStatus.UNUSABLE),
        (3, ReplyStatus.UNUSABLE),
    ],
)  # fmt: skip
def test_responses_classification(reply: object, status: ReplyStatus) -> None:
    result = interpret_responses(reply)
    assert result.status is status
    if status is ReplyStatus.COMPLETED:
        assert result.text == VERDICT_TEXT
    else:
        assert result.text == ""


def test_responses_text_concatenates_output_text_of_message_items() -> None:
    reply = {
        "output": [
            {"type": "reasoning", "summary": [{"type": "summary_text", "text": "hmm"}]},
            {"type": "message", "content": [
                {"type": "output_text", "text": "a"},
                {"type": "refusal", "refusal": "no"},
                {"type": "output_text", "text": None},
                {"type": "output_text", "text": "b"},
            ]},
            "junk",
            {"type": "message", "content": [{"type": "output_text", "text": "c"}]},
        ]
    }  # fmt: skip
    assert interpret_responses(reply).text == "abc"


@pytest.mark.parametrize(
    ("reply", "status"),
    [
        (chat_reply(), ReplyStatus.COMPLETED),
        (chat_reply(finish=None), ReplyStatus.COMPLETED),
        (chat_reply(finish="length"), ReplyStatus.BUDGET_EXHAUSTED),
        (chat_reply(None, finish="length"), ReplyStatus.BUDGET_EXHAUSTED),
        (chat_reply(finish="content_filter"), ReplyStatus.UNUSABLE),
        (chat_reply(finish="tool_calls"), ReplyStatus.UNUSABLE),
        (chat_reply(None), ReplyStatus.UNUSABLE),
        (chat_reply("  "), ReplyStatus.UNUSABLE),
        (chat_reply([{"type": "text", "text": VERDICT_TEXT}]), ReplyStatus.UNUSABLE),
        ({"choices": []}, ReplyStatus.UNUSABLE),
        ({"choices": [None]}, ReplyStatus.UNUSABLE),
        ({"choices": [{"finish_reason": "stop"}]}, ReplyStatus.UNUSABLE),
        ({}, ReplyStatus.UNUSABLE),
        (None, ReplyStatus.UNUSABLE),
    ],
)
def test_chat_classification(reply: object, status: ReplyStatus) -> None:
    assert interpret_chat(reply).status is status


def test_chat_ignores_reasoning_content() -> None:
    reply = chat_reply()
    reply["choices"][0]["message"]["reasoning_content"] = "thinking"
    assert interpret_chat(reply).text == VERDICT_TEXT


@pytest.mark.parametrize(
    ("usage", "expected"),
    [
        ({"input_tokens": 10, "output_tokens": 3}, (10, 3)),
        ({"prompt_tokens": 11, "completion_tokens": 4}, (11, 4)),
        ({"input_tokens": 12, "completion_tokens": 5}, (12, 5)),
        ({"input_tokens": 10.0, "output_tokens": 3.0}, (10, 3)),
        ({"input_tokens": True, "output_tokens": 3}, (None, None)),
        ({"input_tokens": 10, "output_tokens": False}, (None, None)),
        ({"input_tokens": "10", "output_tokens": 3}, (None, None)),
        ({"input_tokens": float("nan"), "output_tokens": 3}, (None, None)),
        ({"input_tokens": 10}, (None, None)),
        ({}, (None, None)),
        (None, (None, None)),
        ("10", (None, None)),
    ],
)
def test_usage_fields(usage: object, expected: tuple[int | None, int | None]) -> None:
    for reply in (responses_reply(usage=usage), chat_reply(usage=usage)):
        for interpret in (interpret_responses, interpret_chat):
            result = interpret(reply)
            assert (result.input_tokens, result.output_tokens) == expected


def test_usage_is_read_from_unusable_replies_too() -> None:
    reply = responses_reply(
        status="incomplete",
        incomplete_details={"reason": "max_output_tokens"},
        usage={"input_tokens": 100, "output_tokens": 16384},
    )
    result = interpret_responses(reply)
    assert (result.status, result.input_tokens, result.output_tokens) == (
        ReplyStatus.BUDGET_EXHAUSTED,
        100,
        16384,
    )


# --- status, JSON and transport errors (D14) ------------------------------------------------


async def test_json_parsed_regardless_of_content_type_and_nan_allowed() -> None:
    text = json.dumps(responses_reply('{"score_1": NaN}'))
    recorder = Recorder(
        Reply(200, text.encode(), ("content-type: text/plain",)),
        Reply(200, b'{"status": "completed", "x": NaN}'),
    )
    judge = judge_with(recorder)
    with trio.fail_after(5):
        reply = await judge.attempt(CALL)
        assert reply.status is ReplyStatus.COMPLETED
        assert reply.text == '{"score_1": NaN}'
        assert (await judge.attempt(CALL)).status is ReplyStatus.UNUSABLE


@pytest.mark.parametrize(
    "content",
    [b"<html>proxy error</html>", b"", b'{"status": ', b"\xff\xfe\x00garbage", b"[" * 100_000],
)
async def test_non_json_2xx_is_bad_json(content: bytes) -> None:
    judge = judge_with(Recorder(Reply(200, content)))
    with trio.fail_after(5), pytest.raises(JudgeBadJSON) as info:
        await judge.attempt(CALL)
    assert info.value.describe().startswith("JSONDecodeError: ")
    assert not info.value.retryable


@pytest.mark.parametrize("extra_values", [0, 1])
async def test_a_reply_of_too_many_values_is_refused_before_it_is_decoded(
    extra_values: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # (#40 item 2) a 30 MiB judge reply of `[[],…]` decoded to 800 MB, 2.9 s on the loop
    most = client_module.MAX_REPLY_VALUES
    # marks inside the verdict text are not values: a text of braces is not refused
    text = "{" * most + VERDICT_TEXT
    base = json.dumps(responses_reply(text, junk=[])).encode()
    fill = most - values_outside_strings_at_most(base, base.count(b'"')) + extra_values
    body = base.replace(b'"junk": []', b'"junk": [' + b"0," * fill + b"0]")
    assert values_outside_strings_at_most(body, most) == most + extra_values
    decoded: list[int] = []
    real_loads = json.loads

    def loads(content: bytes) -> Any:
        decoded.append(len(content))
        return real_loads(content)

    monkeypatch.setattr(client_module.json, "loads", loads)
    judge = judge_with(Recorder(Reply(200, body, ("content-type: application/json",))))
    with trio.fail_after(5):
        if not extra_values:
            assert (await judge.attempt(CALL)).status is ReplyStatus.COMPLETED
            assert decoded == [len(body)]
            return
        with pytest.raises(JudgeBadJSON) as info:
            await judge.attempt(CALL)
    assert decoded == []
    assert info.value.describe() == (
        f"JSONDecodeError: the reply holds up to {client_module.MAX_REPLY_VALUES + 1} JSON "
        f"values, more than the {client_module.MAX_REPLY_VALUES} a judge reply may hold "
        f"(content-type application/json, {len(body)} bytes)"
    )
    assert not info.value.retryable


@pytest.mark.parametrize("large", [False, True])
async def test_a_large_reply_is_decoded_in_a_worker_thread(
    large: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # (#40 item 3) a 32 MiB reply took 40 ms of one decode on the loop
    threads: list[str] = []
    real_loads = json.loads

    def loads(content: bytes) -> Any:
        threads.append(threading.current_thread().name)
        return real_loads(content)

    monkeypatch.setattr(client_module.json, "loads", loads)
    size = client_module.DECODE_OFF_LOOP_BYTES - (0 if large else 1)
    base = json.dumps(responses_reply(pad="")).encode()
    body = base.replace(b'"pad": ""', b'"pad": "' + b"x" * (size - len(base)) + b'"')
    assert len(body) == size
    judge = judge_with(Recorder(Reply(200, body)))
    with trio.fail_after(5):
        assert (await judge.attempt(CALL)).status is ReplyStatus.COMPLETED
    assert len(threads) == 1
    assert (threads[0] != threading.main_thread().name) is large


@pytest.mark.parametrize(
    ("status", "retryable"),
    [(400, False), (401, False), (403, False), (404, False), (409, False), (422, False),
     (408, True), (429, True), (500, True), (502, True), (503, True), (599, True),
     (302, False), (600, False)],
)  # fmt: skip
async def test_non_2xx_is_http_error_with_body(status: int, retryable: bool) -> None:
    recorder = Recorder(Reply(status, b"judge offline", ("content-type: text/plain",)))
    judge = judge_with(recorder)
    with trio.fail_after(5), pytest.raises(JudgeHTTPError) as info:
        await judge.attempt(CALL)
    error = info.value
    assert (error.status, error.body, error.retryable) == (status, b"judge offline", retryable)
    assert error.describe() == f"JudgeHTTPError: HTTP {status}; response=judge offline"
    assert error.retry_after is None


async def test_http_error_body_is_cut_and_not_json_read() -> None:
    body = b'{"error": "' + b"x" * 5000 + b'"}'
    judge = judge_with(Recorder(Reply(500, body)))
    with trio.fail_after(5), pytest.raises(JudgeHTTPError) as info:
        await judge.attempt(CALL)
    assert info.value.body == body[:1000]
    assert info.value.describe() == "JudgeHTTPError: HTTP 500; response=" + body[:1000].decode()


async def test_http_error_without_body() -> None:
    judge = judge_with(Recorder(Reply(503)))
    with trio.fail_after(5), pytest.raises(JudgeHTTPError) as info:
        await judge.attempt(CALL)
    assert info.value.describe() == "JudgeHTTPError: HTTP 503"


async def test_retry_after_seconds_and_http_date() -> None:
    when = datetime.now(UTC) + timedelta(seconds=120)
    recorder = Recorder(
        Reply(429, headers=("retry-after: 7",)),
        Reply(503, headers=(f"retry-after: {format_datetime(when, usegmt=True)}",)),
        Reply(429, headers=("retry-after: soon",)),
    )
    judge = judge_with(recorder)
    found: list[float | None] = []
    with trio.fail_after(5):
        for _ in range(3):
            with pytest.raises(JudgeHTTPError) as info:
                await judge.attempt(CALL)
            found.append(info.value.retry_after)
    assert found[0] == 7.0
    assert found[1] is not None and 100 < found[1] <= 120
    assert found[2] is None


def test_parse_retry_after() -> None:
    assert parse_retry_after(None) is None
    assert parse_retry_after(" 0 ") == 0.0
    assert parse_retry_after("1.5") == 1.5
    assert parse_retry_after("-1") is None
    assert parse_retry_after("inf") is None
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", now=1445412470.0) == 10.0
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", now=1445412490.0) == 0.0
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00") is None  # no zone
    assert parse_retry_after("not a date") is None


class _Failing(trio.abc.Stream):
    """A connection whose reads raise `error` (what a failing connection layer would raise)."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await trio.lowlevel.checkpoint()

    async def wait_send_all_might_not_block(self) -> None:
        await trio.lowlevel.checkpoint()

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        await trio.lowlevel.checkpoint()
        raise self.error

    async def aclose(self) -> None:
        await trio.lowlevel.checkpoint()


class _FailingBackend:
    def __init__(self, error: Exception) -> None:
        self.error = error

    async def connect_tcp(self, host: str, port: int) -> trio.abc.Stream:
        return _Failing(self.error)


class _RefusingBackend:
    async def connect_tcp(self, host: str, port: int) -> trio.abc.Stream:
        raise ConnectionRefusedError(111, "Connection refused")


@pytest.mark.parametrize(
    ("exc", "name", "retryable"),
    [
        (httpx.ConnectError("connection refused"), "ConnectError", True),
        (httpx.ReadError("connection reset"), "ReadError", True),
        (httpx.WriteError("broken pipe"), "WriteError", True),
        # Not one the pool raises (it closes connections quietly): a bug, named, not retried.
        (httpx.CloseError("close failed"), "CloseError", False),
        (httpx.RemoteProtocolError("peer closed connection without sending complete message body"),
         "RemoteProtocolError", True),
        (httpx.LocalProtocolError("bad request"), "LocalProtocolError", False),
        (httpx.ProxyError("proxy"), "ProxyError", False),
        (httpx.UnsupportedProtocol("ftp"), "UnsupportedProtocol", False),
        (httpx.DecodingError("bad gzip"), "DecodingError", False),
        (ResponseTooLarge("judge response exceeds"), "ResponseTooLarge", False),
        (CertificateError("TLS handshake failed: CERTIFICATE_VERIFY_FAILED"), "ConnectError",
         False),
    ],
)  # fmt: skip
async def test_transport_errors_are_mapped(exc: Exception, name: str, retryable: bool) -> None:
    # Raised inside the pool's exchange, mapped at the judge's boundary by TRANSPORT_ERRORS.
    judge = make_http_judge(settings(), backend=_FailingBackend(exc))
    with trio.fail_after(5), pytest.raises(JudgeTransportError) as info:
        await judge.attempt(CALL)
    assert info.value.type_name == name
    assert info.value.retryable is retryable
    assert info.value.describe() == f"{name}: {exc}"
    assert info.value.__cause__ is exc


def test_the_table_names_a_judge_error_for_every_failure_of_the_pool() -> None:
    # Every row is an httpx error the pool or its connection raises; subclasses come before
    # the classes they refine (the first row that matches wins).
    kinds = [kind for kind, *_ in TRANSPORT_ERRORS]
    for i, kind in enumerate(kinds):
        assert not any(issubclass(kind, earlier) for earlier in kinds[:i]), kind
    assert {name for _, name, *_ in TRANSPORT_ERRORS} == {
        "ConnectError", "ReadError", "WriteError", "RemoteProtocolError", "ResponseTooLarge",
        "DecodingError", "LocalProtocolError",
    }  # fmt: skip
    # A failure of the replica, not of the request, is retried elsewhere in a fleet.
    assert [
        kind for kind, _, retry, elsewhere, _ in TRANSPORT_ERRORS if elsewhere and not retry
    ] == [CertificateError]
    # Only a connection that could not be opened leaves the request unsent (an outage).
    assert [kind for kind, *_, reached in TRANSPORT_ERRORS if not reached] == [UnreachableError]


async def test_a_refused_connection_never_reached_a_server() -> None:
    refused = make_http_judge(settings(), backend=_RefusingBackend())
    with trio.fail_after(5), pytest.raises(JudgeTransportError) as info:
        await refused.attempt(CALL)
    assert (info.value.type_name, info.value.retryable, info.value.reached) == (
        "ConnectError",
        True,
        False,
    )
    assert info.value.describe() == "ConnectError: [Errno 111] Connection refused"
    assert await refused.probe() == info.value.describe()  # GET /models fails the same way


async def test_an_asgi_judge_over_the_in_memory_network() -> None:
    seen: list[dict[str, Any]] = []

    async def app(scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        assert scope["type"] == "http"
        seen.append({"path": scope["path"], "body": await request_json(receive)})
        await reply_json(send, responses_reply(usage={"input_tokens": 5, "output_tokens": 6}))

    judge = make_http_judge(settings(), backend=MemoryNetwork(serve_asgi(app)))
    with trio.fail_after(5):
        reply = await judge.attempt(CALL)
    assert reply == JudgeReply(ReplyStatus.COMPLETED, VERDICT_TEXT, 5, 6)
    assert seen[0]["path"] == "/v1/responses"
    assert seen[0]["body"]["metadata"] == {"response_1": "four", "response_2": "4"}
    await judge.aclose()
    await judge.aclose()  # idempotent
    with pytest.raises(RuntimeError):
        await judge.attempt(CALL)


# --- the keep-alive pool over real sockets (real clock, numeric 127.0.0.1) -----------------


async def test_pool_reuses_one_connection_for_sequential_calls() -> None:
    body = json.dumps(responses_reply(usage={"input_tokens": 1, "output_tokens": 2})).encode()

    async def script(n: int, request: bytes, stream: trio.SocketStream) -> bool:
        await stream.send_all(response_bytes(200, body, ["content-type: text/plain"]))
        return True

    async with scripted_judge(script) as (server, judge):
        with trio.fail_after(5):
            for _ in range(3):
                assert (await judge.attempt(CALL)).status is ReplyStatus.COMPLETED
            assert server.connections == 1
            assert judge.open_connections == 1
            head = server.requests[0].split(b"\r\n\r\n")[0].lower()
            assert head.startswith(b"post /v1/responses http/1.1")
            assert f"host: 127.0.0.1:{server.port}".encode() in head
            await judge.aclose()  # here: the server must see every connection close
            await server.all_closed.wait()
            assert judge.open_connections == 0


def _answer_after(release: trio.Event) -> Script:
    """A script that answers every request with a verdict once `release` is set."""
    body = json.dumps(responses_reply()).encode()

    async def script(n: int, request: bytes, stream: trio.SocketStream) -> bool:
        await release.wait()
        await stream.send_all(response_bytes(200, body))
        return True

    return script


async def test_pool_concurrent_calls_use_one_connection_each() -> None:
    release = trio.Event()
    async with scripted_judge(_answer_after(release)) as (server, judge):
        with trio.fail_after(5):
            async with trio.open_nursery() as calls:
                for _ in range(20):
                    calls.start_soon(judge.attempt, CALL)
                await server.wait_requests(20)
                assert judge.in_flight == 20
                assert server.connections == 20
                release.set()
            assert judge.in_flight == 0
            assert judge.open_connections == 20  # kept alive for reuse
            await judge.aclose()  # within the bound (the helper's own close is not)


def _awaiting_frames(coroutine: Any) -> list[Any]:
    """The frames of a suspended coroutine and of everything it awaits."""
    frames = []
    while coroutine is not None and getattr(coroutine, "cr_frame", None) is not None:
        frames.append(coroutine.cr_frame)
        coroutine = coroutine.cr_await
    return frames


async def test_a_call_awaiting_its_reply_holds_no_copy_of_its_request() -> None:
    # 1,024 calls waiting on a 200 ms judge each kept its prompt's bytes twice (~6 MB).
    release = trio.Event()
    call = JudgeCall(HISTORY, "an answer " * 50, "another answer " * 50, None)
    async with scripted_judge(_answer_after(release)) as (server, judge):
        with trio.fail_after(5):
            async with trio.open_nursery() as calls:
                calls.start_soon(judge.attempt, call)
                await server.got_request.wait()
                await trio.testing.wait_all_tasks_blocked()
                (task,) = calls.child_tasks
                frames = _awaiting_frames(task.coro)
                assert any(f.f_code.co_name == "_fill" for f in frames)  # waiting for the reply
                held = [
                    (f.f_code.co_name, name)
                    for f in frames
                    for name, value in f.f_locals.items()
                    if (isinstance(value, (bytes, bytearray)) and b"another answer" in value)
                    or (isinstance(value, list) and any(isinstance(v, bytes) for v in value))
                ]
                assert held == []
                release.set()
            assert b"another answer" in server.requests[0]
            await judge.aclose()  # within the bound (the helper's own close is not)


async def test_pool_real_http_error_with_retry_after_and_token(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("GENRM_TEST_JUDGE_TOKEN", TOKEN)

    async def script(n: int, request: bytes, stream: trio.SocketStream) -> bool:
        await stream.send_all(response_bytes(429, b"slow down", ["Retry-After: 3"]))
        return True

    async with scripted_judge(script, api_key_env="GENRM_TEST_JUDGE_TOKEN") as (server, judge):
        with trio.fail_after(5), pytest.raises(JudgeHTTPError) as info:
            await judge.attempt(CALL)
        assert (info.value.status, info.value.body, info.value.retry_after) == (
            429,
            b"slow down",
            3.0,
        )
        assert f"authorization: Bearer {TOKEN}".encode() in server.requests[0]
        assert TOKEN not in info.value.describe()


async def test_pool_interrupted_body_is_remote_protocol_error_and_connection_dropped() -> None:
    async def script(n: int, request: bytes, stream: trio.SocketStream) -> bool:
        if n == 0:
            await stream.send_all(b'HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n{"status":')
            return False  # close mid-body
        await stream.send_all(response_bytes(200, json.dumps(responses_reply()).encode()))
        return True

    async with scripted_judge(script) as (server, judge):
        with trio.fail_after(5):
            with pytest.raises(JudgeTransportError) as info:
                await judge.attempt(CALL)
            assert info.value.type_name == "RemoteProtocolError"
            assert info.value.retryable
            assert judge.open_connections == 0
            assert (await judge.attempt(CALL)).status is ReplyStatus.COMPLETED
            assert server.connections == 2


async def test_pool_server_closing_idle_connection_is_not_a_failure() -> None:
    body = json.dumps(responses_reply()).encode()

    async def script(n: int, request: bytes, stream: trio.SocketStream) -> bool:
        await stream.send_all(response_bytes(200, body))
        return False  # keep-alive refused by closing after each reply

    async with scripted_judge(script) as (server, judge):
        with trio.fail_after(5):
            for _ in range(3):
                await judge.attempt(CALL)
                await server.all_closed.wait()
            assert server.connections == 3


async def test_pool_cancelled_attempt_closes_its_connection() -> None:
    async def script(n: int, request: bytes, stream: trio.SocketStream) -> bool:
        # The judge never answers; the client must close the connection when cancelled.
        assert await stream.receive_some() == b""
        return False

    async with scripted_judge(script) as (server, judge):
        with trio.fail_after(5):
            async with trio.open_nursery() as calls:
                calls.start_soon(judge.attempt, CALL)
                await server.got_request.wait()
                assert (judge.in_flight, judge.open_connections) == (1, 1)
                calls.cancel_scope.cancel()
            assert (judge.in_flight, judge.open_connections) == (0, 0)
            await server.all_closed.wait()  # the server saw the connection close


async def test_closed_port_is_one_connect_error() -> None:
    with socket.socket() as sock:  # a port that was just free: nothing listens on it
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    judge = real_judge(port)
    with trio.fail_after(5), pytest.raises(JudgeTransportError) as info:
        await judge.attempt(CALL)
    assert info.value.type_name == "ConnectError"
    assert info.value.retryable
    assert info.value.describe().startswith("ConnectError: ")
    # trio says "all attempts to connect to ... failed"; the reason under it is kept
    assert info.value.describe() == (
        f"ConnectError: all attempts to connect to 127.0.0.1:{port} failed: "
        f"[Errno 111] Error connecting to ('127.0.0.1', {port}): Connection refused"
    )
    assert judge.open_connections == 0
    await judge.aclose()


async def test_pool_closes_connections_idle_past_keepalive() -> None:
    body = json.dumps(responses_reply()).encode()

    async def script(n: int, request: bytes, stream: trio.SocketStream) -> bool:
        await stream.send_all(response_bytes(200, body))
        return True

    async with scripted_judge(script, keepalive_expiry_s=0.05) as (server, judge):
        with trio.fail_after(5):
            async with trio.open_nursery() as calls:  # two connections
                for _ in range(2):
                    calls.start_soon(judge.attempt, CALL)
            assert judge.open_connections == 2
            await trio.sleep(0.1)  # both idle longer than the keep-alive expiry
            await judge.attempt(CALL)
            assert judge.open_connections == 1
            assert server.connections == 3


async def test_virtual_time_drives_a_scripted_judge(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async def slow(request: Request) -> Fixed:
        await trio.sleep(30)
        return ok(responses_reply())

    judge = make_http_judge(settings(), backend=Recorder(slow).network)
    start = trio.current_time()
    with trio.fail_after(60):
        await judge.attempt(CALL)
    assert trio.current_time() - start == 30


# --- the pool's HTTP/1.1 response parsing over real sockets ------------------------------------


def _reply_with(raw: bytes, *, keep: bool = True) -> Script:
    async def script(n: int, request: bytes, stream: trio.SocketStream) -> bool:
        await stream.send_all(raw)
        return keep

    return script


async def _one_attempt(script: Script) -> tuple[JudgeReply | Exception, TinyServer, HttpJudge]:
    """One attempt; the judge is returned open, so callers see the connections it kept."""
    async with tiny_server(script) as server:
        judge = real_judge(server.port)
        with trio.fail_after(5):
            try:
                outcome: JudgeReply | Exception = await judge.attempt(CALL)
            except Exception as exc:
                outcome = exc
    return outcome, server, judge


async def test_pool_reads_chunked_replies_with_extensions_and_trailers() -> None:
    body = json.dumps(responses_reply()).encode()
    raw = (
        b"HTTP/1.1 100 Continue\r\n\r\n"
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        + b"%x;ext=1\r\n" % 10
        + body[:10]
        + b"\r\n"
        + b"%X\r\n" % (len(body) - 10)
        + body[10:]
        + b"\r\n0\r\nx-trailer: 1\r\n\r\n"
    )
    reply, _, judge = await _one_attempt(_reply_with(raw))
    assert isinstance(reply, JudgeReply) and reply.status is ReplyStatus.COMPLETED
    assert judge.open_connections == 1  # kept for reuse
    await judge.aclose()


async def test_pool_reads_close_delimited_http10_replies_and_honours_connection_close() -> None:
    body = json.dumps(responses_reply()).encode()
    reply, _, judge = await _one_attempt(_reply_with(b"HTTP/1.0 200 OK\r\n\r\n" + body, keep=False))
    assert isinstance(reply, JudgeReply) and reply.status is ReplyStatus.COMPLETED
    assert judge.open_connections == 0
    await judge.aclose()
    closing = response_bytes(200, body, ["Connection: close"])
    reply, _, judge = await _one_attempt(_reply_with(closing))
    assert isinstance(reply, JudgeReply) and judge.open_connections == 0
    await judge.aclose()


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"", "RemoteProtocolError: Server disconnected without sending a response."),
        (b"HTTP/1.1 200 OK\r\ncontent-len", "RemoteProtocolError: peer closed connection"),
        (b"SMTP ready\r\n\r\n", "RemoteProtocolError: illegal status line"),
        (b"HTTP/1.1 200 OK\r\nno colon\r\n\r\n", "RemoteProtocolError: illegal header line"),
        (
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n10\r\nabc",
            "RemoteProtocolError: peer closed connection without sending complete message body: "
            "incomplete chunked read",
        ),
        (
            b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nabc",
            "RemoteProtocolError: peer closed connection without sending complete message body: "
            "received 3 bytes, expected 10",
        ),
    ],
)
async def test_pool_broken_replies_are_retryable_transport_errors(raw: bytes, message: str) -> None:
    error, _, judge = await _one_attempt(_reply_with(raw, keep=False))
    assert isinstance(error, JudgeTransportError), error
    assert error.retryable
    assert error.describe().startswith(message), error.describe()
    assert judge.open_connections == 0
    await judge.aclose()


async def test_pool_sends_any_request_and_returns_the_whole_reply() -> None:
    # No httpx transport: the pool's exchange is the one way to the judge (bench and the
    # probe use it too).
    body = json.dumps({"ok": True}).encode()
    async with tiny_server(_reply_with(response_bytes(201, body, ["x-reply: yes"]))) as server:
        pool = KeepAlivePool(httpx.URL(f"http://127.0.0.1:{server.port}"))
        headers = [(b"host", b"127.0.0.1"), (b"content-type", b"application/json")]
        with trio.fail_after(5):
            status, reply_headers, reply = await pool.exchange(
                (b"POST", b"/x?q=1", headers, json.dumps({"a": 1}).encode())
            )
            await pool.aclose()
        assert (status, json.loads(reply), dict(reply_headers)[b"x-reply"]) == (
            201,
            {"ok": True},
            b"yes",
        )
        head, _, sent = server.requests[0].partition(b"\r\n\r\n")
        assert head.startswith(b"POST /x?q=1 HTTP/1.1\r\n") and json.loads(sent) == {"a": 1}


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
async def test_pool_over_tls_reuses_its_connection(tmp_path: Path) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    await trio.run_process(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
         "-keyout", str(key), "-out", str(cert)],
        capture_stdout=True, capture_stderr=True,
    )  # fmt: skip
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_context.load_cert_chain(cert, key)
    body = json.dumps(responses_reply()).encode()
    connections = 0

    async def handle(stream: trio.SocketStream) -> None:
        nonlocal connections
        connections += 1
        await serve_tls(stream, server_context, lambda request: body)

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(trio.serve_tcp, handle, 0)
        port = listeners[0].socket.getsockname()[1]
        pool = KeepAlivePool(
            httpx.URL(f"https://127.0.0.1:{port}"),
            ssl_context=ssl.create_default_context(cafile=str(cert)),
        )
        headers = [(b"host", b"127.0.0.1"), (b"content-length", b"2")]
        request = (b"POST", b"/v1/responses", headers, b"{}")
        with trio.fail_after(10):
            for _ in range(3):
                status, _, reply = await pool.exchange(request)
                assert (status, reply) == (200, body)
            assert (connections, pool.connections) == (1, 1)
            await pool.aclose()
        nursery.cancel_scope.cancel()


async def test_an_untrusted_certificate_is_one_attempt_and_another_replica_answers(
    judge_tls: tuple[str, ssl.SSLContext], autojump_clock: trio.testing.MockClock
) -> None:
    """TLS over the in-memory network. One judge: the certificate failure is not retried (it
    would fail again), its cause in the text. A fleet: it belongs to that replica, which is
    avoided; the other answers."""
    from scripted import ByHost

    from genrm_trio.judge.attempts import Comparator
    from genrm_trio.judge.base import JudgeError
    from genrm_trio.judge.factory import make_judge
    from genrm_trio.metrics import Metrics

    ca_file, server_context = judge_tls  # a certificate for j.test only
    trusted, mismatched = (
        Recorder(ok(responses_reply()), tls=server_context),
        Recorder(ok(responses_reply()), tls=server_context),
    )
    one = settings_from_mapping(
        {"judge": {"api": "genrm_model", "base_url": "https://k.test:8443/v1", "ca_file": ca_file}}
    )
    comparator = Comparator(make_http_judge(one, backend=mismatched.network), one, Metrics())
    with trio.fail_after(60), pytest.raises(JudgeError) as info:
        await comparator.compare(CALL, pair=(0, 1), judge_pass=0)
    assert info.value.attempts == 1
    assert "ConnectError: TLS handshake failed: " in info.value.message
    assert "CERTIFICATE_VERIFY_FAILED" in info.value.message
    assert mismatched.network.connections == 1 and mismatched.received == []
    urls = ["https://k.test:8443/v1", "https://j.test:8443/v1"]
    both = settings_from_mapping(
        {"judge": {"api": "genrm_model", "base_url": urls, "ca_file": ca_file}}
    )
    fleet = make_judge(
        both,
        backend=ByHost({"k.test:8443": mismatched.network, "j.test:8443": trusted.network}),
    )
    result = await Comparator(fleet, both, Metrics()).compare(CALL, pair=(0, 1), judge_pass=0)
    assert result.attempts == 2
    assert len(trusted.received) == 1
    await fleet.aclose()


# --- one source for each list the judge keeps (issue #22) -----------------------------------------


def test_every_judge_api_value_has_one_object_and_one_simulated_side() -> None:
    from typing import get_args

    from genrm_trio.config import JudgeApiName, JudgeSettings
    from genrm_trio.judge.apis import JUDGE_APIS
    from genrm_trio.testing.asgi import SIM_APIS

    names = set(get_args(JudgeApiName))
    assert names == {"genrm_model", "openai_responses", "chat_completions"}
    # the settings take exactly these values (the key's type is the same Literal) ...
    assert JudgeSettings.model_fields["api"].annotation is JudgeApiName
    for name in names:
        assert settings_from_mapping({"judge": {"api": name}}).judge.api == name
    with pytest.raises(ConfigError, match=r"judge\.api"):
        settings_from_mapping({"judge": {"api": "completions"}})
    # ... and each has its client object and its simulated side, none shared between values
    assert len(set(JUDGE_APIS.values())) == len(names)
    for name in names:  # each simulated side reads the output budget its client sends
        api = JUDGE_APIS[name]({})
        body = api.body(dataclasses.replace(CALL, max_output_tokens=77))
        assert body[SIM_APIS[name].budget_key] == 77, name
        assert SIM_APIS[name].call(body).response_1 == CALL.response_1, name
    for name in names:
        assert JUDGE_APIS[name].name == name
    # the simulated judge serves each API at the path the client posts to
    paths = {"/v1" + JUDGE_APIS[name].path for name in names}
    assert paths == {"/v1/responses", "/v1/chat/completions"}


@pytest.mark.parametrize("api", sorted(JUDGE_APIS))
async def test_the_simulated_judge_answers_each_api_where_the_client_posts(
    autojump_clock: trio.testing.MockClock, api: str
) -> None:
    """Each judge API's client, against the simulated judge: the paths agree and the reply
    classifies as a completed verdict."""
    from genrm_trio.testing import SimConfig, sim_asgi_app

    app = sim_asgi_app(SimConfig())
    judge = make_http_judge(settings(api=api), backend=MemoryNetwork(serve_asgi(app)))
    with trio.fail_after(5):
        reply = await judge.attempt(CALL)
    await judge.aclose()
    assert reply.status is ReplyStatus.COMPLETED, reply
    assert app.sim.statistics().calls == 1


def test_the_judge_pool_takes_its_keys_from_the_settings() -> None:
    """`judge_pool`, the one builder of judge pools, passes the `judge.*` pool keys on (values
    other than the pool's own defaults, so that a key dropped on the way shows)."""
    from genrm_trio.config import JudgeSettings
    from genrm_trio.judge.pool import judge_pool

    judge = JudgeSettings(keepalive_expiry_s=2.5, max_response_bytes=4096)
    pool = judge_pool("http://127.0.0.1:9/v1", judge)
    default = KeepAlivePool(httpx.URL("http://127.0.0.1:9/v1"))
    assert (pool._keepalive_expiry, pool._max_body) == (2.5, 4096)
    assert (default._keepalive_expiry, default._max_body) != (2.5, 4096)


async def test_a_judge_key_reaches_the_probe_as_it_reaches_the_calls(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    """`judge.max_response_bytes` caps the probe's reply as it caps a call's: both take their
    pool from `judge_pool`."""
    from genrm_trio.judge.probe import probe_judge

    models = {"data": [{"id": "m" * 600}, {"id": "n" * 600}]}  # a reply over 1 KiB
    recorder = Recorder(ok(models))
    config = settings(max_response_bytes=1024)
    caplog.set_level(logging.WARNING, logger="genrm_trio.serve")
    with trio.fail_after(60):
        # too large a reply: no answer, but the judge is reached (not down from the start)
        report = await probe_judge(config, None, backend=recorder.network)
        assert (report.answered, report.unreachable) == (False, ())
        with pytest.raises(JudgeTransportError) as info:
            await make_http_judge(config, backend=recorder.network).attempt(CALL)
    assert info.value.type_name == "ResponseTooLarge"
    [line] = [r.getMessage() for r in caplog.records if "judge probe" in r.getMessage()]
    assert "failed: ResponseTooLarge: judge response exceeds judge.max_response_bytes (1024" in line
    assert [r.method for r in recorder.received] == ["GET", "POST"]
