"""Requests to the app through Quart's test client, `/verify` bodies of a group, and the app
served on a real socket: shared by tests/test_http_app.py, tests/test_http_checkpoint.py,
tests/test_http_bounds.py and tests/test_judge_faults.py."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import trio
from quart_trio import QuartTrio

from genrm_trio.app.serve import bind_socket, serve_app
from genrm_trio.config import Settings
from genrm_trio.engine.engine import open_engine
from genrm_trio.http.app import create_app
from genrm_trio.judge.base import Judge


async def call(
    app: QuartTrio,
    path: str,
    *,
    method: str = "POST",
    body: Any = None,
    raw: bytes | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, Any, dict[str, str]]:
    """(status, body, lower-cased headers) of one request through Quart's test client; the body
    decoded from JSON when the reply says it is JSON, else text."""
    client: Any = app.test_client()
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    response = await client.open(path, method=method, data=data, headers=headers)
    payload = await response.get_data(as_text=False)
    hdrs = {k.lower(): v for k, v in response.headers.items()}
    if hdrs.get("content-type", "").startswith("application/json"):
        return response.status_code, json.loads(payload), hdrs
    return response.status_code, payload.decode(), hdrs


def member(index: int, answer: str, *, group: str = "e2e", **extra: Any) -> dict[str, Any]:
    """A `/verify` body of member `index` of `group` whose response answers `answer`."""
    return {
        "responses_create_params": {
            "input": [{"role": "user", "content": "Name a prime.", "type": "message"}],
            "tools": [],
            "tool_choice": "auto",
            "parallel_tool_calls": True,
        },
        "response": {
            "id": f"resp_{group}_{index}_{answer}",
            "output": [
                {
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": answer}],
                }
            ],
        },
        "_ng_group_id": group,
        "_ng_group_attempt": 0,
        "_ng_rollout_index": index,
        "_ng_task_index": 0,
        **extra,
    }


async def post_group(app: QuartTrio, bodies: list[dict[str, Any]]) -> list[tuple[int, Any]]:
    """Every body posted to `/verify` at once (each under its own rollout path): (status, body)
    per body, in order."""
    replies: list[tuple[int, Any]] = [(0, None)] * len(bodies)

    async def one(i: int) -> None:
        status, reply, _ = await call(app, f"/ng-rollout/r{i}/verify", body=bodies[i])
        replies[i] = (status, reply)

    async with trio.open_nursery() as nursery:
        for i in range(len(bodies)):
            nursery.start_soon(one, i)
    return replies


@asynccontextmanager
async def live_port(cfg: Settings, the_judge: Judge) -> AsyncIterator[int]:
    """The port on 127.0.0.1 where hypercorn serves the app over an engine of `cfg` and
    `the_judge` (real sockets), until the block ends."""
    async with open_engine(cfg, the_judge) as engine, trio.open_nursery() as nursery:
        stop = trio.Event()
        port: int = await nursery.start(
            partial(
                serve_app,
                create_app(engine, cfg),
                bind_socket("127.0.0.1", 0),
                shutdown_trigger=stop.wait,
                grace_s=1.0,
            )
        )
        yield port
        stop.set()
