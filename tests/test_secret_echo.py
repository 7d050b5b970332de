"""A judge that echoes its bearer token, in every form an echo takes, never gets it into any
output (issue #40, item 1; docs/reliability.md, "Security").

The judge (scripted bytes on the in-memory network) answers each comparison with the token it
received: raw in a JSON error body, `\\uXXXX`-escaped, percent-escaped, gzip-compressed, straddling
the 80-byte preview of a reply that is not JSON, and in a header whose value httpx's error
quotes. The app runs over a durable engine (real clock: SQLite runs in threads). Every log
record, `/verify` row, `/compare` 503 detail, `GET /checkpoint` body and the state files are
searched for the token and each of its escaped forms.
"""

from __future__ import annotations

import gzip
import json
import logging
from pathlib import Path

import pytest
import trio
from http_calls import call, member, post_group
from scripted import Reply, Script

from genrm_trio.app.compose import durable_engine
from genrm_trio.config import Settings, settings_from_mapping
from genrm_trio.http.app import create_app
from genrm_trio.judge.client import make_http_judge
from genrm_trio.testing.network import Request

JUDGE_ENV = "GENRM_TEST_ECHOED_JUDGE_TOKEN"
TOKEN = "sk-echo-0123456789abcdefABCDEF"
LIMIT_S = 30.0


def unicode_escaped(text: str) -> str:
    return "".join(f"\\u{ord(c):04x}" for c in text)


def percent_escaped(text: str) -> str:
    return "".join(f"%{byte:02X}" for byte in text.encode())


FORMS = ("json", "unicode", "percent", "gzip", "preview", "header")
SHOWN = (TOKEN, unicode_escaped(TOKEN), percent_escaped(TOKEN), TOKEN[:12], TOKEN[-12:])
"""What must not appear anywhere: the token, its escapes, and either end of it."""


def echo(form: str, token: str) -> Reply:
    """The judge's reply to a call whose answers name `form`, echoing `token`."""
    match form:
        case "json":
            return Reply.json({"error": f"bad key {token}"}, 500)
        case "unicode":
            body = ('{"error": "bad key ' + unicode_escaped(token) + '"}').encode()
            return Reply(500, body, ("content-type: application/json",))
        case "percent":
            return Reply(500, f"GET /?key={percent_escaped(token)}".encode())
        case "gzip":
            return Reply(500, gzip.compress(f"key={token}".encode()), ("content-encoding: gzip",))
        case "preview":  # the token starts at byte 75 of a non-JSON 2xx reply
            return Reply(200, ("x" * 75 + token + " tail").encode(), ("content-type: text/plain",))
        case "header":  # httpx quotes an unsupported Content-Encoding value in its error
            return Reply(200, b"{}", (f"content-encoding: {token}",))
    raise AssertionError(form)


async def judge_answer(request: Request) -> Reply:
    token = request.headers["authorization"].removeprefix("Bearer ")
    text = json.dumps(request.json())
    form = next(form for form in FORMS if f"form-{form}-" in text)
    return echo(form, token)


def config(tmp_path: Path) -> Settings:
    return settings_from_mapping(
        {
            "judge": {
                "api": "genrm_model",
                "base_url": "http://judge.test:8000/v1",
                "api_key_env": JUDGE_ENV,
            },
            "num_rollouts_per_prompt": 2,
            "genrm_parse_retries": 0,
            "genrm_parse_retry_sleep_s": 0.0,
            "state_path": str(tmp_path / "state.db"),
        }
    )


def state_files(folder: Path) -> list[tuple[str, str]]:
    return [(path.name, path.read_bytes().decode("latin-1")) for path in folder.iterdir()]


def assert_hidden(where: str, text: str) -> None:
    for shown in SHOWN:
        assert shown.lower() not in text.lower(), f"{where} shows {shown!r}"


async def test_an_echoed_token_reaches_no_output_in_any_form(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv(JUDGE_ENV, TOKEN)
    caplog.set_level(logging.DEBUG)
    cfg = config(tmp_path)
    script = Script(judge_answer)
    outputs: list[tuple[str, str]] = []
    with trio.fail_after(LIMIT_S):
        async with durable_engine(cfg, make_http_judge(cfg, backend=script.network)) as engine:
            app = create_app(engine, cfg)
            for form in FORMS:
                bodies = [member(i, f"form-{form}-{i}", group=form) for i in range(2)]
                replies = await post_group(app, bodies)
                assert [status for status, _ in replies] == [200, 200], replies
                for _, row in replies:
                    assert row["mask_sample"] is True, row  # the judge failed every comparison
                    assert "[redacted]" in row["failure_reason"], row
                    outputs.append((f"{form} row", json.dumps(row)))
                status, reply, _ = await call(
                    app,
                    "/compare",
                    body={
                        "conversation_history": [{"role": "user", "content": "Name a prime."}],
                        "response_objs": [b["response"] for b in bodies],
                    },
                )
                assert status == 503, reply
                outputs.append((f"{form} /compare", json.dumps(reply)))
            status, exported, _ = await call(app, "/checkpoint", method="GET")
            assert status == 200
            assert len(exported["cohorts"]) == len(FORMS)
            outputs.append(("GET /checkpoint", json.dumps(exported)))
            outputs.extend(state_files(tmp_path))  # the db and its -wal while the store is open
    assert script.calls == 4 * len(FORMS)  # both orders of the pair, for the group and /compare
    received = [r for r in script.requests if r is not None]
    assert [r.headers["authorization"] for r in received] == [f"Bearer {TOKEN}"] * len(received)
    outputs.extend(state_files(tmp_path))
    outputs.extend(("log", record.getMessage()) for record in caplog.records)
    for where, text in outputs:
        assert_hidden(where, text)
