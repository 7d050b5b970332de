"""Real `genrm-trio` processes for the fault, limit and security tests, and their HTTP side.

Only 127.0.0.1, the real clock, and every wait bounded. The processes themselves are
`genrm_trio.testing.procs` (the harness the benchmarks use too): a `Proc` keeps its stderr in a
file so a test can scrape everything the process logged. Starting is synchronous (call it
through `trio.to_thread.run_sync` from an async test); the HTTP side is async
(`httpx.AsyncClient`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import trio
import yaml

from genrm_trio.app.bench import verify_body
from genrm_trio.app.top_frame import Series, parse_metrics
from genrm_trio.testing.procs import START_TIMEOUT_S, Proc, command, start

__all__ = ["Proc", "command", "start"]  # the harness, re-exported for the tests

SHUTTING_DOWN = "GenRM server is shutting down"
PROMPT = "Why is ice slippery?"


def start_judge(
    directory: Path,
    *flags: str,
    name: str = "judge",
    env: Mapping[str, str] | None = None,
    timeout: float = START_TIMEOUT_S,
) -> Proc:
    """`genrm-trio sim-judge --port 0 FLAGS` (flags may set `--port` again: the last wins)."""
    args = ["sim-judge", "--port", "0", *flags]
    return start(args, directory / f"{name}.err", env=env, timeout=timeout)


def start_server(
    directory: Path,
    config: Mapping[str, Any],
    *,
    judge_url: str | None = None,
    name: str = "serve",
    extra: Iterable[str] = (),
    env: Mapping[str, str] | None = None,
    timeout: float = START_TIMEOUT_S,
) -> Proc:
    """`genrm-trio serve --config F --port 0` against `judge_url` (or `--judge sim`)."""
    path = directory / f"{name}.yaml"
    path.write_text(yaml.safe_dump(dict(config), sort_keys=False))
    judge = ["--judge-url", judge_url] if judge_url is not None else ["--judge", "sim"]
    if judge_url is not None and "api" not in (config.get("judge") or {}):
        judge += ["--judge-api", "genrm_model"]  # the simulated judge serves every API
    args = ["serve", "--config", str(path), "--port", "0", *judge, *extra]
    return start(args, directory / f"{name}.err", env=env, timeout=timeout)


# --- HTTP helpers ---------------------------------------------------------------------------------


def client(timeout: float = 30.0, headers: Mapping[str, str] | None = None) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        trust_env=False,
        timeout=timeout,
        headers=dict(headers or {}),
        limits=httpx.Limits(max_connections=256, max_keepalive_connections=64),
    )


def bodies(group_id: str, answers: Sequence[str], *, attempt: int = 0) -> list[dict[str, Any]]:
    """One `/verify` body per answer (rollout index = position), shaped like Gym's agent."""
    return [
        verify_body(
            task=0, rollout=i, group_id=group_id, attempt=attempt, prompt=PROMPT, answer=answer
        )
        for i, answer in enumerate(answers)
    ]


def answers(tag: str, n: int = 4, tagged: Iterable[int] | None = None) -> list[str]:
    """N distinct answers; those at `tagged` (all by default) carry `tag` for the judge's rules."""
    marked = set(range(n)) if tagged is None else set(tagged)
    return [
        f"answer {i}: a thin liquid-like layer makes ice slippery {tag if i in marked else ''}"
        for i in range(n)
    ]


@dataclass(frozen=True)
class Reply:
    status: int
    body: Any
    headers: httpx.Headers
    elapsed: float


async def post(
    http: httpx.AsyncClient, url: str, body: Any, *, headers: Mapping[str, str] | None = None
) -> Reply:
    started = trio.current_time()
    response = await http.post(url, json=body, headers=dict(headers or {}))
    elapsed = trio.current_time() - started
    assert response.headers["content-type"].startswith("application/json"), response.text
    return Reply(response.status_code, response.json(), response.headers, elapsed)


async def run_group(
    http: httpx.AsyncClient, base: str, group: Sequence[Mapping[str, Any]]
) -> tuple[list[Reply], float]:
    """Send every member at once; replies by rollout index, and the group's wall time."""
    replies: dict[int, Reply] = {}
    started = trio.current_time()

    async def one(i: int, body: Mapping[str, Any]) -> None:
        replies[i] = await post(http, f"{base}/verify", body)

    async with trio.open_nursery() as nursery:
        for i, body in enumerate(group):
            nursery.start_soon(one, i, body)
    return [replies[i] for i in range(len(group))], trio.current_time() - started


def assert_scored(reply: Reply) -> None:
    assert reply.status == 200, reply.body
    row = reply.body
    assert row["mask_sample"] is False, row
    assert row["failure_kind"] is None and row["failure_reason"] is None
    assert isinstance(row["reward"], float) and math.isfinite(row["reward"])
    assert "_ng_failure_class" not in row


def assert_masked(reply: Reply, *fragments: str) -> str:
    """A judge failsafe row (docs/http-api.md); returns its failure_reason."""
    assert reply.status == 200, reply.body
    row = reply.body
    assert row["mask_sample"] is True, row
    assert row["reward"] == 0.0
    assert row["failure_kind"] == "judge_failed"
    assert row["_ng_failure_class"] == "judge_failed"
    assert row["instance_config"]["mask_sample"] is True
    reason = row["failure_reason"]
    assert isinstance(reason, str) and 0 < len(reason) <= 2000
    assert row["_ng_failure_judge_error"] == reason
    for fragment in fragments:
        assert fragment in reason, (fragment, reason)
    return str(reason)


async def metrics(http: httpx.AsyncClient, base: str) -> Series:
    """The server's `/metrics`, read by the one parser (`genrm-trio top`'s, prometheus_client's)."""
    response = await http.get(f"{base}/metrics")
    assert response.status_code == 200
    return parse_metrics(response.text)


async def assert_quiet(http: httpx.AsyncClient, base: str, *, within: float = 5.0) -> None:
    """Nothing active: no cohorts, no judge call in flight or queued (polled up to `within`)."""
    with trio.move_on_after(within):
        while True:
            cohorts = (await http.get(f"{base}/cohorts")).json()
            samples = await metrics(http, base)
            if (
                cohorts == []
                and samples.total("genrm_trio_judge_inflight") == 0
                and samples.total("genrm_trio_judge_queued") == 0
                and samples.total("genrm_trio_active_cohorts") == 0  # every state
            ):
                return
            await trio.sleep(0.05)
    raise AssertionError(f"still active after {within}s: {cohorts} {samples}")


async def judge_stats(http: httpx.AsyncClient, judge: Proc) -> dict[str, Any]:
    response = await http.get(f"{judge.url}/stats")
    assert response.status_code == 200
    stats: dict[str, Any] = response.json()
    return stats


async def judge_idle(http: httpx.AsyncClient, judge: Proc, *, within: float = 5.0) -> None:
    """The simulated judge has no call in flight (the service closed every abandoned call)."""
    with trio.move_on_after(within):
        while (await judge_stats(http, judge))["in_flight"]:  # noqa: ASYNC110 (another process)
            await trio.sleep(0.05)
        return
    raise AssertionError(f"judge still busy after {within}s: {await judge_stats(http, judge)}")


async def wait_cohort_state(
    http: httpx.AsyncClient,
    base: str,
    group_id: str,
    state: str,
    *,
    within: float = 10.0,
    **fields: Any,
) -> dict[str, Any]:
    """Poll /cohorts until the group's cohort is in `state` (and its view has the given
    `fields`, e.g. `requests_waiting=0`); returns its view. Fails after `within` seconds with
    the group's last view."""
    last: list[dict[str, Any]] = []
    with trio.move_on_after(within):
        while True:
            last = [
                v for v in (await http.get(f"{base}/cohorts")).json() if v["group_id"] == group_id
            ]
            for view in last:
                if view["state"] == state and all(view.get(k) == v for k, v in fields.items()):
                    found: dict[str, Any] = view
                    return found
            await trio.sleep(0.02)
    raise AssertionError(f"cohort {group_id!r} not {state} {fields} within {within}s: {last}")


async def clean_group_scores(http: httpx.AsyncClient, base: str, group_id: str, n: int) -> None:
    """The server still serves: a fresh clean group scores completely."""
    replies, _ = await run_group(http, base, bodies(group_id, answers("[clean]", n)))
    for reply in replies:
        assert_scored(reply)


def dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True)
