"""Bounded waits: a stalled durable store holds no request and no shutdown (docs/operations.md,
"Graceful shutdown"; docs/configuration.md, `state_commit_timeout_s`).

In virtual time, a store whose hooks never return: every wait for it ends at exactly
`state_commit_timeout_s`. With real threads, a SQLite store whose WAL fsync never returns. And
with real processes (tests/stalled_serve.py: `genrm-trio serve` whose fsync stalls on demand),
the shutdown promise as operations.md states it: the process exits within
`server.shutdown_grace_s + state_commit_timeout_s` (plus the judge client's close, one second)
of the first signal, and a second signal ends it at once.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import suppress
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
import trio.testing
import yaml
from judges import ScriptedJudge, gather, member, running, settings, verify
from procs import Proc, answers, bodies, client, post, start
from trio.testing import MockClock

from genrm_trio.app.compose import durable_engine
from genrm_trio.app.serve import REPEAT_SIGNAL_WINDOW_S
from genrm_trio.domain.model import GroupFailed, Scored
from genrm_trio.domain.records import OpenRecord, TerminalRecord, WatermarkRecord
from genrm_trio.store.errors import CommitTimeout
from genrm_trio.store.sqlite import SqliteStore

TIMEOUT_S = 5.0  # state_commit_timeout_s of the in-process tests
MARGIN_S = 2.0  # scheduling slack for real processes on a busy 2-core machine
JUDGE_CLOSE_S = 1.0  # genrm_trio.app.serve.JUDGE_CLOSE_S


class HangingHooks:
    """A plain store whose chosen hooks never return (a disk that stalls)."""

    def __init__(self, *hanging: str) -> None:
        self.hanging = set(hanging)
        self.done: list[str] = []

    async def _hook(self, kind: str) -> None:
        if kind in self.hanging:
            await trio.sleep_forever()
        self.done.append(kind)

    async def commit_watermark(self, record: WatermarkRecord) -> None:
        await self._hook("watermark")

    async def commit_open(self, record: OpenRecord) -> None:
        await self._hook("open")

    async def commit_terminal(self, record: TerminalRecord) -> None:
        await self._hook("terminal")

    async def commit_many(self, records: Any, watermarks: Any = ()) -> None:
        await self._hook("many")


# --- virtual time: every wait for the store ends at the commit timeout -------------------------


async def test_a_stalled_open_commit_fails_the_cohort_at_the_timeout(
    autojump_clock: MockClock,
) -> None:
    store = HangingHooks("open")
    judge = ScriptedJudge()
    config = settings(state_commit_timeout_s=TIMEOUT_S, cohort_collection_timeout_s=60.0)
    async with running(config, judge, store=store) as engine:
        ended: dict[int, float] = {}
        replies: dict[int, object] = {}

        async def send(i: int) -> None:
            try:
                replies[i] = await verify(engine, member(i))
            except CommitTimeout as exc:
                replies[i] = exc
            ended[i] = trio.current_time()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(send, 0)
            await trio.sleep(0.5)
            nursery.start_soon(send, 1)  # waits for the creator's open commit
    assert ended == {0: TIMEOUT_S, 1: TIMEOUT_S}
    creator = replies[0]
    assert isinstance(creator, CommitTimeout)
    # the store's own bound (the hook is cancelled) ends the wait, at the engine's deadline
    assert str(creator) == (
        f"the store's commit hook not confirmed within {TIMEOUT_S}s (state_commit_timeout_s)"
    )
    other = replies[1]
    assert isinstance(other, GroupFailed) and other.kind == "cohort"
    assert "could not record cohort" in other.message and "CommitTimeout" in other.message
    assert judge.calls == []  # never judged
    assert store.done == ["watermark", "terminal"]  # the failure's terminal record still lands


async def test_a_stalled_terminal_commit_answers_at_the_timeout(
    autojump_clock: MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    store = HangingHooks("terminal")
    judge = ScriptedJudge()
    async with running(settings(state_commit_timeout_s=TIMEOUT_S), judge, store=store) as engine:
        replies = await gather(engine, [member(0), member(1)])
        assert trio.current_time() == TIMEOUT_S  # the judge answers at once
    assert all(isinstance(r, Scored) for r in replies)
    assert len(judge.calls) == 2
    [error] = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert error.getMessage().startswith("GenRM durable store failed to commit key=")
    assert error.exc_info is not None and isinstance(error.exc_info[1], CommitTimeout)


async def test_a_stalled_restore_commit_fails_the_restore_with_nothing_applied(
    autojump_clock: MockClock,
) -> None:
    done = HangingHooks()
    async with running(settings(), ScriptedJudge(), store=done) as engine:
        await gather(engine, [member(0), member(1)])
        records, marks = engine.terminal_records(), engine.watermark_records()
    hanging = HangingHooks("many")
    config = settings(state_commit_timeout_s=TIMEOUT_S)
    async with running(config, ScriptedJudge(), store=hanging) as engine:
        with pytest.raises(CommitTimeout, match=f"not confirmed within {TIMEOUT_S}s"):
            await engine.restore_records(records, marks)
        assert trio.current_time() == TIMEOUT_S
        stats = engine.statistics()
        assert (stats.terminal_records, stats.watermarks) == (0, 0)


async def test_closing_the_engine_waits_at_most_the_timeout_for_a_stalled_store(
    autojump_clock: MockClock,
) -> None:
    store = HangingHooks("terminal")
    judge = ScriptedJudge()
    replies: list[object] = []
    config = settings(state_commit_timeout_s=TIMEOUT_S)
    async with running(config, judge, store=store) as engine:

        async def send(i: int) -> None:
            replies.append(await verify(engine, member(i)))

        async with trio.open_nursery() as nursery:
            for i in range(2):
                nursery.start_soon(send, i)
            await trio.testing.wait_all_tasks_blocked()  # judged; the terminal commit hangs
            assert trio.current_time() == 0.0
            await engine.aclose()
            closed_at = trio.current_time()
    assert closed_at == TIMEOUT_S
    assert len(replies) == 2 and all(isinstance(r, Scored) for r in replies)


# --- real threads: a SQLite store whose fsync never returns ------------------------------------


@pytest.fixture
def stalled_fsync(monkeypatch: pytest.MonkeyPatch) -> Iterator[threading.Event]:
    """Every WAL fsync of a SqliteStore opened from now on blocks its thread until the returned
    event is set (set on the way out, so that no thread outlives the test)."""
    release = threading.Event()
    stalled = threading.Event()
    original = SqliteStore._fsync_wal
    loaded = threading.Event()

    def fsync_wal(self: SqliteStore) -> None:
        if loaded.is_set():  # the load's own fsync (at open) goes through
            stalled.set()
            release.wait()
        else:
            loaded.set()
        original(self)

    monkeypatch.setattr(SqliteStore, "_fsync_wal", fsync_wal)
    try:
        yield stalled
    finally:
        release.set()


async def test_a_sqlite_store_whose_fsync_stalls_holds_neither_answers_nor_the_close(
    tmp_path: Path, stalled_fsync: threading.Event, caplog: pytest.LogCaptureFixture
) -> None:
    timeout_s = 0.5
    config = settings(state_path=str(tmp_path / "state.db"), state_commit_timeout_s=timeout_s)
    with trio.fail_after(20):
        async with durable_engine(config, ScriptedJudge()) as engine:
            replies = await gather(engine, [member(0), member(1)])
            assert stalled_fsync.is_set()
            assert all(isinstance(r, Scored) for r in replies)  # answered without the fsync
            again = await gather(engine, [member(0, group="h"), member(1, group="h")])
            assert all(isinstance(r, Scored) for r in again)
        # the close gave up on the stuck thread instead of waiting for it
    messages = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert sum("did not confirm the commit" in m for m in messages) == 2
    assert any("closed without waiting for it" in m for m in messages), messages


# --- real processes: the shutdown promise of docs/operations.md ----------------------------------


def _start_stalling(tmp_path: Path, name: str, config: dict[str, Any]) -> tuple[Proc, Path]:
    flag = tmp_path / f"{name}.stall"
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    script = Path(__file__).with_name("stalled_serve.py")
    args = ["serve", "--config", str(path), "--port", "0", "--judge", "sim"]
    args += ["--state", str(tmp_path / f"{name}.db")]
    proc = start(args, tmp_path / f"{name}.err", program=[sys.executable, str(script), str(flag)])
    return proc, flag


async def _stall_a_group(
    proc: Proc, flag: Path, http: httpx.AsyncClient, nursery: trio.Nursery
) -> None:
    """Switch the stall on and send a 2-member group: judged at once, its terminal record's
    fsync never returns. Returns once the stall began (the members still wait)."""
    await trio.Path(flag).touch()
    group = bodies("stalled", answers("[clean]", 2))

    async def one(body: dict[str, Any]) -> None:
        # the shutdown may close the connection before any reply; that is not under test
        with suppress(httpx.HTTPError):
            await post(http, f"{proc.url}/verify", body)

    for body in group:
        nursery.start_soon(one, body)
    stalled = trio.Path(flag.with_name(flag.name + ".stalled"))
    with trio.fail_after(20):
        while not await stalled.exists():  # noqa: ASYNC110 (another process)
            await trio.sleep(0.02)


@pytest.mark.slow
async def test_a_stalled_store_holds_the_shutdown_at_most_the_commit_timeout(
    tmp_path: Path,
) -> None:
    grace_s, timeout_s = 1.0, 3.0
    config = {
        "num_rollouts_per_prompt": 2,
        "state_commit_timeout_s": timeout_s,
        "server": {"shutdown_grace_s": grace_s},
    }
    proc, flag = await trio.to_thread.run_sync(_start_stalling, tmp_path, "bounded", config)
    try:
        async with client(timeout=60.0) as http, trio.open_nursery() as nursery:
            await _stall_a_group(proc, flag, http, nursery)
            signalled = time.monotonic()
            proc.signal(signal.SIGTERM)
            code = await trio.to_thread.run_sync(
                proc.wait, grace_s + timeout_s + JUDGE_CLOSE_S + MARGIN_S
            )
            exited = time.monotonic() - signalled
            nursery.cancel_scope.cancel()
    finally:
        await trio.to_thread.run_sync(proc.close)
    assert code == 0
    assert exited < grace_s + timeout_s + JUDGE_CLOSE_S + MARGIN_S, exited
    log = proc.log()
    assert "received SIGTERM: shutting down" in log
    assert "did not confirm the commit" in log
    assert "closed without waiting for it" in log
    assert "Traceback" not in log


@pytest.mark.slow
async def test_a_second_signal_ends_a_shutdown_held_by_a_stalled_store_at_once(
    tmp_path: Path,
) -> None:
    # A commit timeout far longer than the test allows: only the second signal can end it.
    config = {
        "num_rollouts_per_prompt": 2,
        "state_commit_timeout_s": 120.0,
        "server": {"shutdown_grace_s": 60.0},
    }
    proc, flag = await trio.to_thread.run_sync(_start_stalling, tmp_path, "twice", config)
    try:
        async with client(timeout=60.0) as http, trio.open_nursery() as nursery:
            await _stall_a_group(proc, flag, http, nursery)
            first = time.monotonic()
            proc.signal(signal.SIGTERM)
            with trio.fail_after(10):
                while "received SIGTERM: shutting down" not in proc.log():  # noqa: ASYNC110
                    await trio.sleep(0.02)
            # A second signal within the window is the first delivered twice (a process group's
            # Ctrl-C): the one under test comes after it, as a person's second Ctrl-C does.
            await trio.sleep(max(0.0, first + REPEAT_SIGNAL_WINDOW_S + 0.2 - time.monotonic()))
            assert proc.popen.poll() is None  # held by the stalled store
            signalled = time.monotonic()
            proc.signal(signal.SIGTERM)
            code = await trio.to_thread.run_sync(proc.wait, MARGIN_S)
            exited = time.monotonic() - signalled
            nursery.cancel_scope.cancel()
    finally:
        await trio.to_thread.run_sync(proc.close)
    assert code == 128 + signal.SIGTERM
    assert exited < MARGIN_S, exited
    log = proc.log()
    assert "received SIGTERM again: exiting at once" in log
    assert "Traceback" not in log
