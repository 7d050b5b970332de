"""Durable commit points without the registry lock (docs/architecture.md).

The engine queues the watermark and ``open`` commits while it holds its registry lock and waits
for them after releasing it. These tests drive it with :class:`FifoStore`, a fake store that
applies queued commits in submission order, grouped into transactions of controllable virtual
latency, and that can be stalled with a gate.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import pytest
import trio
import trio.testing
from judges import ScriptedJudge, gather, hang, member, running, settings, verify
from trio.testing import MockClock

from genrm_trio.domain.model import GroupFailed, Rejection, RequestRejected, Scored
from genrm_trio.domain.records import MemberRecord, OpenRecord, TerminalRecord, WatermarkRecord
from genrm_trio.store.protocol import CommitsBySubmit, QueuedCohortStore, SerialCommits, queued

DIGEST = "d" * 64

Record = WatermarkRecord | OpenRecord | TerminalRecord


class FifoStore(CommitsBySubmit):
    """A :class:`QueuedCohortStore` that applies commits in order, one transaction at a time.

    A transaction takes everything queued when it starts and lasts ``delay`` virtual seconds;
    it starts only while ``gate`` is set. ``fail`` names commit kinds that fail.
    """

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay
        self.gate = trio.Event()
        self.gate.set()
        self.fail: set[str] = set()
        self.queued: list[tuple[str, Any, int]] = []
        self.applied: list[tuple[str, Any]] = []
        self.errors: dict[int, Exception] = {}
        self.transactions: list[list[str]] = []
        self.many_calls = 0
        self._submitted = 0
        self._busy = False
        self._changed = trio.Event()

    def kinds(self) -> list[str]:
        return [kind for kind, _ in self.applied]

    def _submit(self, kind: str, record: Any) -> _FifoCommit:
        self._submitted += 1
        self.queued.append((kind, record, self._submitted))
        return _FifoCommit(self, self._submitted)

    def submit_watermark(self, record: WatermarkRecord) -> _FifoCommit:
        return self._submit("watermark", record)

    def submit_open(self, record: OpenRecord) -> _FifoCommit:
        return self._submit("open", record)

    def submit_terminal(self, record: TerminalRecord) -> _FifoCommit:
        return self._submit("terminal", record)

    async def commit_many(
        self, records: Sequence[TerminalRecord], watermarks: Sequence[WatermarkRecord] = ()
    ) -> None:
        self.many_calls += 1
        await self._submit("many", (list(records), list(watermarks))).wait()

    async def _through(self, seq: int) -> None:
        with trio.CancelScope(shield=True):
            while len(self.applied) < seq:
                if self._busy:
                    await self._changed.wait()
                    continue
                self._busy = True
                try:
                    await self.gate.wait()
                    batch, self.queued = self.queued, []
                    await trio.sleep(self.delay)
                    for kind, record, n in batch:
                        if kind in self.fail:
                            self.errors[n] = RuntimeError(f"{kind} commit failed")
                        self.applied.append((kind, record))
                    self.transactions.append([kind for kind, _, _ in batch])
                finally:
                    self._busy = False
                    changed, self._changed = self._changed, trio.Event()
                    changed.set()
        if seq in self.errors:
            raise self.errors[seq]


class _FifoCommit:
    def __init__(self, store: FifoStore, seq: int) -> None:
        self.store = store
        self.seq = seq

    async def wait(self) -> None:
        await self.store._through(self.seq)


def test_fifo_store_is_a_queued_store() -> None:
    store = FifoStore()
    assert isinstance(store, QueuedCohortStore)
    assert queued(store, timeout_s=10.0) is store


@contextmanager
def stalled(store: FifoStore) -> Iterator[None]:
    """Stall the store's transactions inside the block; reopened on the way out, so that a
    failing assertion never leaves a shielded commit waiting forever."""
    store.gate = trio.Event()
    try:
        yield
    finally:
        store.gate.set()


# --- commit point 1: the watermark before the advancing request is attached ----------------------


async def test_watermark_commit_completes_before_the_advancing_request_attaches(
    autojump_clock: MockClock,
) -> None:
    store = FifoStore()
    judge = ScriptedJudge()
    async with running(settings(), judge, store=store) as engine, trio.open_nursery() as nursery:
        with stalled(store):
            nursery.start_soon(verify, engine, member(0))
            await trio.testing.wait_all_tasks_blocked()
            stats = engine.statistics()
            assert stats.watermarks == 1 and stats.active_cohorts == 1  # decided under the lock
            assert stats.waiters == 0  # ... but not attached: its commits are pending
            assert [v.members_present for v in engine.active_cohorts()] == [0]
            assert store.applied == [] and [k for k, _, _ in store.queued] == ["watermark", "open"]
        await trio.testing.wait_all_tasks_blocked()
        assert store.kinds() == ["watermark", "open"]
        assert engine.statistics().waiters == 1
        await engine.aclose()


async def test_a_replay_waits_for_no_commit(autojump_clock: MockClock) -> None:
    store = FifoStore(delay=0.05)
    async with running(settings(), ScriptedJudge(), store=store) as engine:
        t0 = trio.current_time()
        replies = await gather(engine, [member(0), member(1)])
        assert all(isinstance(r, Scored) for r in replies)
        # a replay neither advances the watermark nor creates a cohort: no commit to wait for
        t1 = trio.current_time()
        assert isinstance(await verify(engine, member(0, attempt=0)), Scored)
        assert trio.current_time() == t1 > t0


# --- commit point 2: members wait for the cohort's open record ---------------------------------


async def test_a_member_attaches_only_after_the_pending_open_commit(
    autojump_clock: MockClock,
) -> None:
    store = FifoStore()
    judge = ScriptedJudge()
    replies: list[object] = []

    async def send(i: int) -> None:
        replies.append(await verify(engine, member(i)))

    async with running(settings(), judge, store=store) as engine, trio.open_nursery() as nursery:
        with stalled(store):
            nursery.start_soon(send, 0)
            await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(send, 1)  # the cohort exists; its open record is not committed
            await trio.testing.wait_all_tasks_blocked()
            assert engine.statistics().waiters == 0
            assert [v.members_present for v in engine.active_cohorts()] == [0]
            assert judge.calls == []
    assert len(replies) == 2 and all(isinstance(r, Scored) for r in replies)
    assert store.kinds() == ["watermark", "open", "terminal"]


async def test_commits_reach_the_store_as_watermark_open_terminal(
    autojump_clock: MockClock,
) -> None:
    store = FifoStore(delay=0.01)
    config = settings(num_rollouts_per_prompt=4)
    async with running(config, ScriptedJudge(), store=store) as engine:
        groups = [[member(i, group=f"g{g}") for i in range(4)] for g in range(6)]
        async with trio.open_nursery() as nursery:
            for items in groups:
                nursery.start_soon(gather, engine, items)
    assert len(store.applied) == 18
    seen: dict[str, list[str]] = {}
    for kind, record in store.applied:
        group_id = record.group_id
        seen.setdefault(group_id, []).append(kind)
    assert all(kinds == ["watermark", "open", "terminal"] for kinds in seen.values()), seen
    assert len(store.transactions) < 18  # concurrent groups share transactions


# --- the lock is free while a commit is pending -------------------------------------------------


async def test_other_requests_are_not_blocked_by_a_pending_commit(
    autojump_clock: MockClock,
) -> None:
    store = FifoStore()
    async with (
        running(settings(), ScriptedJudge(), store=store) as engine,
        trio.open_nursery() as nursery,
    ):
        done = await gather(engine, [member(0, group="done"), member(1, group="done")])
        with stalled(store):
            nursery.start_soon(verify, engine, member(0, group="slow"))
            await trio.testing.wait_all_tasks_blocked()
            t0 = trio.current_time()
            # another group resolves (its cohort is registered) while the first commit is pending
            nursery.start_soon(verify, engine, member(0, group="other"))
            await trio.testing.wait_all_tasks_blocked()
            assert {v.group_id for v in engine.active_cohorts()} == {"slow", "other"}
            # requests that need no commit are answered at once
            assert await verify(engine, member(0, group="done")) == done[0]
            rejected = await verify(engine, member(0, group="slow", prompt="Other"))
            assert isinstance(rejected, RequestRejected) and rejected.reason is Rejection.CONFLICT
            assert trio.current_time() == t0
            assert store.applied[-1][0] == "terminal"  # nothing new committed yet
        await trio.testing.wait_all_tasks_blocked()
        assert engine.statistics().waiters == 2
        await engine.aclose()


# --- supersession while a commit is pending -----------------------------------------------------


async def test_supersession_during_a_pending_open_commit(autojump_clock: MockClock) -> None:
    store = FifoStore()
    judge = ScriptedJudge()
    out: dict[str, object] = {}

    async def send(name: str, item: Any) -> None:
        out[name] = await verify(engine, item)

    async with running(settings(), judge, store=store) as engine:
        async with trio.open_nursery() as nursery:
            with stalled(store):
                nursery.start_soon(send, "old", member(0, attempt=0))
                await trio.testing.wait_all_tasks_blocked()
                nursery.start_soon(send, "new0", member(0, attempt=1))
                nursery.start_soon(send, "new1", member(1, attempt=1))
                await trio.testing.wait_all_tasks_blocked()
                [active] = engine.active_cohorts()  # the old cohort failed in memory at once
                assert active.group_attempt == 1
        assert out["old"] == GroupFailed(
            "cohort", "GenRM group 'g' attempt 0 was superseded by attempt 1", "superseded"
        )
        assert isinstance(out["new0"], Scored) and isinstance(out["new1"], Scored)
    order = [
        (kind, getattr(record, "group_attempt", getattr(record, "latest_attempt", None)))
        for kind, record in store.applied
    ]
    assert order[:4] == [("watermark", 0), ("open", 0), ("watermark", 1), ("open", 1)]
    assert sorted(order[4:]) == [("terminal", 0), ("terminal", 1)]
    terminals = {r.group_attempt: r.phase for k, r in store.applied if k == "terminal"}
    assert terminals == {0: "failed", 1: "completed"}


# --- a failed commit ----------------------------------------------------------------------------


async def test_a_failed_open_commit_fails_the_cohort(autojump_clock: MockClock) -> None:
    store = FifoStore()
    store.fail.add("open")
    judge = ScriptedJudge()
    out: dict[int, object] = {}

    async def send(i: int) -> None:
        try:
            out[i] = await engine.verify(member(i))
        except RuntimeError as error:
            out[i] = error

    async with running(settings(), judge, store=store) as engine:
        async with trio.open_nursery() as nursery:
            with stalled(store):
                nursery.start_soon(send, 0)
                await trio.testing.wait_all_tasks_blocked()
                nursery.start_soon(send, 1)
                await trio.testing.wait_all_tasks_blocked()
        assert isinstance(out[0], RuntimeError)  # the creator gets the store's error (a 500)
        failure = out[1]
        assert isinstance(failure, GroupFailed) and failure.kind == "cohort"
        assert "GenRM durable store could not record cohort" in failure.message
    assert judge.calls == []
    assert store.kinds() == ["watermark", "open", "terminal"]


# --- the serial adapter for stores with plain hooks ----------------------------------------------


class SlowHooks:
    def __init__(self) -> None:
        self.events: list[str] = []

    async def commit_watermark(self, record: WatermarkRecord) -> None:
        await trio.sleep(0.03)
        self.events.append(f"watermark {record.group_id}")

    async def commit_open(self, record: OpenRecord) -> None:
        await trio.sleep(0.01)
        self.events.append(f"open {record.group_id}")

    async def commit_terminal(self, record: TerminalRecord) -> None:
        await trio.sleep(0.0)
        self.events.append(f"terminal {record.group_id}")


async def test_serial_commits_run_hooks_in_submission_order(autojump_clock: MockClock) -> None:
    hooks = SlowHooks()
    store = queued(hooks, timeout_s=10.0)
    assert isinstance(store, SerialCommits)
    first = store.submit_watermark(WatermarkRecord("a", 0, DIGEST))
    second = store.submit_open(OpenRecord("k", "b", 0, False, DIGEST))
    third = store.submit_terminal(
        TerminalRecord("k", "c", 0, False, DIGEST, "failed", "x", "judge")
    )
    await third.wait()  # drives the earlier, un-waited ones first
    assert hooks.events == ["watermark a", "open b", "terminal c"]
    await first.wait()
    await second.wait()


# --- restore: one transaction ---------------------------------------------------------------------


def _completed(key: str, group: str) -> TerminalRecord:
    return TerminalRecord(
        key=key,
        group_id=group,
        group_attempt=0,
        legacy=False,
        prompt_digest=DIGEST,
        phase="completed",
        members={0: MemberRecord("r", result={"reward": 1.0})},
    )


async def test_restore_commits_everything_in_one_commit_many(autojump_clock: MockClock) -> None:
    store = FifoStore(delay=0.01)
    records = [_completed(f"group_id::g{n}::group_attempt::0", f"g{n}") for n in range(3)]
    marks = [WatermarkRecord(f"g{n}", 0, DIGEST) for n in range(3)]
    async with running(settings(), ScriptedJudge(), store=store) as engine:
        report = await engine.restore_records([*records, records[0]], marks)
        assert (report.added, report.unchanged, report.watermarks_updated) == (3, 1, 3)
        assert store.many_calls == 1 and store.transactions == [["many"]]
        [(_, (committed, committed_marks))] = store.applied
        assert committed == records and committed_marks == marks
        await engine.aclose()


async def test_a_failed_restore_commit_applies_nothing(autojump_clock: MockClock) -> None:
    store = FifoStore()
    store.fail.add("many")
    async with running(settings(), ScriptedJudge(), store=store) as engine:
        with pytest.raises(RuntimeError):
            await engine.restore_records(
                [_completed("group_id::g::group_attempt::0", "g")],
                [WatermarkRecord("g", 0, DIGEST)],
            )
        stats = engine.statistics()
        assert (stats.cohorts, stats.watermarks) == (0, 0)


# --- restore: a raised watermark supersedes the group's active older attempt ---------------------


@pytest.mark.parametrize("durable", [False, True], ids=["memory", "store"])
async def test_a_restore_that_raises_a_watermark_supersedes_the_active_older_attempt(
    autojump_clock: MockClock, durable: bool
) -> None:
    """Attempt 0 of group g collects (two of three members in, their eager comparison at the
    judge) when a checkpoint holding attempt 1 is restored: attempt 0 fails as superseded at
    once, as a request for attempt 1 would fail it. With the store each commit (the request's
    watermark and open, the restore's one transaction, the terminal record) takes 0.25 s."""
    store = FifoStore(delay=0.25) if durable else None
    judge = ScriptedJudge(pairs={("a0", "a1"): hang()})
    config = settings(
        num_rollouts_per_prompt=3,
        cohort_collection_timeout_s=1800.0,
        judge_request_timeout_s=600.0,
    )
    commit = 0.25 if durable else 0.0
    t0 = trio.current_time()
    replies: dict[int, object] = {}
    at: dict[int, float] = {}
    async with running(config, judge, store=store) as engine:
        async with trio.open_nursery() as nursery:

            async def send(index: int) -> None:
                replies[index] = await verify(engine, member(index))
                at[index] = trio.current_time() - t0

            for index in (0, 1):
                nursery.start_soon(send, index)
            await trio.sleep(1.0)
            [call] = judge.calls
            assert (call.shown, call.started - t0) == (("a0", "a1"), commit)
            [mark] = engine.watermark_records()
            newer = TerminalRecord(
                key="group_id::g::group_attempt::1",
                group_id="g",
                group_attempt=1,
                legacy=False,
                prompt_digest=mark.prompt_digest,
                phase="completed",
                members={i: MemberRecord(f"r{i}", result={"reward": 1.0}) for i in range(3)},
            )
            report = await engine.restore_records(
                [newer], [WatermarkRecord("g", 1, mark.prompt_digest)]
            )
            assert trio.current_time() - t0 == 1.0 + commit
            assert (report.added, report.watermarks_updated, report.superseded) == (1, 1, 1)
            assert report.conflicts == []
        superseded = "GenRM group 'g' attempt 0 was superseded by attempt 1"
        assert replies == {
            0: GroupFailed("cohort", superseded, "superseded"),
            1: GroupFailed("cohort", superseded, "superseded"),
        }
        # the waiters: at once (after the terminal record's commit), not at the collection deadline
        assert at == {0: 1.0 + 2 * commit, 1: 1.0 + 2 * commit}
        assert call.cancelled and call.cancelled_at is not None
        assert call.cancelled_at - t0 == 1.0 + commit  # the eager call hung up with the restore
        late = await verify(engine, member(2))
        assert isinstance(late, RequestRejected) and late.reason is Rejection.CONFLICT
        assert late.detail == superseded
        assert engine.statistics().active_cohorts == 0
        assert len(judge.calls) == 1
        if store is not None:
            assert store.kinds() == ["watermark", "open", "many", "terminal"]
            assert store.applied[-1][1].failure == superseded
        again = await engine.restore_records([newer], [WatermarkRecord("g", 1, mark.prompt_digest)])
        assert (again.unchanged, again.watermarks_updated, again.superseded) == (1, 0, 0)
