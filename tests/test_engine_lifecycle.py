"""Deadlines, disconnects, shutdown, non-judge failures and durable commit order."""

from __future__ import annotations

import logging
import math
from typing import Any

import pytest
import trio
import trio.testing
from judges import (
    ScriptedJudge,
    Step,
    assert_no_leaks,
    boom,
    gather,
    hang,
    member,
    running,
    settings,
    verify,
)
from trio.testing import MockClock

from genrm_trio.domain.model import GroupFailed, Rejection, RequestRejected, Scored
from genrm_trio.domain.records import OpenRecord, TerminalRecord, WatermarkRecord
from genrm_trio.engine import group_run
from genrm_trio.engine.engine import open_engine

KEY = "group_id::g::group_attempt::0"


def did_not_collect(key: str = KEY, n: int = 2, timeout: float = 1.0) -> str:
    return f"GenRM cohort {key!r} did not collect {n} unique rollout indices within {timeout}s"


# --- collection deadline ------------------------------------------------------------------------


async def test_incomplete_cohort_times_out_and_releases_waiters(autojump_clock: MockClock) -> None:
    judge = ScriptedJudge()
    t0 = trio.current_time()
    async with running(settings(), judge) as engine:
        reply = await verify(engine, member(0))
        assert trio.current_time() - t0 == pytest.approx(1.0)
        assert reply == GroupFailed("cohort", did_not_collect())
        stats = engine.statistics()
        assert stats.cohorts_by_state == {"failed": 1}
        assert stats.running_tasks == 0 and stats.waiters == 0
        assert engine.metrics.deadline_failures.labels("collection")._value.get() == 1
    assert judge.calls == []


async def test_abandoned_group_expires_without_another_request(autojump_clock: MockClock) -> None:
    judge = ScriptedJudge()
    async with running(settings(), judge) as engine:
        with trio.move_on_after(0.3):
            await verify(engine, member(0))  # the client disconnects at 0.3
        [view] = engine.active_cohorts()
        assert view.members_present == 1 and view.deadline == "collection"
        assert view.deadline_s_left == pytest.approx(0.7)
        assert engine.statistics().waiters == 0
        await trio.sleep(1.0)
        assert engine.active_cohorts() == []
        assert engine.statistics().cohorts_by_state == {"failed": 1}
        # the late member gets the original failure, without judging
        assert await verify(engine, member(1, answer="new")) == GroupFailed(
            "cohort", did_not_collect()
        )
    assert judge.calls == []


@pytest.mark.parametrize("late_index", [0, 1])
async def test_late_member_receives_original_timeout_failure(
    autojump_clock: MockClock, late_index: int
) -> None:
    judge = ScriptedJudge()
    async with running(settings(), judge) as engine:
        first = await verify(engine, member(0))
        late = await verify(engine, member(late_index, answer="regenerated"))
        assert late == first == GroupFailed("cohort", did_not_collect())
    assert judge.calls == []


@pytest.mark.parametrize("delay", [0.0, 0.8, 0.999, 1.0, 1.2])
async def test_final_arrival_deadline_race_is_all_or_nothing(
    autojump_clock: MockClock, delay: float
) -> None:
    judge = ScriptedJudge()
    async with running(settings(), judge) as engine:
        replies = await gather(engine, [member(0), member(1)], stagger=delay)
    kinds = {type(r) for r in replies}
    assert len(kinds) == 1, replies
    if delay < 1.0:
        assert kinds == {Scored}
    elif delay > 1.0:
        assert kinds == {GroupFailed}


@pytest.mark.parametrize("arrival_first", [True, False])
async def test_final_arrival_deadline_race_driven_deterministically(
    mock_clock: MockClock, arrival_first: bool
) -> None:
    """The two sides of the race at the collection deadline, each forced with a manual clock:
    the final member attaches just before the timer runs (every member is scored), or the timer
    runs first (every member, the final one included, gets the collection failure)."""
    judge = ScriptedJudge()
    replies: list[object] = []

    async def send(i: int) -> None:
        replies.append(await verify(engine, member(i)))

    with trio.fail_after(60):
        async with open_engine(settings(), judge) as engine, trio.open_nursery() as nursery:
            nursery.start_soon(send, 0)
            await trio.testing.wait_all_tasks_blocked()
            mock_clock.jump(1.0 - 1e-9)
            if arrival_first:
                nursery.start_soon(send, 1)
                await trio.testing.wait_all_tasks_blocked()  # attached: the cohort is judging
                mock_clock.jump(1e-9)  # the deadline passes while it judges
            else:
                mock_clock.jump(1e-9)
                await trio.testing.wait_all_tasks_blocked()  # the timer fails the cohort
                nursery.start_soon(send, 1)
            await trio.testing.wait_all_tasks_blocked()
            mock_clock.autojump_threshold = 0
    assert_no_leaks(engine, judge)
    if arrival_first:
        assert sorted(r.result["reward"] for r in replies if isinstance(r, Scored)) == [1.0, 2.0]
    else:
        assert replies == [GroupFailed("cohort", did_not_collect())] * 2
        assert judge.calls == []


async def test_duplicates_never_extend_the_collection_deadline(autojump_clock: MockClock) -> None:
    judge = ScriptedJudge()
    t0 = trio.current_time()
    async with running(settings(), judge) as engine:
        replies = await gather(engine, [member(0), member(0), member(0)], stagger=0.4)
        assert replies == [GroupFailed("cohort", did_not_collect())] * 3
        assert trio.current_time() - t0 == pytest.approx(1.0)


# --- disconnects ---------------------------------------------------------------------------------


async def test_disconnected_waiter_does_not_retire_cohort(autojump_clock: MockClock) -> None:
    judge = ScriptedJudge()
    async with running(settings(), judge) as engine:
        with trio.move_on_after(0.1):
            await verify(engine, member(0))
        stats = engine.statistics()
        assert stats.waiters == 0 and stats.active_cohorts == 1
        [view] = engine.active_cohorts()
        assert view.members_present == 1 and view.state == "collecting"
        await engine.aclose()


@pytest.mark.parametrize("during_judging", [False, True])
async def test_disconnect_reattaches_without_replacing_answer(
    autojump_clock: MockClock, during_judging: bool
) -> None:
    judge = ScriptedJudge(latency=0.1)
    async with running(settings(), judge) as engine:
        async with trio.open_nursery() as nursery:
            if during_judging:
                nursery.start_soon(verify, engine, member(1))
            with trio.move_on_after(0.05):
                await verify(engine, member(0))  # disconnects (judging already started?)
            if during_judging:
                assert engine.active_cohorts()[0].state == "judging"
            reply = await verify(engine, member(0, answer="different"))
            assert isinstance(reply, RequestRejected) and reply.reason is Rejection.CONFLICT
            assert "already has a different response for rollout_index=0" in reply.detail
            replies = await gather(engine, [member(0)] + ([] if during_judging else [member(1)]))
        assert isinstance(replies[0], Scored) and replies[0].result["reward"] == 1.0
    assert len(judge.calls) == 2


# --- evaluation deadline, shutdown ---------------------------------------------------------------


async def test_evaluation_deadline_is_separate_and_drains_comparisons(
    autojump_clock: MockClock,
) -> None:
    judge = ScriptedJudge(pairs={("a0", "a1"): hang(), ("a1", "a0"): hang()})
    config = settings(cohort_evaluation_timeout_s=0.2, judge_request_timeout_s=5.0)
    t0 = trio.current_time()
    async with running(config, judge) as engine:
        replies = await gather(engine, [member(0), member(1)], stagger=0.5)
        assert trio.current_time() - t0 == pytest.approx(0.7)
        message = "GenRM cohort evaluation deadline exceeded after 0.2s"
        assert replies == [GroupFailed("judge", message)] * 2
        assert [c.cancelled for c in judge.calls] == [True, True]
        assert engine.metrics.deadline_failures.labels("evaluation")._value.get() == 1


async def test_shutdown_fails_waiters_and_prevents_new_work(autojump_clock: MockClock) -> None:
    judge = ScriptedJudge(pairs={("a0", "a1"): hang()})
    async with running(
        settings(num_rollouts_per_prompt=3, judge_request_timeout_s=5.0), judge
    ) as engine:
        async with trio.open_nursery() as nursery:
            collecting: list[object] = []
            judging: list[object] = []

            async def send(out: list[object], item: object) -> None:
                out.append(await verify(engine, item))  # type: ignore[arg-type]

            nursery.start_soon(send, collecting, member(0, group="c"))
            for i in range(3):
                nursery.start_soon(send, judging, member(i, group="j"))
            await trio.sleep(0.1)
            await engine.aclose()
        shutting = GroupFailed("cohort", "GenRM server is shutting down", "shutting_down")
        assert collecting == [shutting] and judging == [shutting] * 3
        reply = await verify(engine, member(1, group="c"))
        assert isinstance(reply, RequestRejected) and reply.reason is Rejection.UNAVAILABLE
        assert reply.detail == "GenRM server is shutting down"
        assert_no_leaks(engine)
    assert any(c.cancelled for c in judge.calls)


# --- non-judge failures -------------------------------------------------------------------------


async def test_evaluation_failure_releases_every_waiter(
    autojump_clock: MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    judge = ScriptedJudge(pairs={("a0", "a1"): boom("bad aggregation input")})
    async with running(settings(), judge) as engine:
        replies = await gather(engine, [member(0), member(1)])
        message = "GenRM cohort evaluation failed: RuntimeError: bad aggregation input"
        assert replies == [GroupFailed("cohort", message)] * 2
        assert engine.statistics().cohorts_by_state == {"failed": 1}
    assert any(r.exc_info for r in caplog.records if "evaluation failed" in r.getMessage())


async def test_input_failure_releases_every_waiter_without_judging(
    autojump_clock: MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: object, **kwargs: object) -> str:
        raise TypeError("cannot convert response")

    # a step of every group's run (the plan itself is made once, when the engine opens)
    monkeypatch.setattr(group_run, "judge_principle", broken)
    judge = ScriptedJudge()
    async with running(settings(), judge) as engine:
        replies = await gather(engine, [member(0), member(1)])
        message = "GenRM cohort evaluation failed: TypeError: cannot convert response"
        assert replies == [GroupFailed("cohort", message)] * 2
    assert judge.calls == []


async def test_evaluation_cancellation_releases_every_waiter(autojump_clock: MockClock) -> None:
    judge = ScriptedJudge(pairs={("a0", "a1"): hang()}, latency=0.0)
    config = settings(judge_request_timeout_s=5.0)
    async with running(config, judge) as engine, trio.open_nursery() as nursery:
        replies: list[object] = []

        async def send(i: int) -> None:
            replies.append(await verify(engine, member(i)))

        nursery.start_soon(send, 0)
        nursery.start_soon(send, 1)
        await trio.sleep(0.1)
        cohort = engine._registry.get(KEY)
        assert cohort is not None and cohort.state == "judging"
        cohort.scope.cancel()  # the evaluation task is cancelled from outside
    assert replies == [GroupFailed("cohort", "GenRM cohort evaluation was cancelled")] * 2


async def test_non_finite_rewards_fail_the_cohort(
    autojump_clock: MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    from genrm_trio.domain.scoring import aggregate
    from genrm_trio.engine import evaluation

    def poisoned(*args: Any, **kwargs: Any) -> Any:
        result = aggregate(*args, **kwargs)
        result.final[0] = math.nan
        return result

    monkeypatch.setattr(evaluation, "aggregate", poisoned)
    judge = ScriptedJudge()
    async with running(settings(), judge) as engine:
        replies = await gather(engine, [member(0), member(1)])
    message = "GenRM cohort evaluation failed: ValueError: GenRM returned non-finite cohort rewards"
    assert replies == [GroupFailed("cohort", message)] * 2


async def test_inconsistent_rubric_ids_fail_the_cohort(autojump_clock: MockClock) -> None:
    judge = ScriptedJudge()
    async with running(settings(), judge) as engine, trio.open_nursery() as nursery:
        replies: list[object] = []

        async def send(i: int) -> None:
            replies.append(await verify(engine, member(i)))

        nursery.start_soon(send, 0)
        await trio.testing.wait_all_tasks_blocked()
        cohort = engine._registry.get(KEY)
        assert cohort is not None
        cohort.members[0].rubric_ids = (9,)  # cannot happen through keys; checked anyway
        nursery.start_soon(send, 1)
    message = (
        "GenRM cohort evaluation failed: ValueError: GenRM cohort members have inconsistent "
        "expected_rubric_ids"
    )
    assert replies == [GroupFailed("cohort", message)] * 2
    assert judge.calls == []


async def test_inconsistent_baselines_fail_the_cohort(autojump_clock: MockClock) -> None:
    judge = ScriptedJudge()
    # Pins that nothing is judged: member 0's comparison would start at once when eager.
    config = settings(comparison_mode="fixed_baseline", eager_comparisons=False)
    async with running(config, judge) as engine, trio.open_nursery() as nursery:
        replies: list[object] = []

        async def send(i: int) -> None:
            replies.append(await verify(engine, member(i, baseline="base")))

        nursery.start_soon(send, 0)
        await trio.testing.wait_all_tasks_blocked()
        [view] = engine.active_cohorts()
        cohort = engine._registry.get(view.key)
        assert cohort is not None
        cohort.members[0].baseline_digest = "0" * 64
        nursery.start_soon(send, 1)
    message = (
        "GenRM cohort evaluation failed: ValueError: GenRM cohort members have inconsistent "
        "baseline_response values"
    )
    assert replies == [GroupFailed("cohort", message)] * 2
    assert judge.calls == []


# --- failed legacy fences -----------------------------------------------------------------------


async def test_failed_legacy_group_fences_replacements(autojump_clock: MockClock) -> None:
    judge = ScriptedJudge()
    async with running(settings(), judge) as engine:
        first = await verify(engine, member(0, group=None))
        assert isinstance(first, GroupFailed) and first.kind == "cohort"
        assert "fresh _ng_group_id" in first.message
        later = await gather(
            engine,
            [member(0, group=None, answer="new-0"), member(1, group=None, answer="old-1")],
        )
        assert later == [first, first]
        assert judge.calls == []
        fresh = await gather(engine, [member(0, group="fresh"), member(1, group="fresh")])
        assert [r.result["reward"] for r in fresh if isinstance(r, Scored)] == [1.0, 2.0]


# --- logs ---------------------------------------------------------------------------------------


async def test_disposition_logs(
    autojump_clock: MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "genrm_trio")
    long_group = "x" * 300
    judge = ScriptedJudge()
    async with running(settings(), judge) as engine:
        await gather(engine, [member(0, group=long_group), member(1, group=long_group)])
        await verify(engine, member(0, group="lonely"))
    completed = [r for r in caplog.records if "disposition=completed" in r.getMessage()]
    failed = [r for r in caplog.records if "disposition=failed" in r.getMessage()]
    key = f"group_id::{long_group}::group_attempt::0"
    shown = f"{key[:160]!r}… ({len(key)} characters)"  # a log line shows 160 (`shown_id`)
    assert [r.levelno for r in completed] == [logging.INFO]
    assert completed[0].getMessage() == (
        f"GenRM cohort disposition=completed key={shown} attempt=0 members=2"
    )
    assert [r.levelno for r in failed] == [logging.WARNING]
    lonely = "group_id::lonely::group_attempt::0"
    assert failed[0].getMessage() == (
        f"GenRM cohort disposition=failed key={lonely!r} attempt=0 members=1 kind=cohort "
        f"reason={did_not_collect(lonely)!r}"
    )


# --- durable commit points ---------------------------------------------------------------------


class RecordingStore:
    """A store that takes virtual time to commit and records the order of events."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.events: list[tuple[str, object]] = []

    async def commit_watermark(self, record: WatermarkRecord) -> None:
        await trio.sleep(self.delay)
        self.events.append(("watermark", record))

    async def commit_open(self, record: OpenRecord) -> None:
        await trio.sleep(self.delay)
        self.events.append(("open", record))

    async def commit_terminal(self, record: TerminalRecord) -> None:
        await trio.sleep(self.delay)
        self.events.append(("terminal", record))


async def test_store_commits_before_any_waiter_is_released(autojump_clock: MockClock) -> None:
    store = RecordingStore(delay=0.05)
    judge = ScriptedJudge()
    order: list[str] = []

    async def send(i: int) -> None:
        reply = await verify(engine, member(i))
        assert isinstance(reply, Scored)
        order.append(f"reply {i}")
        store.events.append((f"reply {i}", None))

    async with running(settings(), judge, store=store) as engine:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(send, 0)
            await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(send, 1)
        replay = await verify(engine, member(0))
        assert isinstance(replay, Scored)
    kinds = [kind for kind, _ in store.events]
    assert kinds[:3] == ["watermark", "open", "terminal"]
    assert sorted(kinds[3:]) == ["reply 0", "reply 1"]
    watermark, opened, terminal = (record for _, record in store.events[:3])
    assert watermark == WatermarkRecord("g", 0, opened.prompt_digest)  # type: ignore[union-attr]
    assert opened == OpenRecord(KEY, "g", 0, False, watermark.prompt_digest)  # type: ignore[union-attr]
    assert isinstance(terminal, TerminalRecord)
    assert terminal.phase == "completed" and terminal.state == "scored"
    assert sorted(terminal.members) == [0, 1]
    assert terminal.members[0].result == replay.result


async def test_store_sees_superseded_cohort_terminal_records(autojump_clock: MockClock) -> None:
    store = RecordingStore(delay=0.0)
    judge = ScriptedJudge()
    async with (
        running(settings(), judge, store=store) as engine,
        trio.open_nursery() as nursery,
    ):
        nursery.start_soon(verify, engine, member(0))
        await trio.testing.wait_all_tasks_blocked()
        await gather(engine, [member(0, attempt=1), member(1, attempt=1)])
    terminals = [r for kind, r in store.events if kind == "terminal"]
    assert [(t.group_attempt, t.phase) for t in terminals] == [(0, "failed"), (1, "completed")]  # type: ignore[union-attr]


async def test_capacity_refuses_only_new_cohorts(autojump_clock: MockClock) -> None:
    judge = ScriptedJudge()
    config = settings(server={"max_active_cohorts": 1})
    async with running(config, judge) as engine, trio.open_nursery() as nursery:
        nursery.start_soon(verify, engine, member(0, group="one"))
        await trio.testing.wait_all_tasks_blocked()
        reply = await verify(engine, member(0, group="two"))
        assert isinstance(reply, RequestRejected) and reply.reason is Rejection.UNAVAILABLE
        assert reply.detail == "GenRM server is at capacity (1 active cohorts); retry later"
        assert reply.retry_after_s == 1.0
        assert engine.statistics().watermarks == 1  # nothing was recorded for "two"
        assert isinstance(await verify(engine, member(1, group="one")), Scored)
        # a newer attempt that supersedes the only active cohort is not refused
        nursery.start_soon(verify, engine, member(0, group="one", attempt=1))
        await trio.testing.wait_all_tasks_blocked()
        reply = await verify(engine, member(0, group="one", attempt=2))
        assert not isinstance(reply, RequestRejected) or reply.reason is not Rejection.UNAVAILABLE
        await engine.aclose()


async def test_cohort_views_oldest_first(autojump_clock: MockClock) -> None:
    judge = ScriptedJudge(pairs={("a0", "a1"): Step(delay=0.1)})
    config = settings(judge_request_timeout_s=1.0)
    async with running(config, judge) as engine, trio.open_nursery() as nursery:
        nursery.start_soon(verify, engine, member(0, group="first"))
        await trio.sleep(0.25)
        nursery.start_soon(verify, engine, member(0, group="second"))
        nursery.start_soon(verify, engine, member(1, group="second"))
        await trio.sleep(0.05)
        first, second = engine.active_cohorts()
        assert (first.group_id, first.state, first.deadline) == (
            "first",
            "collecting",
            "collection",
        )
        assert first.deadline_s_left == pytest.approx(0.7)
        # the plan is known from the first member (eager_comparisons); none is ready yet
        assert (first.comparisons_total, first.comparisons_done) == (2, 0)
        assert (second.group_id, second.state, second.deadline) == (
            "second",
            "judging",
            "evaluation",
        )
        assert second.members_present == second.members_expected == 2
        assert second.deadline_s_left == pytest.approx(0.95)
        assert (second.comparisons_total, second.comparisons_done) == (2, 1)
        assert (second.comparisons_failed, second.comparisons_pending) == (0, 1)
        await engine.aclose()
