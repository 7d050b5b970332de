"""Limits: admission control over HTTP and the start-up file-descriptor check.

`server.max_active_cohorts` refuses only requests that would create a new cohort, with 503
`GenRM server is at capacity ({n} active cohorts); retry later` and `Retry-After: 1`; members of
existing cohorts, replays and `/compare` are never refused by it. Served in-process by `serve()` on
127.0.0.1 with the simulated judge (real sockets, real clock, every wait bounded).
"""

from __future__ import annotations

import logging
import resource
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import httpx
import pytest
import trio
from procs import Reply, answers, assert_scored, bodies, client, post, run_group

from genrm_trio.app import fd_headroom as fd_module
from genrm_trio.app import serve as serve_module
from genrm_trio.app.fd_headroom import FD_RESERVE, check_fd_headroom, fds_needed
from genrm_trio.app.serve import serve
from genrm_trio.config import settings_from_mapping

CAPACITY = 2


def _at_capacity(n: int) -> str:
    return f"GenRM server is at capacity ({n} active cohorts); retry later"


@asynccontextmanager
async def _served(config: dict[str, Any]) -> AsyncIterator[str]:
    settings = settings_from_mapping({"port": 0, **config})
    async with trio.open_nursery() as nursery:
        port = await nursery.start(partial(serve, settings, sim=True))
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            nursery.cancel_scope.cancel()


async def _active(http: httpx.AsyncClient, base: str) -> list[dict[str, Any]]:
    views: list[dict[str, Any]] = (await http.get(f"{base}/cohorts")).json()
    return views


async def _wait_active(http: httpx.AsyncClient, base: str, count: int) -> None:
    with trio.fail_after(5):
        while len(await _active(http, base)) != count:  # noqa: ASYNC110 (polls the server)
            await trio.sleep(0.01)


def _refused(reply: Reply, n: int = CAPACITY) -> None:
    assert reply.status == 503
    assert reply.body == {"detail": _at_capacity(n), "reason": "at_capacity"}
    assert reply.headers["retry-after"] == "1"


async def test_only_new_cohorts_are_refused_at_capacity(
    capsys: pytest.CaptureFixture[str],
) -> None:
    config = {
        "num_rollouts_per_prompt": 2,
        "cohort_collection_timeout_s": 30.0,
        "server": {"max_active_cohorts": CAPACITY},
    }
    with trio.fail_after(30):
        async with _served(config) as base, client() as http:
            # A completed group (kept as a terminal record) to replay later.
            done, _ = await run_group(http, base, bodies("done", answers("[d]", 2)))
            for reply in done:
                assert_scored(reply)
            done_bodies = bodies("done", answers("[d]", 2))
            done_bodies[0]["response"] = done[0].body["response"]  # the identical member

            group_a = bodies("a", answers("[a]", 2))
            group_b = bodies("b", answers("[b]", 2))
            group_c = bodies("c", answers("[c]", 2))
            waiting: dict[str, Reply] = {}
            answered = {name: trio.Event() for name in ("a0", "b0", "b1_0")}

            async def wait_for(name: str, body: dict[str, Any]) -> None:
                waiting[name] = await post(http, f"{base}/verify", body)
                answered[name].set()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(wait_for, "a0", group_a[0])
                nursery.start_soon(wait_for, "b0", group_b[0])
                await _wait_active(http, base, CAPACITY)

                # A new cohort is refused, whether an explicit group or a legacy one; the refusal
                # touches nothing (no watermark, no cohort).
                _refused(await post(http, f"{base}/verify", group_c[0]))
                legacy = dict(group_c[0])
                del legacy["_ng_group_id"]
                _refused(await post(http, f"{base}/verify", legacy))
                assert {v["group_id"] for v in await _active(http, base)} == {"a", "b"}

                # Not refused: a replay of a completed member, /compare, a re-attachment.
                replay = await post(http, f"{base}/verify", done_bodies[0])
                assert replay.status == 200 and replay.body == done[0].body
                compare = await post(
                    http,
                    f"{base}/compare",
                    {
                        "conversation_history": [{"role": "user", "content": "2+2?"}],
                        "response_objs": [g["response"] for g in group_c],
                    },
                )
                assert compare.status == 200 and len(compare.body["rewards"]) == 2

                # A newer attempt of an active group replaces it, so it is admitted; the old
                # attempt's waiter gets the supersession 503.
                group_b1 = bodies("b", answers("[b]", 2), attempt=1)
                nursery.start_soon(wait_for, "b1_0", group_b1[0])
                with trio.fail_after(5):
                    await answered["b0"].wait()
                assert waiting["b0"].status == 503
                assert "attempt 0 was superseded by attempt 1" in waiting["b0"].body["detail"]
                _refused(await post(http, f"{base}/verify", group_c[0]))

                # A member of an existing cohort is admitted: it completes group a.
                last_a = await post(http, f"{base}/verify", group_a[1])
                assert_scored(last_a)
                with trio.fail_after(5):
                    await answered["a0"].wait()
                assert_scored(waiting["a0"])

                # Room again: group c is admitted now.
                c_replies, _ = await run_group(http, base, group_c)
                for reply in c_replies:
                    assert_scored(reply)
                assert_scored(await post(http, f"{base}/verify", group_b1[1]))
            assert_scored(waiting["b1_0"])
            assert await _active(http, base) == []
    assert "listening on" in capsys.readouterr().out


# --- file-descriptor headroom ------------------------------------------------------------------


@pytest.fixture
def restore_nofile() -> Iterator[tuple[int, int]]:
    saved = resource.getrlimit(resource.RLIMIT_NOFILE)
    yield saved
    resource.setrlimit(resource.RLIMIT_NOFILE, saved)


def test_fds_needed() -> None:
    grouped = settings_from_mapping(
        {"num_rollouts_per_prompt": 16, "server": {"max_active_cohorts": 100}}
    )
    assert fds_needed(grouped) == 100 * 16 + 256 + FD_RESERVE
    singleton = settings_from_mapping(
        {"num_rollouts_per_prompt": 1, "judge": {"max_concurrency": 8}}
    )
    assert fds_needed(singleton) == 8 + FD_RESERVE


def test_soft_limit_is_raised_to_the_hard_limit(
    restore_nofile: tuple[int, int], caplog: pytest.LogCaptureFixture
) -> None:
    _, hard = restore_nofile
    if hard == resource.RLIM_INFINITY:
        with open("/proc/sys/fs/nr_open") as file:
            target = int(file.read())
    else:
        target = hard
    low = min(256, target // 2)
    resource.setrlimit(resource.RLIMIT_NOFILE, (low, hard))
    settings = settings_from_mapping({"judge": {"max_concurrency": 16}})
    with caplog.at_level(logging.INFO, logger="genrm_trio"):
        found = check_fd_headroom(settings)
    assert resource.getrlimit(resource.RLIMIT_NOFILE) == (target, hard)
    assert (found.soft, found.raised_from) == (target, low)
    assert found.open_now > 0
    assert f"raised the open-file limit (RLIMIT_NOFILE) from {low} to {target}" in [
        r.getMessage() for r in caplog.records
    ]


def test_too_little_headroom_warns_once_with_the_numbers(
    restore_nofile: tuple[int, int], caplog: pytest.LogCaptureFixture
) -> None:
    _, hard = restore_nofile
    if hard == resource.RLIM_INFINITY:  # give the check a finite limit to report
        hard = 4096
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    settings = settings_from_mapping(
        {"num_rollouts_per_prompt": 16, "server": {"max_active_cohorts": hard}}
    )
    with caplog.at_level(logging.WARNING, logger="genrm_trio"):
        found = check_fd_headroom(settings)
    assert not found.enough
    needed = hard * 16 + 256 + FD_RESERVE
    [warning] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warning.startswith(f"open-file limit {hard} (hard limit {hard}, ")
    assert (
        f"leaves less than the {needed} descriptors a full server may need ({hard * 16} waiting "
        f"/verify requests: server.max_active_cohorts={hard} x num_rollouts_per_prompt=16; 256 "
        f"judge connections: judge.max_concurrency; {FD_RESERVE} reserve): raise the limit "
        f"(ulimit -n {needed}) or lower server.max_active_cohorts"
    ) in warning


def test_a_refused_raise_keeps_the_soft_limit_and_warns(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    calls: list[tuple[int, int]] = []

    def refuse(which: int, limits: tuple[int, int]) -> None:
        calls.append(limits)
        raise ValueError("not allowed")

    monkeypatch.setattr(resource, "getrlimit", lambda which: (256, resource.RLIM_INFINITY))
    monkeypatch.setattr(resource, "setrlimit", refuse)
    settings = settings_from_mapping({"judge": {"max_concurrency": 512}})
    with caplog.at_level(logging.WARNING, logger="genrm_trio"):
        found = check_fd_headroom(settings)
    assert len(calls) == 1 and calls[0][1] == resource.RLIM_INFINITY  # tried nr_open, kept hard
    assert (found.soft, found.hard, found.raised_from) == (256, None, None)
    [warning] = [r.getMessage() for r in caplog.records]
    assert warning.startswith("open-file limit 256 (hard limit unlimited, ")


async def test_serve_checks_the_headroom_once_at_start(
    caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    # 10**8 groups of 16 need more descriptors than any kernel allows (nr_open < 2**30).
    config = {"num_rollouts_per_prompt": 16, "server": {"max_active_cohorts": 10**8}}
    with trio.fail_after(20), caplog.at_level(logging.INFO, logger="genrm_trio"):
        async with _served(config) as base, client() as http:
            assert (await http.get(f"{base}/health")).status_code == 200
            assert (await http.get(f"{base}/health")).status_code == 200
    warnings = [r.getMessage() for r in caplog.records if "open-file limit" in r.getMessage()]
    assert len(warnings) == 1
    assert capsys.readouterr().out.startswith("listening on")
    assert serve_module.check_fd_headroom is check_fd_headroom


# --- the default admission limit fitted to the open-file limit ------------------------------------


def _fixed_limit(monkeypatch: pytest.MonkeyPatch, soft: int, open_now: int) -> None:
    """A soft = hard open-file limit (nothing to raise) and a known count of open descriptors."""
    monkeypatch.setattr(resource, "getrlimit", lambda which: (soft, soft))
    monkeypatch.setattr(fd_module, "_open_fds", lambda: open_now)


def test_the_default_admission_limit_is_fitted_to_the_descriptors(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # 20,000 descriptors, 30 open, 256 judge connections, 64 reserve: 1,228 groups of 16
    _fixed_limit(monkeypatch, 20_000, 30)
    settings = settings_from_mapping({"num_rollouts_per_prompt": 16})
    with caplog.at_level(logging.INFO, logger="genrm_trio"):
        found = check_fd_headroom(settings)
    assert found.max_active_cohorts == (20_000 - 30 - 256 - FD_RESERVE) // 16 == 1228
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert [r.getMessage() for r in caplog.records] == [
        "server.max_active_cohorts: 1228, what the open-file limit 20000 allows (30 open now, "
        "256 judge connections, 64 reserve, 16 descriptors per group of num_rollouts_per_prompt);"
        " the default 4096 would need 65856: raise the limit (ulimit -n 65856) to admit more, or "
        "set the key"
    ]
    fitted = fd_module.with_admission(settings, found)
    assert fitted.server.max_active_cohorts == 1228
    assert fitted.model_copy(update={"server": settings.server}) == settings  # nothing else


@pytest.mark.parametrize(
    ("config", "soft"),
    [
        # set explicitly: the operator's value stands, and the warning names the numbers
        ({"num_rollouts_per_prompt": 16, "server": {"max_active_cohorts": 4096}}, 20_000),
        # not even one group of 16 fits beside the judge connections
        ({"num_rollouts_per_prompt": 16}, 30 + 256 + FD_RESERVE + 15),
    ],
)
def test_what_cannot_be_fitted_still_warns(
    config: dict[str, Any],
    soft: int,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    _fixed_limit(monkeypatch, soft, 30)
    settings = settings_from_mapping(config)
    with caplog.at_level(logging.INFO, logger="genrm_trio"):
        found = check_fd_headroom(settings)
    assert found.max_active_cohorts is None
    assert fd_module.with_admission(settings, found) is settings
    [warning] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warning.startswith(f"open-file limit {soft} (hard limit {soft}, 30 open now)")


async def test_serve_admits_what_the_descriptors_hold(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # room for exactly two groups of 4 beside 16 judge connections: a third group is refused
    _fixed_limit(monkeypatch, 20 + 16 + FD_RESERVE + 2 * 4, 20)
    config = {"num_rollouts_per_prompt": 4, "judge": {"max_concurrency": 16}}
    with trio.fail_after(20), caplog.at_level(logging.INFO, logger="genrm_trio"):
        async with _served(config) as base, client() as http, trio.open_nursery() as nursery:
            for name in ("a", "b"):
                nursery.start_soon(post, http, f"{base}/verify", bodies(name, answers(name))[0])
            await _wait_active(http, base, 2)
            _refused(await post(http, f"{base}/verify", bodies("c", answers("c"))[0]))
            nursery.cancel_scope.cancel()
    assert not [r for r in caplog.records if r.getMessage().startswith("open-file limit")]
    assert any(r.getMessage().startswith("server.max_active_cohorts: 2,") for r in caplog.records)
