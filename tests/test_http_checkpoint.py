"""`GET /checkpoint`, `POST /checkpoint` and `genrm-trio checkpoint export|restore`.

The format and the restore rules are docs/durable-state.md, "Checkpoint format, version 1".

Routes run through Quart's test client over the real engine (virtual time where no thread is
involved). Store-backed and CLI tests do real I/O (SQLite threads, an in-process hypercorn on
127.0.0.1, the CLI's synchronous httpx in a thread) and use the real clock.
"""

from __future__ import annotations

import argparse
import copy
import json
import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, closing
from functools import partial
from pathlib import Path
from typing import Any

import http_calls
import pytest
import trio
from judges import ScriptedJudge, http_error, settings
from quart_trio import QuartTrio
from trio.testing import MockClock

from genrm_trio.app.bench import verify_body
from genrm_trio.app.checkpoint_cli import add_checkpoint_arguments, checkpoint_url
from genrm_trio.app.compose import durable_engine
from genrm_trio.app.serve import bind_socket
from genrm_trio.config import Settings
from genrm_trio.domain.checkpoint import RestoreReport, report_body
from genrm_trio.engine.engine import Engine, open_engine
from genrm_trio.http.app import create_app
from genrm_trio.http.openapi import openapi_document

N = 4
TOKEN = "checkpoint-token"
LIMIT_S = 20.0


def config(**overrides: Any) -> Settings:
    return settings(num_rollouts_per_prompt=N, **overrides)


_BODIES: dict[tuple[int, str, int, str | None], Any] = {}


def body(index: int, group: str = "g", attempt: int = 0, answer: str | None = None) -> Any:
    """A `/verify` body; the same arguments give the same body (response ids included)."""
    key = (index, group, attempt, answer)
    if key not in _BODIES:
        _BODIES[key] = verify_body(
            task=0,
            rollout=index,
            group_id=group,
            attempt=attempt,
            prompt="Why is ice slippery?",
            answer=answer if answer is not None else f"a{index}",
        )
    return copy.deepcopy(_BODIES[key])


def judge() -> ScriptedJudge:
    """The pair of answers a0/a1 fails: rollouts 0 and 1 are masked, 2 and 3 scored."""
    return ScriptedJudge(pairs={("a0", "a1"): http_error()})


async def call(app: QuartTrio, path: str, **request: Any) -> tuple[int, Any]:
    """(status, decoded body) of one request (`http_calls.call`'s, without the headers)."""
    status, reply, _ = await http_calls.call(app, path, **request)
    return status, reply


async def group(app: QuartTrio, name: str = "g", attempt: int = 0) -> list[tuple[int, Any]]:
    out: list[tuple[int, Any]] = [(0, None)] * N

    async def one(i: int) -> None:
        out[i] = await call(app, "/verify", body=body(i, name, attempt))

    async with trio.open_nursery() as nursery:
        for i in range(N):
            nursery.start_soon(one, i)
    return out


@asynccontextmanager
async def served(
    cfg: Settings, the_judge: ScriptedJudge
) -> AsyncIterator[tuple[Engine, QuartTrio]]:
    async with open_engine(cfg, the_judge) as engine:
        yield engine, create_app(engine, cfg)


# --- routes ----------------------------------------------------------------------------------


async def test_export_then_restore_replays_identical_rows(autojump_clock: MockClock) -> None:
    async with served(config(), judge()) as (_, app):
        first = await group(app)
        await group(app, "s", 0)
        await group(app, "s", 1)
        status, exported = await call(app, "/checkpoint", method="GET")
    assert status == 200
    assert [s for s, _ in first] == [200] * N
    assert [row["mask_sample"] for _, row in first] == [True, True, False, False]
    assert exported["version"] == 1 and len(exported["cohorts"]) == 3
    assert set(exported["watermarks"]) == {"g", "s"}

    fresh = ScriptedJudge()
    async with served(config(), fresh) as (_, app):
        status, reply = await call(app, "/checkpoint", body=exported)
        assert (status, reply) == (
            200,
            {"added": 3, "unchanged": 0, "watermarks_updated": 2, "superseded": 0, "conflicts": []},
        )
        assert await group(app) == first  # every row, byte for byte after decoding
        regenerated = await call(app, "/verify", body=body(0, answer="regenerated"))
        assert regenerated == (
            200,
            {**first[0][1], "response": body(0, answer="regenerated")["response"]},
        )
        status, refused = await call(app, "/verify", body=body(2, answer="regenerated"))
        assert status == 409 and "different response" in refused["detail"]
        status, stale = await call(app, "/verify", body=body(0, "s", 0))
        assert (status, stale) == (
            409,
            {"detail": "GenRM group 's' attempt 0 was superseded by attempt 1"},
        )
        again = await call(app, "/checkpoint", method="GET")
        assert again == (200, exported)
        status, reply = await call(app, "/checkpoint", body=exported)
        assert reply == {
            "added": 0,
            "unchanged": 3,
            "watermarks_updated": 0,
            "superseded": 0,
            "conflicts": [],
        }
    assert fresh.calls == []


async def test_conflicts_are_reported_not_applied(autojump_clock: MockClock) -> None:
    async with served(config(), judge()) as (_, app):
        await group(app)
        _, exported = await call(app, "/checkpoint", method="GET")
    changed = copy.deepcopy(exported)
    changed["cohorts"][0]["members"]["3"]["result"]["reward"] = 9.5
    changed["watermarks"]["g"]["prompt_digest"] = "f" * 64
    async with served(config(), ScriptedJudge()) as (_, app):
        rows = await group(app)  # B judges group g itself: a different record, same prompt
        status, reply = await call(app, "/checkpoint", body=changed)
        assert (status, reply) == (
            200,
            {
                "added": 0,
                "unchanged": 0,
                "watermarks_updated": 0,
                "superseded": 0,
                "conflicts": [
                    {"key": "group_id::g::group_attempt::0", "reason": "different record"},
                    {"group_id": "g", "reason": "different prompt digest"},
                ],
            },
        )
        assert await group(app) == rows


@pytest.mark.parametrize(
    ("raw", "detail"),
    [
        (b"{not json", "JSON decode error"),
        (b'{"version": 2, "cohorts": [], "watermarks": {}}', "checkpoint version: unsupported"),
        (b'{"version": 1, "cohorts": {}, "watermarks": {}}', "checkpoint cohorts: expected"),
        (b"[]", "checkpoint body: expected an object"),
    ],
)
async def test_invalid_bodies_are_422_and_change_nothing(
    autojump_clock: MockClock, raw: bytes, detail: str
) -> None:
    async with served(config(), judge()) as (_, app):
        await group(app)
        before = await call(app, "/checkpoint", method="GET")
        status, reply = await call(app, "/checkpoint", raw=raw)
        assert status == 422
        assert detail in json.dumps(reply["detail"])
        assert await call(app, "/checkpoint", method="GET") == before


async def test_a_contradictory_record_rejects_the_whole_body(autojump_clock: MockClock) -> None:
    async with served(config(), judge()) as (_, app):
        await group(app)
        await group(app, "h")
        _, exported = await call(app, "/checkpoint", method="GET")
    exported["cohorts"][1]["members"]["0"]["result"] = {"reward": 1.0}  # masked AND a result
    async with served(config(), ScriptedJudge()) as (_, app):
        status, reply = await call(app, "/checkpoint", body=exported)
        assert status == 422
        assert reply["detail"].startswith("checkpoint cohort 'group_id::h::group_attempt::0'")
        assert "both a result and masked_alone" in reply["detail"]
        assert await call(app, "/checkpoint", method="GET") == (
            200,
            {"version": 1, "cohorts": [], "watermarks": {}},
        )


async def test_checkpoint_routes_require_the_bearer_token(
    autojump_clock: MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CHECKPOINT_TOKEN", TOKEN)
    cfg = config(server={"api_key_env": "CHECKPOINT_TOKEN"})
    empty = {"version": 1, "cohorts": [], "watermarks": {}}
    async with served(cfg, judge()) as (_, app):
        for method, data in (("GET", None), ("POST", empty)):
            status, reply = await call(app, "/checkpoint", method=method, body=data)
            assert (status, reply) == (401, {"detail": "missing or invalid bearer token"})
            auth = {"Authorization": f"Bearer {TOKEN}"}
            status, _ = await call(app, "/checkpoint", method=method, body=data, headers=auth)
            assert status == 200


async def test_restore_after_shutdown_is_503(autojump_clock: MockClock) -> None:
    async with served(config(), judge()) as (engine, app):
        await engine.aclose()
        status, reply = await call(
            app, "/checkpoint", body={"version": 1, "cohorts": [], "watermarks": {}}
        )
        assert (status, reply) == (
            503,
            {"detail": "GenRM server is shutting down", "reason": "shutting_down"},
        )


# --- with durable state (real clock: SQLite runs in worker threads) ----------------------------


async def test_restore_is_durable_and_a_rejected_body_leaves_the_store_untouched(
    tmp_path: Path,
) -> None:
    async with served(config(), judge()) as (_, app):
        first = await group(app)
        _, exported = await call(app, "/checkpoint", method="GET")
    cfg = config(state_path=str(tmp_path / "state.db"))
    with trio.fail_after(LIMIT_S):
        async with durable_engine(cfg, ScriptedJudge()) as engine:
            app = create_app(engine, cfg)
            broken = copy.deepcopy(exported)
            broken["cohorts"][0]["members"]["0"]["response_digest"] = "XYZ"
            status, _ = await call(app, "/checkpoint", body=broken)
            assert status == 422
            with closing(sqlite3.connect(cfg.state_path or "")) as db:
                assert db.execute("SELECT count(*) FROM cohorts").fetchone() == (0,)
                assert db.execute("SELECT count(*) FROM watermarks").fetchone() == (0,)
            status, reply = await call(app, "/checkpoint", body=exported)
            assert reply["added"] == 1 and reply["watermarks_updated"] == 1
        fresh = ScriptedJudge()
        async with durable_engine(cfg, fresh) as engine:
            app = create_app(engine, cfg)
            assert await call(app, "/checkpoint", method="GET") == (200, exported)
            assert await group(app) == first
    assert fresh.calls == []


# --- the CLI (a real server on 127.0.0.1) --------------------------------------------------


@asynccontextmanager
async def http_server(cfg: Settings, the_judge: ScriptedJudge) -> AsyncIterator[str]:
    async with http_calls.live_port(cfg, the_judge) as port:
        yield f"http://127.0.0.1:{port}"


def cli(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="genrm-trio")
    add_checkpoint_arguments(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    code: int = args.handler(args)
    return code


async def run_cli(*argv: str) -> int:
    return await trio.to_thread.run_sync(partial(cli, *argv))


async def test_cli_export_and_restore(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    exported = tmp_path / "checkpoint.json"
    with trio.fail_after(LIMIT_S):
        async with http_server(config(), judge()) as url:
            client = await trio.to_thread.run_sync(_verify_group, url)
            assert await run_cli("checkpoint", "export", "--url", url, str(exported)) == 0
            assert await run_cli("checkpoint", "export", "--url", url + "/") == 0
        data = json.loads(exported.read_text())
        assert data["version"] == 1 and len(data["cohorts"]) == 1
        assert json.loads(capsys.readouterr().out) == data  # the same export on stdout
        async with http_server(config(), ScriptedJudge()) as url:
            assert await run_cli("checkpoint", "restore", "--url", url, str(exported)) == 0
            assert json.loads(capsys.readouterr().out) == {
                "added": 1,
                "unchanged": 0,
                "watermarks_updated": 1,
                "superseded": 0,
                "conflicts": [],
            }
            assert await trio.to_thread.run_sync(_verify_group, url) == client
            # A conflicting record: exit 1, the reply still printed.
            data["cohorts"][0]["members"]["2"]["result"]["reward"] = 0.5
            changed = tmp_path / "changed.json"
            changed.write_text(json.dumps(data))
            assert await run_cli("checkpoint", "restore", "--url", url, str(changed)) == 1
            captured = capsys.readouterr()
            assert json.loads(captured.out)["conflicts"] == [
                {"key": "group_id::g::group_attempt::0", "reason": "different record"}
            ]
            assert "1 record(s) conflicted" in captured.err
            # A rejected checkpoint: exit 2 with the 422 detail.
            data["version"] = 7
            changed.write_text(json.dumps(data))
            assert await run_cli("checkpoint", "restore", "--url", url, str(changed)) == 2
            assert "HTTP 422: checkpoint version: unsupported version 7" in capsys.readouterr().err


async def test_cli_transport_and_file_errors_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sock = bind_socket("127.0.0.1", 0)
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there now
    url = f"http://127.0.0.1:{port}"
    assert await run_cli("checkpoint", "export", "--url", url, "--timeout", "5") == 2
    assert "cannot reach" in capsys.readouterr().err
    missing = tmp_path / "missing.json"
    assert await run_cli("checkpoint", "restore", "--url", url, str(missing)) == 2
    assert "cannot read" in capsys.readouterr().err
    with trio.fail_after(LIMIT_S):
        async with http_server(config(), judge()) as live:
            target = tmp_path / "no-such-dir" / "out.json"
            assert await run_cli("checkpoint", "export", "--url", live, str(target)) == 2
            assert "cannot write" in capsys.readouterr().err


async def test_cli_sends_the_bearer_token(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CHECKPOINT_TOKEN", TOKEN)
    cfg = config(server={"api_key_env": "CHECKPOINT_TOKEN"})
    with trio.fail_after(LIMIT_S):
        async with http_server(cfg, judge()) as url:
            assert await run_cli("checkpoint", "export", "--url", url) == 2
            assert "HTTP 401: missing or invalid bearer token" in capsys.readouterr().err
            argv = ("checkpoint", "export", "--url", url, "--api-key-env", "CHECKPOINT_TOKEN")
            assert await run_cli(*argv) == 0
            assert json.loads(capsys.readouterr().out)["version"] == 1
            monkeypatch.delenv("CHECKPOINT_TOKEN")
            assert await run_cli(*argv) == 2
            assert "CHECKPOINT_TOKEN is unset or empty" in capsys.readouterr().err


def test_checkpoint_url() -> None:
    assert checkpoint_url("http://h:1") == "http://h:1/checkpoint"
    assert checkpoint_url("http://h:1/") == "http://h:1/checkpoint"
    assert checkpoint_url("http://h:1/ng-rollout/x") == "http://h:1/ng-rollout/x/checkpoint"
    assert checkpoint_url("http://h:1/checkpoint") == "http://h:1/checkpoint"


def _verify_group(url: str) -> list[tuple[int, Any]]:
    """One group over real HTTP from a thread (concurrent: the cohort needs all N)."""
    import concurrent.futures

    import httpx

    with httpx.Client(timeout=10.0, trust_env=False) as client:

        def one(i: int) -> tuple[int, Any]:
            response = client.post(url + "/verify", json=body(i))
            return response.status_code, response.json()

        with concurrent.futures.ThreadPoolExecutor(N) as pool:
            return list(pool.map(one, range(N)))


def test_the_restore_reply_has_exactly_the_schemas_keys() -> None:
    """`POST /checkpoint`'s reply (`report_body`) and the `RestoreReply` schema agree."""
    doc = openapi_document(title="t", version="1", auth=False)
    schema = doc["components"]["schemas"]["RestoreReply"]
    reply = doc["paths"]["/checkpoint"]["post"]["responses"]["200"]["content"]
    assert reply["application/json"]["schema"] == {"$ref": "#/components/schemas/RestoreReply"}
    body = report_body(RestoreReport(1, 2, 3, [{"key": "k", "reason": "different record"}], 4))
    assert set(body) == set(schema["properties"]) == set(schema["required"])
    assert body["superseded"] == 4
