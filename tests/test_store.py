"""Durable state (docs/durable-state.md): the SQLite store, its load rules, and engine restarts.

The store runs SQLite in worker threads (real I/O), so these tests use the real clock with short
deadlines, never MockClock autojump (docs/embedding.md, "Testing with virtual time"). Wall-clock
retention is driven by an injected clock.
"""

from __future__ import annotations

import math
import os
import sqlite3
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, closing, contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from judges import (
    ScriptedJudge,
    assert_no_leaks,
    gather,
    hang,
    http_error,
    member,
    settings,
    verify,
)
from procs import command
from trio.testing import MockClock

from genrm_trio.app.compose import durable_engine, restore_from_store
from genrm_trio.config import Settings
from genrm_trio.domain.model import GroupFailed, Masked, Rejection, RequestRejected, Scored
from genrm_trio.domain.records import MemberRecord, OpenRecord, TerminalRecord, WatermarkRecord
from genrm_trio.domain.text import shown_id
from genrm_trio.engine.engine import Engine, open_engine
from genrm_trio.store.protocol import QueuedCohortStore
from genrm_trio.store.schema import SCHEMA_VERSION
from genrm_trio.store.sqlite import INTERRUPTED_TEMPLATE, StoreError, open_store

LIMIT_S = 20.0  # real seconds; every test finishes far sooner
DIGEST = "d" * 64
RESPONSE = "e" * 64
SHUTTING_DOWN = GroupFailed("cohort", "GenRM server is shutting down")


class Wall:
    """An injectable wall clock."""

    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def state(tmp_path: Path, **overrides: Any) -> Settings:
    return settings(state_path=str(tmp_path / "state.db"), **overrides)


def path_of(config: Settings) -> str:
    assert config.state_path is not None
    return config.state_path


@asynccontextmanager
async def durable(
    config: Settings, judge: ScriptedJudge, wall: Wall | None = None
) -> AsyncIterator[Engine]:
    """An engine on the durable state of ``config``, bounded in real time, leak-checked."""
    with trio.fail_after(LIMIT_S):
        if wall is None:
            async with durable_engine(config, judge) as engine:
                yield engine
        else:
            async with (
                open_store(path_of(config), config, clock=wall) as store,
                open_engine(config, judge, store=store) as engine,
            ):
                await restore_from_store(engine, store)
                yield engine
    assert_no_leaks(engine, judge)


@contextmanager
def rows(path: str | Path, query: str, *args: Any) -> Iterator[list[tuple[Any, ...]]]:
    """Read the state file with a separate connection (WAL readers never block the writer)."""
    with closing(sqlite3.connect(path)) as db:
        yield db.execute(query, args).fetchall()


# Schema 2 keeps a cohort's members in one JSON column: count them across every row.
STORED_MEMBERS = "SELECT count(*) FROM cohorts, json_each(cohorts.members)"


def explicit_key(group: str, attempt: int = 0) -> str:
    return f"group_id::{group}::group_attempt::{attempt}"


def record(key: str, group: str | None = "g", attempt: int = 0, **result: Any) -> TerminalRecord:
    return TerminalRecord(
        key=key,
        group_id=group,
        group_attempt=attempt,
        legacy=group is None,
        prompt_digest=DIGEST,
        phase="completed",
        members={
            0: MemberRecord(RESPONSE, result={"reward": 3.0, **result}),
            1: MemberRecord(RESPONSE, masked_alone=True, failure_reason="judge said no"),
        },
    )


def failed(key: str, group: str | None = "g", attempt: int = 0) -> TerminalRecord:
    return TerminalRecord(
        key=key,
        group_id=group,
        group_attempt=attempt,
        legacy=group is None,
        prompt_digest=DIGEST,
        phase="failed",
        failure="it broke",
        failure_kind="judge",
    )


def overwrite(path: str | Path, offset: int, data: bytes) -> None:
    """Write ``data`` at ``offset`` (creating the file)."""
    with Path(path).open("ab"):
        pass
    with Path(path).open("r+b") as handle:
        handle.seek(offset)
        handle.write(data)


def first_bytes(path: str | Path, n: int) -> bytes:
    with Path(path).open("rb") as handle:
        return handle.read(n)


async def until(predicate: Callable[[], bool]) -> None:
    """Poll ``predicate`` (real time: worker threads move the state)."""
    while not predicate():  # noqa: ASYNC110
        await trio.sleep(0.005)


def failing(*pairs: tuple[int, int]) -> ScriptedJudge:
    """Default verdicts, except that the shown pairs (i, j) of answers a{i}/a{j} fail with 500."""
    return ScriptedJudge(pairs={(f"a{i}", f"a{j}"): http_error() for i, j in pairs})


# --- restarts through the engine ------------------------------------------------------------


async def test_restart_replays_every_outcome_without_judging(tmp_path: Path) -> None:
    config = state(tmp_path, num_rollouts_per_prompt=4)
    first = failing((0, 1))  # circular: (0,1) fails → 0 and 1 masked alone, 2 and 3 scored
    async with durable(config, first) as engine:
        before = await gather(engine, [member(i) for i in range(4)])
        for attempt in (0, 1):
            await gather(engine, [member(i, group="s", attempt=attempt) for i in range(4)])
    assert [type(r) for r in before] == [Masked, Masked, Scored, Scored]
    calls_before = len(first.calls)

    second = ScriptedJudge()
    async with durable(config, second) as engine:
        after = await gather(engine, [member(i) for i in range(4)])
        assert after == before  # same reasons, same result mappings
        for old, new in zip(before[2:], after[2:], strict=True):
            assert isinstance(old, Scored) and isinstance(new, Scored)
            assert list(new.result) == list(old.result)
            for name, value in old.result.items():
                if type(value) is float:
                    assert new.result[name].hex() == value.hex(), name
        # a regenerated answer for a masked member gets its recorded judge failure ...
        assert await verify(engine, member(1, answer="a1 regenerated")) == before[1]
        # ... and a scored member still refuses a different answer.
        refused = await verify(engine, member(2, answer="a2 regenerated"))
        assert isinstance(refused, RequestRejected) and refused.reason is Rejection.CONFLICT
        assert "already has a different response for rollout_index=2" in refused.detail
        # Stale attempts stay stale; the newest attempt replays.
        stale = await verify(engine, member(0, group="s", attempt=0))
        assert isinstance(stale, RequestRejected) and stale.reason is Rejection.CONFLICT
        assert stale.detail == "GenRM group 's' attempt 0 was superseded by attempt 1"
        assert isinstance(await verify(engine, member(3, group="s", attempt=1)), Scored)
        # A different prompt for a known group is still refused.
        other = await verify(engine, member(0, prompt="Another prompt"))
        assert isinstance(other, RequestRejected) and other.reason is Rejection.CONFLICT
        assert "inconsistent prompt" in other.detail
    assert second.calls == []
    assert len(first.calls) == calls_before


async def test_groups_active_at_the_stop_are_fenced_and_recover(tmp_path: Path) -> None:
    config = state(tmp_path, num_rollouts_per_prompt=2)
    first = ScriptedJudge(script=lambda r1, r2, n: hang() if "judging" in r1 + r2 else None)
    replies: dict[str, object] = {}

    async def send(name: str, **kwargs: Any) -> None:
        replies[name] = await verify(engine, member(**kwargs))

    async with durable(config, first) as engine, trio.open_nursery() as nursery:
        nursery.start_soon(partial(send, "collecting", index=0, group="c"))
        nursery.start_soon(partial(send, "legacy", index=0, group=None))
        for i in range(2):
            nursery.start_soon(
                partial(send, f"judging{i}", index=i, group="j", answer=f"judging{i}")
            )
        await until(lambda: first.in_flight > 0 and len(engine.active_cohorts()) == 3)
        await engine.aclose()  # a graceful stop: every waiter gets 503
    assert len(replies) == 4
    for name, reply in replies.items():
        assert isinstance(reply, GroupFailed) and reply.kind == "cohort", name
        assert reply.message.startswith(SHUTTING_DOWN.message), name
    with rows(path_of(config), "SELECT phase FROM cohorts") as found:
        assert sorted(found) == [("open",)] * 3  # a graceful stop leaves the open records

    second = ScriptedJudge()
    async with durable(config, second) as engine:
        for group in ("c", "j"):
            interrupted = GroupFailed(
                "cohort", INTERRUPTED_TEMPLATE.format(key=shown_id(explicit_key(group)))
            )
            for i in range(2):
                assert await verify(engine, member(i, group=group, answer=f"x{i}")) == interrupted
            # A new attempt of the whole group is judged normally.
            fresh = await gather(engine, [member(i, group=group, attempt=1) for i in range(2)])
            assert all(isinstance(r, Scored) for r in fresh)
        # The unfinished legacy cohort was dropped, not fenced: the key starts a new cohort.
        legacy = await gather(engine, [member(i, group=None) for i in range(2)])
        assert all(isinstance(r, Scored) for r in legacy)
    assert second.calls and all("judging" not in c.call.response_1 for c in second.calls)


async def test_the_fence_of_a_long_group_id_shows_it_cut(tmp_path: Path) -> None:
    """The stored interrupted failure shows a 10,000-character group id as `shown_id` does."""
    config = state(tmp_path)
    group = "g" * 10_000
    async with durable(config, ScriptedJudge()) as engine, trio.open_nursery() as nursery:
        nursery.start_soon(verify, engine, member(0, group=group))
        await until(lambda: bool(engine.active_cohorts()))
        await engine.aclose()
    async with durable(config, ScriptedJudge()) as engine:
        reply = await verify(engine, member(1, group=group))
    message = INTERRUPTED_TEMPLATE.format(key=shown_id(explicit_key(group)))
    assert reply == GroupFailed("cohort", message)
    assert repr("group_id::" + "g" * 990) + "… (10028 characters)" in message
    assert len(message) < 2000


async def test_a_second_restart_keeps_the_fence(tmp_path: Path) -> None:
    config = state(tmp_path)
    async with durable(config, ScriptedJudge()) as engine, trio.open_nursery() as nursery:
        nursery.start_soon(verify, engine, member(0))
        await until(lambda: bool(engine.active_cohorts()))
        await engine.aclose()
    interrupted = GroupFailed(
        "cohort", INTERRUPTED_TEMPLATE.format(key=shown_id(explicit_key("g")))
    )
    for _ in range(2):
        async with durable(config, ScriptedJudge()) as engine:
            assert await verify(engine, member(1)) == interrupted


async def test_restart_keeps_lone_surrogates_and_exact_floats(tmp_path: Path) -> None:
    config = state(tmp_path, num_rollouts_per_prompt=3)
    answers = ["a0 \udc80", "a1", "a2 \ud83d"]
    items = [member(i, group="g\ud800", answer=answers[i], prompt="p \udfff") for i in range(3)]
    async with durable(config, ScriptedJudge()) as engine:
        before = await gather(engine, items)
    assert all(isinstance(r, Scored) for r in before)
    judge = ScriptedJudge()
    async with durable(config, judge) as engine:
        after = await gather(engine, items)
        regenerated = await verify(
            engine, member(0, group="g\ud800", answer="b", prompt="p \udfff")
        )
        assert isinstance(regenerated, RequestRejected) and regenerated.reason is Rejection.CONFLICT
    assert after == before
    assert judge.calls == []
    assert isinstance(after[0], Scored) and after[0].result["answer_text"] == "a0 \udc80"


async def test_restored_records_keep_their_age(tmp_path: Path, mock_clock: MockClock) -> None:
    """Monotonic clocks are set back by the stored age: with a 1 s TTL, a record and a watermark
    stored 0.9 s before the restart are gone 0.2 s after it; ones stored later are not. (Virtual
    time that moves only when jumped: the store's threads need no autojump.)"""
    config = state(tmp_path, cohort_result_ttl_s=1.0)
    wall = Wall()
    async with durable(config, ScriptedJudge(), wall) as engine:
        assert all(isinstance(r, Scored) for r in await gather(engine, [member(0), member(1)]))
    wall.now += 0.5
    async with durable(config, ScriptedJudge(), wall) as engine:
        young = await gather(engine, [member(i, group="young") for i in range(2)])
    wall.now += 0.4
    judge = ScriptedJudge()
    async with durable(config, judge, wall) as engine:
        assert engine.statistics().terminal_records == 2
        mock_clock.jump(0.2)
        await gather(engine, [member(i, group="probe") for i in range(2)])  # prunes
        assert {r.key for r in engine.terminal_records()} == {
            explicit_key("young"),
            explicit_key("probe"),
        }
        # Watermarks are set back by their age too: group "g"'s is gone as well.
        assert {m.group_id for m in engine.watermark_records()} == {"young", "probe"}
        assert await gather(engine, [member(i, group="young") for i in range(2)]) == young
    assert len(judge.calls) == 2  # only the probe group was judged (circular N=2: 2 calls)


async def test_legacy_records_follow_the_registry(tmp_path: Path) -> None:
    """A completed legacy cohort without masked members keeps nothing; one with a masked
    member (D33) is kept and replays after a restart with the legacy advice."""
    config = state(tmp_path, num_rollouts_per_prompt=4)
    async with durable(config, ScriptedJudge()) as engine:
        clean = await gather(engine, [member(i, group=None, task_index=1) for i in range(4)])
    assert all(isinstance(r, Scored) for r in clean)
    with rows(path_of(config), "SELECT count(*) FROM cohorts") as found:
        assert found == [(0,)]
    async with durable(config, failing((0, 1))) as engine:
        masked = await gather(engine, [member(i, group=None, task_index=2) for i in range(4)])
    assert isinstance(masked[0], Masked) and "fresh _ng_group_id" in masked[0].reason
    judge = ScriptedJudge()
    async with durable(config, judge) as engine:
        again = await gather(
            engine, [member(i, group=None, task_index=2, answer=f"new{i}") for i in range(2)]
        )
        assert again == masked[:2]  # masked slots: the recorded failure, regenerated or not
        assert await verify(engine, member(3, group=None, task_index=2)) == masked[3]
        # a scored slot (D33): its reward if identical, 409 if different
        assert isinstance(masked[3], Scored)
        refused = await verify(engine, member(3, group=None, task_index=2, answer="new3"))
        assert isinstance(refused, RequestRejected) and refused.reason is Rejection.CONFLICT
        assert "already has a different response for rollout_index=3" in refused.detail
    assert judge.calls == []


# --- commit points ------------------------------------------------------------------------------


class GatedStore:
    """Delegates to a real store; terminal commits wait for ``gate``."""

    def __init__(self, inner: Any, gate: trio.Event, events: list[str]) -> None:
        self.inner = inner
        self.gate = gate
        self.events = events
        self.waiting = trio.Event()

    async def commit_watermark(self, record: WatermarkRecord) -> None:
        await self.inner.commit_watermark(record)

    async def commit_open(self, record: OpenRecord) -> None:
        await self.inner.commit_open(record)

    async def commit_terminal(self, record: TerminalRecord) -> None:
        self.waiting.set()
        await self.gate.wait()
        await self.inner.commit_terminal(record)
        self.events.append("committed")


async def test_no_waiter_is_released_before_the_terminal_commit(tmp_path: Path) -> None:
    config = state(tmp_path)
    gate = trio.Event()
    events: list[str] = []

    async def send(i: int) -> None:
        reply = await verify(engine, member(i))
        assert isinstance(reply, Scored)
        events.append(f"reply {i}")

    with trio.fail_after(LIMIT_S):
        async with open_store(path_of(config), config) as inner:
            store = GatedStore(inner, gate, events)
            async with (
                open_engine(config, ScriptedJudge(), store=store) as engine,
                trio.open_nursery() as nursery,
            ):
                nursery.start_soon(send, 0)
                nursery.start_soon(send, 1)
                await store.waiting.wait()
                nursery.start_soon(send, 0)  # a replay while the commit is pending waits too
                # every task is parked (the commit at the gate, three requests waiting): a
                # release before the commit would have run by now
                await trio.testing.wait_all_tasks_blocked()
                assert events == []
                with rows(path_of(config), "SELECT phase FROM cohorts") as found:
                    assert found == [("open",)]
                gate.set()
    assert events[0] == "committed"
    assert sorted(events[1:]) == ["reply 0", "reply 0", "reply 1"]


# --- the store on its own -------------------------------------------------------------------


async def test_records_round_trip_exactly(tmp_path: Path) -> None:
    config = state(tmp_path)
    lone = "\ud800 and \udfff"
    result = {
        "reward": 0.1 + 0.2,
        "third": 1 / 3,
        "tiny": 5e-324,
        "huge": 1.7976931348623157e308,
        "negative_zero": -0.0,
        "integer": 2**70,
        "text": lone,
        "nested": {"list": [1, 2.5, None, True], lone: lone},
    }
    records = [
        record(f"group_id::{lone}::group_attempt::{2**70}", group=lone, attempt=2**70, **result),
        failed(f"{DIGEST}::group_attempt::0", group=None),
        TerminalRecord(
            key=explicit_key("m"),
            group_id="m",
            group_attempt=0,
            legacy=False,
            prompt_digest=DIGEST,
            phase="completed",
            members={0: MemberRecord(RESPONSE, masked_alone=True, failure_reason=f"why {lone}")},
        ),
    ]
    wall = Wall()
    with trio.fail_after(LIMIT_S):
        async with open_store(path_of(config), config, clock=wall) as store:
            for item in records:
                await store.commit_open(
                    OpenRecord(item.key, item.group_id, item.group_attempt, item.legacy, DIGEST)
                )
                await store.commit_terminal(item)
                wall.now += 1
            await store.commit_watermark(WatermarkRecord(lone, 2**70, DIGEST + ":rubrics:1,2"))
        async with open_store(path_of(config), config, clock=wall) as store:
            loaded = await store.load()
    assert list(loaded.records) == records
    stored = loaded.records[0].members[0].result
    assert stored is not None
    for name in ("reward", "third", "tiny", "huge"):
        assert stored[name].hex() == result[name].hex()  # type: ignore[attr-defined]
    assert math.copysign(1.0, stored["negative_zero"]) == -1.0
    assert loaded.watermarks == (WatermarkRecord(lone, 2**70, DIGEST + ":rubrics:1,2"),)
    assert loaded.record_ages == {records[0].key: 3.0, records[1].key: 2.0, records[2].key: 1.0}
    assert loaded.watermark_ages == {lone: 0.0}


async def test_load_applies_the_startup_rules_in_one_persisted_pass(tmp_path: Path) -> None:
    config = state(tmp_path, cohort_result_ttl_s=100.0)
    wall = Wall()
    explicit_open = OpenRecord(explicit_key("open"), "open", 3, False, DIGEST)
    legacy_open = OpenRecord(f"{DIGEST}::group_attempt::0", None, 0, True, DIGEST)
    with trio.fail_after(LIMIT_S):
        async with open_store(path_of(config), config, clock=wall) as store:
            await store.commit_terminal(record(explicit_key("expired")))
            await store.commit_watermark(WatermarkRecord("expired", 0, DIGEST))
            await store.commit_watermark(WatermarkRecord("open", 3, DIGEST))  # kept: group open
            wall.now += 50
            await store.commit_terminal(record(explicit_key("kept")))
            await store.commit_watermark(WatermarkRecord("kept", 0, DIGEST))
            await store.commit_open(explicit_open)
            await store.commit_open(legacy_open)
        wall.now += 60  # "expired" is 110 s old, "kept" 60 s
        async with open_store(path_of(config), config, clock=wall) as store:
            loaded = await store.load()
        fence = TerminalRecord(
            key=explicit_open.key,
            group_id="open",
            group_attempt=3,
            legacy=False,
            prompt_digest=DIGEST,
            phase="failed",
            failure=INTERRUPTED_TEMPLATE.format(key=shown_id(explicit_open.key)),
            failure_kind="cohort",
        )
        assert list(loaded.records) == [record(explicit_key("kept")), fence]
        assert loaded.record_ages == {explicit_key("kept"): 60.0, fence.key: 0.0}
        assert [m.group_id for m in loaded.watermarks] == ["open", "kept"]
        assert loaded.watermark_ages == {"open": 110.0, "kept": 60.0}
        assert (loaded.interrupted, loaded.dropped_open, loaded.expired) == (1, 1, 2)
        # The conversion was persisted: the next load sees the same fence, now older.
        wall.now += 5
        async with open_store(path_of(config), config, clock=wall) as store:
            again = await store.load()
        assert list(again.records) == [record(explicit_key("kept")), fence]
        assert again.record_ages == {explicit_key("kept"): 65.0, fence.key: 5.0}
        # Its group is no longer open, so its 115 s old watermark has now expired.
        assert [m.group_id for m in again.watermarks] == ["kept"]
        assert (again.interrupted, again.dropped_open, again.expired) == (0, 0, 1)


async def test_load_applies_the_cap_by_age(tmp_path: Path) -> None:
    wall = Wall()
    roomy = state(tmp_path, max_terminal_cohorts=10, cohort_result_ttl_s=None)
    with trio.fail_after(LIMIT_S):
        async with open_store(path_of(roomy), roomy, clock=wall) as store:
            for name in "abcde":
                await store.commit_terminal(record(explicit_key(name)))
                await store.commit_watermark(WatermarkRecord(name, 0, DIGEST))
                wall.now += 1
        tight = roomy.model_copy(update={"max_terminal_cohorts": 2})
        async with open_store(path_of(tight), tight, clock=wall) as store:
            loaded = await store.load()
            assert store.statistics().terminal_records == 2
    assert [r.key for r in loaded.records] == [explicit_key("d"), explicit_key("e")]
    assert [m.group_id for m in loaded.watermarks] == ["d", "e"]
    assert loaded.evicted == 6
    with rows(path_of(roomy), STORED_MEMBERS) as found:
        assert found == [(4,)]


async def test_commits_prune_by_ttl_and_cap(tmp_path: Path) -> None:
    config = state(tmp_path, max_terminal_cohorts=3, cohort_result_ttl_s=100.0)
    wall = Wall()
    with trio.fail_after(LIMIT_S):
        async with open_store(path_of(config), config, clock=wall) as store:
            for name in "abcde":
                await store.commit_terminal(record(explicit_key(name)))
                wall.now += 1
            assert store.statistics().terminal_records == 3
            with rows(path_of(config), "SELECT key FROM cohorts ORDER BY key") as found:
                assert [bytes(k).decode() for (k,) in found] == [explicit_key(n) for n in "cde"]
            wall.now += 200
            await store.commit_terminal(failed(explicit_key("f")))
            assert store.statistics().terminal_records == 1
            # Re-committing a key replaces it; an open record replaces a terminal one.
            await store.commit_terminal(failed(explicit_key("f")))
            await store.commit_open(OpenRecord(explicit_key("f"), "g", 0, False, DIGEST))
            assert store.statistics().terminal_records == 0
    with rows(path_of(config), STORED_MEMBERS) as found:
        assert found == [(0,)]


@pytest.mark.parametrize("synchronous", ["FULL", "NORMAL"])
async def test_concurrent_commits_share_transactions_and_fsyncs(
    tmp_path: Path, synchronous: Any
) -> None:
    config = state(tmp_path)
    with trio.fail_after(LIMIT_S):
        async with open_store(path_of(config), config, synchronous=synchronous) as store:
            await store.commit_open(OpenRecord(explicit_key("o"), "o", 0, False, DIGEST))
            await store.commit_watermark(WatermarkRecord("o", 0, DIGEST))
            assert store.statistics().fsyncs == 0  # only terminal records are synced
            async with trio.open_nursery() as nursery:
                for n in range(64):
                    nursery.start_soon(store.commit_terminal, record(explicit_key(f"g{n}")))
            stats = store.statistics()
    assert stats.operations == 66 and stats.terminal_records == 64
    assert stats.transactions < 66
    if synchronous == "FULL":
        assert 1 <= stats.fsyncs < 64
    else:
        assert stats.fsyncs == 0


async def test_commit_many_is_one_transaction(tmp_path: Path) -> None:
    config = state(tmp_path)
    records = [record(explicit_key(f"g{n}")) for n in range(5)]
    marks = [WatermarkRecord(f"g{n}", 0, DIGEST) for n in range(5)]
    with trio.fail_after(LIMIT_S):
        async with open_store(path_of(config), config) as store:
            await store.commit_many(records, marks)
            stats = store.statistics()
            assert (stats.transactions, stats.terminal_records, stats.watermarks) == (1, 5, 5)
        async with open_store(path_of(config), config) as store:
            loaded = await store.load()
    assert list(loaded.records) == records and list(loaded.watermarks) == marks


async def test_a_failed_transaction_rolls_back_and_the_store_goes_on(tmp_path: Path) -> None:
    config = state(tmp_path)
    bad = record(explicit_key("bad"), broken=math.nan)  # not JSON: the encoder refuses NaN
    with trio.fail_after(LIMIT_S):
        async with open_store(path_of(config), config) as store:
            await store.commit_open(OpenRecord(bad.key, "g", 0, False, DIGEST))
            with pytest.raises(StoreError, match=r"cannot store the record of key .* ValueError"):
                await store.commit_terminal(bad)
            await store.commit_terminal(record(explicit_key("good")))
            assert store.statistics().terminal_records == 1
            # A transaction that fails in SQLite is retried one operation at a time.
            broken = OpenRecord(explicit_key("broken"), "g", 0, False, DIGEST)
            await store.commit_open(broken)

            def explode(cur: sqlite3.Cursor, now: float) -> None:
                cur.execute("INSERT INTO no_such_table VALUES (1)")

            errors: list[str] = []

            async def submit_explode() -> None:
                try:
                    await store._enqueue(explode).wait()
                except StoreError as exc:
                    errors.append(str(exc))

            before = store.statistics().transactions
            # Hold the writer thread so that the last two share one batch.
            held = threading.Event()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(store._commits.writer.run, held.wait)
                await trio.testing.wait_all_tasks_blocked()
                nursery.start_soon(store.commit_watermark, WatermarkRecord("w", 0, DIGEST))
                await trio.testing.wait_all_tasks_blocked()
                nursery.start_soon(store.commit_terminal, failed(explicit_key("other")))
                nursery.start_soon(submit_explode)
                await trio.testing.wait_all_tasks_blocked()
                assert store.statistics().queued == 2  # behind the watermark's transaction
                held.set()
            assert len(errors) == 1 and "no such table" in errors[0]
            # the watermark, the failed shared batch, then one transaction per operation
            assert store.statistics().transactions == before + 2
            assert store.statistics().terminal_records == 2
    with rows(path_of(config), "SELECT key, phase FROM cohorts ORDER BY key") as found:
        assert [(bytes(k).decode(), p) for k, p in found] == [
            (bad.key, "open"),  # untouched by the failed commit
            (explicit_key("broken"), "open"),
            (explicit_key("good"), "completed"),
            (explicit_key("other"), "failed"),
        ]


async def test_commit_survives_the_callers_cancellation(tmp_path: Path) -> None:
    """A cancelled wait abandons the wait, never the commit: it is applied in order."""
    config = state(tmp_path)
    with trio.fail_after(LIMIT_S):
        async with open_store(path_of(config), config) as store:
            with trio.CancelScope() as scope:
                scope.cancel()
                await store.commit_terminal(record(explicit_key("x")))
            assert scope.cancelled_caught
            await store.commit_watermark(WatermarkRecord("after", 0, DIGEST))  # queued later
            assert store.statistics().terminal_records == 1


async def test_submits_queue_at_once_and_apply_in_order(tmp_path: Path) -> None:
    """The engine queues commits under its registry lock and waits for them after it: a submit
    never awaits, and queued commits apply in submission order (here in one transaction)."""
    config = state(tmp_path)
    key = explicit_key("q")
    with trio.fail_after(LIMIT_S):
        async with open_store(path_of(config), config) as store:
            assert isinstance(store, QueuedCohortStore)
            mark = store.submit_watermark(WatermarkRecord("q", 0, DIGEST))
            opened = store.submit_open(OpenRecord(key, "q", 0, False, DIGEST))
            done = store.submit_terminal(record(key, "q"))
            assert store.statistics().queued == 3 and store.statistics().transactions == 0
            with pytest.raises(StoreError, match="cannot store the record"):
                store.submit_terminal(record(explicit_key("bad"), broken=math.nan))
            assert store.statistics().queued == 3  # refused before anything was queued
            await done.wait()  # the last one: everything before it is applied too
            stats = store.statistics()
            assert (stats.transactions, stats.operations) == (1, 3)
            assert (stats.terminal_records, stats.watermarks, stats.queued) == (1, 1, 0)
            await mark.wait()
            await opened.wait()
            await done.wait()  # waiting again is fine
    with rows(path_of(config), "SELECT phase FROM cohorts") as found:
        assert found == [("completed",)]  # the terminal record replaced the open one


async def test_closing_applies_commits_nobody_waited_for(tmp_path: Path) -> None:
    config = state(tmp_path)
    key = explicit_key("o")
    with trio.fail_after(LIMIT_S):
        async with open_store(path_of(config), config) as store:
            store.submit_watermark(WatermarkRecord("o", 0, DIGEST))
            store.submit_open(OpenRecord(key, "o", 0, False, DIGEST))
    with rows(path_of(config), "SELECT phase FROM cohorts") as found:
        assert found == [("open",)]
    with rows(path_of(config), "SELECT latest_attempt FROM watermarks") as found:
        assert found == [(0,)]


async def test_a_closed_store_refuses_commits(tmp_path: Path) -> None:
    config = state(tmp_path)
    async with open_store(path_of(config), config) as store:
        pass
    assert store.closed
    with pytest.raises(StoreError, match="closed"):
        await store.commit_terminal(record(explicit_key("x")))
    await store.aclose()  # idempotent


async def test_identical_records_from_load_are_not_rewritten(tmp_path: Path) -> None:
    """Restoring what load() returned keeps the stored timestamps (retention continues)."""
    config = state(tmp_path, cohort_result_ttl_s=100.0)
    wall = Wall()
    async with open_store(path_of(config), config, clock=wall) as store:
        await store.commit_terminal(record(explicit_key("a")))
    wall.now += 60
    async with durable(config, ScriptedJudge(), wall) as engine:
        assert engine.statistics().terminal_records == 1
    wall.now += 60
    async with open_store(path_of(config), config, clock=wall) as store:
        assert (await store.load()).records == ()


# --- opening -------------------------------------------------------------------------------------


async def open_fails(path: Path | str, config: Settings) -> str:
    with pytest.raises(StoreError) as caught:
        async with open_store(path, config):
            pass  # pragma: no cover
    message = str(caught.value)
    assert str(path) in message
    return message


async def test_a_non_sqlite_file_is_a_store_error(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    overwrite(path, 0, b"these are not the pages you are looking for\n" * 200)
    assert "not a usable SQLite database" in await open_fails(path, settings())
    assert first_bytes(path, 13) == b"these are not"  # untouched


async def test_a_corrupt_database_is_a_store_error(tmp_path: Path) -> None:
    config = state(tmp_path)
    async with open_store(path_of(config), config) as store:
        for n in range(200):
            await store.commit_terminal(record(explicit_key(f"g{n}"), text="x" * 200))
    overwrite(path_of(config), 4 * 4096, b"\xa5" * (2 * 4096))
    message = await open_fails(path_of(config), config)
    assert "corrupt" in message or "malformed" in message


async def test_a_foreign_database_is_a_store_error(tmp_path: Path) -> None:
    path = tmp_path / "other.db"
    with closing(sqlite3.connect(path)) as db:
        db.execute("CREATE TABLE t (x)")
        db.commit()
    assert "not a genrm-trio state file" in await open_fails(path, settings())


async def test_an_unknown_schema_version_is_a_store_error(tmp_path: Path) -> None:
    config = state(tmp_path)
    async with open_store(path_of(config), config):
        pass
    with closing(sqlite3.connect(path_of(config))) as db:
        db.execute(
            "UPDATE meta SET value = ? WHERE name = 'schema_version'", (str(SCHEMA_VERSION + 1),)
        )
        db.commit()
    message = await open_fails(path_of(config), config)
    assert f"schema version {SCHEMA_VERSION + 1} is not supported" in message


# Schema 1 (genrm-trio before the packed members column): one `members` row per member.
SCHEMA_1 = (
    "CREATE TABLE meta (name TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID",
    "CREATE TABLE cohorts (key BLOB PRIMARY KEY, group_id BLOB, group_attempt NOT NULL, "
    "legacy INTEGER NOT NULL, prompt_digest TEXT NOT NULL, phase TEXT NOT NULL, failure BLOB, "
    "failure_kind TEXT, terminal_at REAL) WITHOUT ROWID",
    "CREATE INDEX cohorts_by_terminal_at ON cohorts (terminal_at) WHERE terminal_at IS NOT NULL",
    "CREATE INDEX cohorts_open_groups ON cohorts (group_id) WHERE phase = 'open'",
    "CREATE TABLE members (key BLOB NOT NULL, rollout_index INTEGER NOT NULL, "
    "response_digest TEXT NOT NULL, result TEXT, masked_alone INTEGER NOT NULL, "
    "failure_reason BLOB, PRIMARY KEY (key, rollout_index)) WITHOUT ROWID",
    "CREATE TABLE watermarks (group_id BLOB PRIMARY KEY, latest_attempt NOT NULL, "
    "prompt_digest TEXT NOT NULL, updated_at REAL NOT NULL) WITHOUT ROWID",
    "CREATE INDEX watermarks_by_updated_at ON watermarks (updated_at)",
)


def write_schema_1(path: str, now: float) -> None:
    lone = "why \udfff"
    done, fence, opened = explicit_key("done"), explicit_key("fence"), explicit_key("open")
    with closing(sqlite3.connect(path)) as db:
        for statement in SCHEMA_1:
            db.execute(statement)
        db.executemany(
            "INSERT INTO meta VALUES (?, ?)",
            [("application", "genrm-trio"), ("schema_version", "1")],
        )
        db.executemany(
            "INSERT INTO cohorts VALUES (?, ?, 0, 0, ?, ?, ?, ?, ?)",
            [
                (done.encode(), b"done", DIGEST, "completed", None, None, now - 2),
                (fence.encode(), b"fence", DIGEST, "failed", b"it broke", "judge", now - 1),
                (opened.encode(), b"open", DIGEST, "open", None, None, None),
            ],
        )
        db.executemany(
            "INSERT INTO members VALUES (?, ?, ?, ?, ?, ?)",
            [
                (done.encode(), 1, RESPONSE, None, 1, lone.encode("utf-8", "surrogatepass")),
                (done.encode(), 0, RESPONSE, '{"reward":0.30000000000000004,"n":null}', 0, None),
            ],
        )
        db.execute("INSERT INTO watermarks VALUES (?, 0, ?, ?)", (b"done", DIGEST, now))
        db.commit()


async def test_a_schema_1_file_is_upgraded_in_place(tmp_path: Path) -> None:
    config = state(tmp_path)
    wall = Wall()
    write_schema_1(path_of(config), wall.now)
    with trio.fail_after(LIMIT_S):
        async with open_store(path_of(config), config, clock=wall) as store:
            assert store.statistics().terminal_records == 2
            assert store.statistics().watermarks == 1
            loaded = await store.load()
    done, fence, opened = loaded.records
    assert done.key == explicit_key("done") and done.phase == "completed"
    assert done.members == {
        0: MemberRecord(RESPONSE, result={"reward": 0.30000000000000004, "n": None}),
        1: MemberRecord(RESPONSE, masked_alone=True, failure_reason="why \udfff"),
    }
    assert (fence.phase, fence.failure, fence.members) == ("failed", "it broke", {})
    assert opened.key == explicit_key("open") and opened.failure_kind == "cohort"  # interrupted
    assert loaded.watermarks == (WatermarkRecord("done", 0, DIGEST),)
    with rows(path_of(config), "SELECT value FROM meta WHERE name = 'schema_version'") as found:
        assert found == [(str(SCHEMA_VERSION),)]
    with rows(path_of(config), "SELECT name FROM sqlite_master WHERE name = 'members'") as found:
        assert found == []


async def test_an_unreadable_members_column_is_a_store_error(tmp_path: Path) -> None:
    config = state(tmp_path)
    async with open_store(path_of(config), config) as store:
        await store.commit_terminal(record(explicit_key("a")))
    for packed in ("[1]", '{"x": {}}', '{"0": {"response_digest": 1, "masked_alone": false}}'):
        with closing(sqlite3.connect(path_of(config))) as db:
            db.execute("UPDATE cohorts SET members = ?", (packed,))
            db.commit()
        async with open_store(path_of(config), config) as store:
            with pytest.raises(StoreError, match=r"cannot load: ValueError: key .*: members: "):
                await store.load()
            assert store.statistics().terminal_records == 1  # nothing dropped


def _member_json(result: str) -> str:
    return (
        f'{{"0": {{"response_digest": "{RESPONSE}", "result": {result}, "masked_alone": false, '
        '"failure_reason": null}}'
    )


@pytest.mark.parametrize(
    ("result", "problem"),
    [
        ('{"reward": NaN}', "holds NaN, which JSON cannot"),
        ('{"reward": 1.0, "x": Infinity}', "holds Infinity, which JSON cannot"),
        ('{"reward": 1.0, "deep": ' + "[" * 100_000 + "]" * 100_000 + "}", "nested too deeply"),
        ('{"reward": ' + "9" * 4001 + "}", "member 0: result.reward: integer out of range"),
        (
            '{"reward": 1.0, "mask_sample": "evil"}',
            "result.mask_sample: a scored member's is false",
        ),
        ('{"reward": "1"}', "member 0: result.reward: expected a finite number"),
    ],
)
async def test_a_damaged_stored_result_is_a_one_line_error_naming_its_group(
    tmp_path: Path, result: str, problem: str
) -> None:
    # (#40 item 7) a NaN once made every GET /checkpoint a 500, deep nesting a traceback
    config = state(tmp_path)
    async with open_store(path_of(config), config) as store:
        await store.commit_terminal(record(explicit_key("damaged")))
    with closing(sqlite3.connect(path_of(config))) as db:
        db.execute("UPDATE cohorts SET members = ?", (_member_json(result),))
        db.commit()
    async with open_store(path_of(config), config) as store:
        with pytest.raises(StoreError) as raised:
            await store.load()
    text = str(raised.value)
    assert "\n" not in text and len(text) < 1_300
    assert f"key {shown_id(explicit_key('damaged'))}: members: " in text
    assert text.endswith(problem)


def test_the_state_files_are_created_private(tmp_path: Path) -> None:
    config = state(tmp_path)

    async def write() -> list[int]:
        async with open_store(path_of(config), config) as store:
            await store.commit_terminal(record(explicit_key("a")))
            files = [path_of(config) + suffix for suffix in ("", "-wal", "-shm")]
            return [os.stat(f).st_mode & 0o777 for f in files]

    assert trio.run(write) == [0o600, 0o600, 0o600]


async def test_a_bad_row_of_a_long_key_is_named_cut(tmp_path: Path) -> None:
    """The load error names a 10,000-character key as every text does (`shown_id`): cut."""
    config = state(tmp_path)
    long_key = explicit_key("g" * 10_000)
    async with open_store(path_of(config), config) as store:
        await store.commit_terminal(record(long_key))
    with closing(sqlite3.connect(path_of(config))) as db:
        db.execute("UPDATE cohorts SET members = '[1]'")
        db.commit()
    async with open_store(path_of(config), config) as store:
        with pytest.raises(StoreError, match=r"characters\): members: ") as raised:
            await store.load()
    assert f"({len(long_key)} characters)" in str(raised.value)
    assert len(str(raised.value)) < 1_300


async def test_missing_directory_and_busy_file_are_store_errors(tmp_path: Path) -> None:
    assert "does not exist" in await open_fails(tmp_path / "no" / "state.db", settings())
    assert "cannot open" in await open_fails(tmp_path, settings())  # a directory
    config = state(tmp_path)
    async with open_store(path_of(config), config):
        assert "in use by another" in await open_fails(path_of(config), config)
    async with open_store(path_of(config), config):  # released on close
        pass


async def test_an_empty_file_becomes_a_new_store(tmp_path: Path) -> None:
    config = state(tmp_path)
    overwrite(path_of(config), 0, b"")
    async with open_store(path_of(config), config) as store:
        assert (await store.load()).records == ()
    with rows(path_of(config), "SELECT name, value FROM meta ORDER BY name") as found:
        assert found == [("application", "genrm-trio"), ("schema_version", str(SCHEMA_VERSION))]
    with rows(path_of(config), "PRAGMA journal_mode") as found:
        assert found == [("wal",)]


# --- a real process killed with SIGKILL -----------------------------------------------------

# The real command line: `genrm-trio sim-judge` (latency keeps groups in flight at the kill) and
# `genrm-trio serve --state PATH` against it, both on 127.0.0.1 with free ports.


def _spawn(argv: list[str], log: Path) -> Any:
    import subprocess

    with log.open("ab") as stderr:
        return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=stderr)


@asynccontextmanager
async def _process(argv: list[str], log: Path) -> AsyncIterator[Any]:
    proc = _spawn(argv, log)
    try:
        assert proc.stdout is not None
        with trio.fail_after(30):
            line = await trio.to_thread.run_sync(proc.stdout.readline, abandon_on_cancel=True)
        assert line.startswith(b"listening on "), (line, first_bytes(log, 10_000))
        proc.url = line.decode().split()[-1]
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        await trio.to_thread.run_sync(proc.wait)
        if proc.stdout is not None:
            proc.stdout.close()


@asynccontextmanager
async def sim_judge_process(latency_ms: int, log: Path) -> AsyncIterator[Any]:
    argv = [*command(), "sim-judge", "--port", "0", "--latency-ms", str(latency_ms)]
    async with _process(argv, log) as proc:
        yield proc


@asynccontextmanager
async def server_process(path: Path, judge_url: str, log: Path) -> AsyncIterator[Any]:
    config = path.with_suffix(".yaml")
    config.write_text("num_rollouts_per_prompt: 4\ncohort_collection_timeout_s: 30\n")
    argv = [
        *command(),
        "serve",
        "--config",
        str(config),
        "--port",
        "0",
        "--judge-url",
        f"{judge_url}/v1",
        "--judge-api",
        "genrm_model",
        "--state",
        str(path),
    ]
    async with _process(argv, log) as proc:
        yield proc


def _judge_calls(metrics: str) -> float:
    return sum(
        float(line.rpartition(" ")[2])
        for line in metrics.splitlines()
        if line.startswith("genrm_trio_judge_calls_total{")
    )


def _post(client: Any, body: Any, timeout: float) -> tuple[int, Any] | None:
    """One `/verify` over a synchronous httpx client (run in a worker thread); None when the
    connection failed or timed out. Synchronous because an async request interrupted mid-send
    by the kill leaves httpx's body generator unclosed (a ResourceWarning at GC)."""
    import httpx

    try:
        response = client.post("/verify", json=body, timeout=timeout)
    except httpx.HTTPError:
        return None
    return response.status_code, response.json()


@pytest.mark.slow
async def test_every_reply_sent_before_sigkill_replays_after_restart(tmp_path: Path) -> None:
    """SIGKILL mid-run: every reply sent before the kill replays identically after a restart on
    the same state file, with zero judge calls; unanswered groups replay or are fenced."""
    import signal

    import httpx

    from genrm_trio.app.bench import verify_body

    path, log = tmp_path / "state.db", tmp_path / "server.log"
    groups, n = 16, 4
    bodies = {
        (g, i): verify_body(
            task=g,
            rollout=i,
            group_id=f"run-{g}",
            attempt=0,
            prompt=f"task {g}",
            answer=f"a{g}-{i}",
        )
        for g in range(groups)
        for i in range(n)
    }
    answered: dict[tuple[int, int], tuple[int, Any]] = {}
    done_groups = trio.Event()
    threads = trio.CapacityLimiter(groups * n)
    limits = httpx.Limits(max_connections=groups * n)

    async with (
        sim_judge_process(200, log) as judge,
        server_process(path, judge.url, log) as proc,
    ):
        with httpx.Client(base_url=proc.url, limits=limits, trust_env=False) as client:

            async def send(key: tuple[int, int]) -> None:
                reply = await trio.to_thread.run_sync(
                    _post, client, bodies[key], 30.0, limiter=threads
                )
                if reply is None:
                    return  # in flight at the kill
                answered[key] = reply
                if len({g for g, _ in answered if all((g, i) in answered for i in range(n))}) >= 4:
                    done_groups.set()

            async with trio.open_nursery() as nursery:
                for g in range(groups):
                    for i in range(n):
                        nursery.start_soon(send, (g, i))
                    await trio.sleep(0.02)
                with trio.fail_after(LIMIT_S):
                    await done_groups.wait()
                proc.send_signal(signal.SIGKILL)
        assert await trio.to_thread.run_sync(proc.wait) == -signal.SIGKILL

    assert answered and all(status == 200 for status, _ in answered.values())
    pending = sorted(set(range(groups)) - {g for g, _ in answered})
    replayed = interrupted = 0
    async with sim_judge_process(0, log) as judge, server_process(path, judge.url, log) as proc:
        with httpx.Client(base_url=proc.url, trust_env=False) as client:
            for key, reply in sorted(answered.items()):
                again = await trio.to_thread.run_sync(_post, client, bodies[key], 10.0)
                assert again == reply, key
            for g in pending:
                # Committed but unsent replies replay; open cohorts are fenced. A group whose
                # first request never got committed would start anew: give up on it quickly.
                again = await trio.to_thread.run_sync(_post, client, bodies[(g, 0)], 0.5)
                if again is None:
                    continue
                if again[0] == 200:
                    replayed += 1
                else:
                    assert again[0] == 503, again
                    assert "was interrupted by a server restart" in again[1]["detail"]
                    interrupted += 1
            metrics = await trio.to_thread.run_sync(client.get, "/metrics")
            assert _judge_calls(metrics.text) == 0
    assert interrupted, (pending, replayed)


# --- the in-memory mirrors match the file ------------------------------------------------------


@pytest.mark.parametrize("seed", range(6))
async def test_random_commits_keep_counts_and_file_in_step(tmp_path: Path, seed: int) -> None:
    """Random opens, terminals (kept or not), watermarks, failing operations, clock jumps and
    concurrent batches against a tiny cap and TTL: the store's counts always equal the file's,
    and a reload returns exactly the terminal records the file holds."""
    import random

    rng = random.Random(seed)
    config = state(tmp_path, max_terminal_cohorts=5, cohort_result_ttl_s=50.0)
    wall = Wall()
    names = [explicit_key(f"k{i}") for i in range(9)]

    def terminal(key: str) -> TerminalRecord:
        kind = rng.randrange(3)
        if kind == 0:
            return failed(key)
        if kind == 1:
            return record(key)
        # a completed legacy record without masked members is not kept
        return TerminalRecord(
            key=key,
            group_id=None,
            group_attempt=0,
            legacy=True,
            prompt_digest=DIGEST,
            phase="completed",
            members={0: MemberRecord(RESPONSE, result={"reward": 1.0})},
        )

    def explode(cur: sqlite3.Cursor, now: float) -> None:
        cur.execute("INSERT INTO no_such_table VALUES (1)")

    async def one(store: Any) -> None:
        key = rng.choice(names)
        action = rng.randrange(6)
        if action == 0:
            await store.commit_open(OpenRecord(key, "g", 0, False, DIGEST))
        elif action in (1, 2):
            await store.commit_terminal(terminal(key))
        elif action == 3:
            await store.commit_watermark(WatermarkRecord(f"w{rng.randrange(8)}", 0, DIGEST))
        elif action == 4:
            with pytest.raises(StoreError):
                await store._enqueue(explode).wait()
        else:
            wall.now += rng.choice([1.0, 30.0, -5.0])

    def counted() -> tuple[int, int]:
        with rows(path_of(config), "SELECT count(*) FROM cohorts WHERE terminal_at NOT NULL") as t:
            terminal_rows = t[0][0]
        with rows(path_of(config), "SELECT count(*) FROM watermarks") as w:
            return terminal_rows, w[0][0]

    with trio.fail_after(LIMIT_S):
        async with open_store(path_of(config), config, clock=wall) as store:
            for _ in range(25):
                async with trio.open_nursery() as nursery:  # several share one transaction
                    for _ in range(rng.randrange(1, 5)):
                        nursery.start_soon(one, store)
                stats = store.statistics()
                assert (stats.terminal_records, stats.watermarks) == counted()
        async with open_store(path_of(config), config, clock=wall) as store:
            loaded = await store.load()
            stats = store.statistics()
            assert (stats.terminal_records, stats.watermarks) == counted()
    with rows(path_of(config), "SELECT key FROM cohorts WHERE terminal_at NOT NULL") as found:
        assert sorted(bytes(k).decode() for (k,) in found) == sorted(r.key for r in loaded.records)
