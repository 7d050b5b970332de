"""Retention with ordered indexes (docs/durable-state.md, D21), identity, statistics, restore."""

from __future__ import annotations

import pytest
import trio
from judges import ScriptedJudge, gather, member, running, settings, verify
from trio.testing import MockClock

from genrm_trio import EngineStatistics, Scored
from genrm_trio.domain.model import Rejection, RequestRejected
from genrm_trio.domain.records import MemberRecord, TerminalRecord, WatermarkRecord
from genrm_trio.engine.cohort import Cohort


async def complete(engine: object, group: str) -> None:
    replies = await gather(engine, [member(0, group=group), member(1, group=group)])  # type: ignore[arg-type]
    assert all(isinstance(r, Scored) for r in replies)


async def test_terminal_records_are_bounded_and_expire(autojump_clock: MockClock) -> None:
    config = settings(max_terminal_cohorts=2, cohort_result_ttl_s=10.0)
    judge = ScriptedJudge()
    async with running(config, judge) as engine:
        for group in ("one", "two", "three"):
            await complete(engine, group)
            await trio.sleep(1.0)
        await verify(engine, member(0, group="four", attempt=0))  # resolution prunes
        assert [r.group_id for r in engine.terminal_records()] == ["three", "four"]
        assert len(judge.calls) == 6
        await trio.sleep(20.0)
        await verify(engine, member(0, group="five"))
        stats = engine.statistics()
        assert stats.terminal_records == 1  # only "five" (failed at its own deadline) remains
        assert stats.watermarks == 1


async def test_count_cap_keeps_the_newest(autojump_clock: MockClock) -> None:
    config = settings(max_terminal_cohorts=2, cohort_result_ttl_s=None)
    judge = ScriptedJudge()
    async with running(config, judge) as engine:
        for group in ("one", "two", "three"):
            await complete(engine, group)
        await complete(engine, "four")
        assert [r.group_id for r in engine.terminal_records()] == ["three", "four"]
        assert sorted(w.group_id for w in engine.watermark_records()) == ["four", "three"]
        # an evicted group's replay is a new cohort now (callers use fresh group ids or attempts)
        await complete(engine, "one")
        assert len(judge.calls) == 10


async def test_watermarks_of_active_groups_are_never_pruned(autojump_clock: MockClock) -> None:
    config = settings(max_terminal_cohorts=1, cohort_result_ttl_s=0.5)
    judge = ScriptedJudge()
    async with running(config, judge) as engine, trio.open_nursery() as nursery:
        nursery.start_soon(verify, engine, member(0, group="active"))
        await trio.testing.wait_all_tasks_blocked()
        await trio.sleep(0.6)  # past the TTL, still collecting (deadline 1.0)
        await complete(engine, "done")
        # over the cap (1) and past the TTL, yet the active group keeps its watermark; the idle
        # one is dropped instead
        assert [w.group_id for w in engine.watermark_records()] == ["active"]
        await trio.sleep(0.6)  # "active" has failed at 1.0 and is idle now, past its TTL
        nursery.start_soon(verify, engine, member(0, group="late"))
        await trio.testing.wait_all_tasks_blocked()
        assert [w.group_id for w in engine.watermark_records()] == ["late"]
        await engine.aclose()


async def test_replay_refreshes_watermark_but_not_terminal_clock(
    autojump_clock: MockClock,
) -> None:
    config = settings(cohort_result_ttl_s=10.0)
    judge = ScriptedJudge()
    async with running(config, judge) as engine:
        await complete(engine, "g")
        for _ in range(3):
            await trio.sleep(3.0)
            assert isinstance(await verify(engine, member(0, group="g")), Scored)
        await trio.sleep(2.0)  # terminal record is 11 s old; watermark refreshed 2 s ago
        reply = await verify(engine, member(0, group="g"))
        # the record expired: a new cohort collects and times out; the watermark survived
        assert not isinstance(reply, Scored)
        assert len(judge.calls) == 2


async def test_index_heaps_stay_bounded_under_churn(autojump_clock: MockClock) -> None:
    config = settings(max_terminal_cohorts=8, cohort_result_ttl_s=None)
    judge = ScriptedJudge()
    async with running(config, judge) as engine:
        for i in range(60):
            await complete(engine, f"g{i % 12}" if i < 12 else f"h{i}")
            await verify(engine, member(0, group=f"h{i}"))  # replays push watermark entries
        registry = engine._registry
        stats = registry.statistics()
        assert stats.terminal_records == 8 and stats.watermarks == 8
        assert stats.terminal_index <= 2 * 8 + 64 + 1
        assert stats.watermark_index <= 2 * 8 + 64 + 1


async def test_statistics_is_a_frozen_snapshot(autojump_clock: MockClock) -> None:
    async with running(settings(), ScriptedJudge()) as engine:
        stats = engine.statistics()
        assert isinstance(stats, EngineStatistics)
        with pytest.raises(AttributeError):
            stats.cohorts = 3  # type: ignore[misc]
        assert stats.judge.in_flight == 0


async def test_restore_conflicts_and_watermarks(autojump_clock: MockClock) -> None:
    judge = ScriptedJudge()
    async with running(settings(), judge) as engine:
        await complete(engine, "g")
        [record] = engine.terminal_records()
        other = TerminalRecord(
            key=record.key,
            group_id="g",
            group_attempt=0,
            legacy=False,
            prompt_digest=record.prompt_digest,
            phase="failed",
            failure="x",
            failure_kind="cohort",
        )
        report = await engine.restore_records(
            [other],
            [
                WatermarkRecord("g", 5, "0" * 64),
                WatermarkRecord("new", 2, record.prompt_digest),
            ],
        )
        assert report.added == 0 and report.watermarks_updated == 1
        assert report.conflicts == [
            {"key": record.key, "reason": "different record"},
            {"group_id": "g", "reason": "different prompt digest"},
        ]
        async with trio.open_nursery() as nursery:
            nursery.start_soon(verify, engine, member(0, group="active"))
            await trio.testing.wait_all_tasks_blocked()
            active_key = engine.active_cohorts()[0].key
            report = await engine.restore_records(
                [TerminalRecord(active_key, "active", 0, False, "d" * 64, "failed", "x", "cohort")]
            )
            assert report.conflicts == [{"key": active_key, "reason": "active cohort"}]
            await engine.aclose()


async def test_restored_failed_fence_answers_without_judging(autojump_clock: MockClock) -> None:
    judge = ScriptedJudge()
    async with running(settings(), judge) as engine:
        fence = TerminalRecord(
            key="group_id::g::group_attempt::0",
            group_id="g",
            group_attempt=0,
            legacy=False,
            prompt_digest=engine_digest(),
            phase="failed",
            failure="GenRM cohort 'k' was interrupted by a server restart",
            failure_kind="cohort",
        )
        await engine.restore_records([fence])
        reply = await verify(engine, member(1))
        assert reply == fence_outcome(fence)
    assert judge.calls == []


def engine_digest() -> str:
    from genrm_trio.domain.text import prompt_digest

    return prompt_digest("Hello", None)


def fence_outcome(record: TerminalRecord) -> object:
    from genrm_trio.domain.model import GroupFailed

    assert record.failure is not None and record.failure_kind is not None
    return GroupFailed(record.failure_kind, record.failure)


def test_member_record_holds_exactly_one_outcome() -> None:
    with pytest.raises(ValueError):
        MemberRecord("d", result=None, masked_alone=False)
    with pytest.raises(ValueError):
        MemberRecord("d", result={"reward": 1.0}, masked_alone=True, failure_reason="r")
    with pytest.raises(ValueError):
        MemberRecord("d", masked_alone=True)
    assert MemberRecord("d", masked_alone=True, failure_reason="r").masked_alone


def test_terminal_record_retention_rule() -> None:
    scored = {0: MemberRecord("d", result={"reward": 1.0})}
    masked = {0: MemberRecord("d", masked_alone=True, failure_reason="r")}
    legacy_scored = TerminalRecord("k", None, 0, True, "p", "completed", members=scored)
    legacy_masked = TerminalRecord("k", None, 0, True, "p", "completed", members=masked)
    legacy_failed = TerminalRecord("k", None, 0, True, "p", "failed", "x", "judge")
    assert not legacy_scored.retained and legacy_scored.state == "scored"
    assert legacy_masked.retained and legacy_masked.state == "partially_masked"
    assert legacy_failed.retained and legacy_failed.state == "failed"


def test_cohorts_have_identity_equality() -> None:
    class Host:
        def cohort_state_changed(self, cohort: Cohort, source: str, dest: str) -> None:
            pass

        def cohort_terminal(self, cohort: Cohort) -> None:
            pass

    async def main() -> None:
        def make() -> Cohort:
            return Cohort(
                key="k",
                group_id="g",
                group_attempt=0,
                prompt_digest="d",
                size=2,
                history=[],
                principle=None,
                baseline=None,
                baseline_digest=None,
                rubric_ids=None,
                created_at=0.0,
                collect_deadline=1.0,
                host=Host(),
            )

        a, b = make(), make()
        assert a != b and a == a and len({a, b}) == 2

    trio.run(main)


async def test_capacity_error_is_not_raised_for_replays(autojump_clock: MockClock) -> None:
    config = settings(server={"max_active_cohorts": 1})
    judge = ScriptedJudge()
    async with running(config, judge) as engine:
        await complete(engine, "g")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(verify, engine, member(0, group="busy"))
            await trio.testing.wait_all_tasks_blocked()
            assert isinstance(await verify(engine, member(0, group="g")), Scored)
            reply = await verify(engine, member(0, group="other"))
            assert isinstance(reply, RequestRejected) and reply.reason is Rejection.UNAVAILABLE
            await engine.aclose()


async def test_new_slot_on_a_completed_record_is_409_in_wire_words(
    autojump_clock: MockClock,
) -> None:
    """Unreachable for a cohort that collected all N slots, but a restored record may hold only
    some members: a new slot gets `already completed` (the wire word, not `scored`)."""
    judge = ScriptedJudge()
    async with running(settings(), judge) as engine:
        key = "group_id::g::group_attempt::0"
        record = TerminalRecord(
            key,
            "g",
            0,
            False,
            engine_digest(),
            "completed",
            members={0: MemberRecord("d", result={"reward": 1.0})},
        )
        await engine.restore_records([record])
        reply = await verify(engine, member(1))
        assert isinstance(reply, RequestRejected) and reply.reason is Rejection.CONFLICT
        assert reply.detail == (
            f"GenRM cohort {key!r} is already completed; rollout_index=1 cannot be added"
        )
    assert judge.calls == []


async def test_restored_records_can_be_back_dated(autojump_clock: MockClock) -> None:
    """A store loading records gives them clocks set back by their age."""
    judge = ScriptedJudge()
    config = settings(cohort_result_ttl_s=10.0)
    async with running(config, judge) as engine:
        await complete(engine, "old")
        await complete(engine, "young")
        records = engine.terminal_records()
    async with running(config, judge) as engine:
        ages = {records[0].key: 9.5, records[1].key: 1.0}
        report = await engine.restore_records(records, age_s=ages)
        assert report.added == 2
        await trio.sleep(1.0)
        assert isinstance(await verify(engine, member(0, group="young")), Scored)
        assert [r.group_id for r in engine.terminal_records()] == ["young"]
    assert len(judge.calls) == 4


async def test_restored_watermarks_can_be_back_dated(autojump_clock: MockClock) -> None:
    judge = ScriptedJudge()
    config = settings(cohort_result_ttl_s=10.0)
    marks = [WatermarkRecord("old", 3, "d" * 64), WatermarkRecord("young", 3, "d" * 64)]
    async with running(config, judge) as engine:
        report = await engine.restore_records([], marks, watermark_age_s={"old": 9.5})
        assert report.watermarks_updated == 2
        await trio.sleep(1.0)
        engine._registry.prune(trio.current_time())
        assert [w.group_id for w in engine.watermark_records()] == ["young"]
