"""Eager comparisons (`eager_comparisons`, issue #20) and the critical-path judge queue, through
the engine in virtual time: when each comparison starts, what a failure while collecting does to
the comparisons already started (the judge sees them hang up), judge failures and masking, the
deadlines, the order in which the queue hands out judge slots, `/compare`, metrics and rows, and
what a restart does with a collecting group."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from judges import (
    Reply,
    ScriptedJudge,
    Step,
    compare_input,
    hang,
    http_error,
    member,
    running,
    settings,
    verify,
)
from settings_keys import accepted_values
from trio.testing import MockClock

from genrm_trio.app.compose import durable_engine
from genrm_trio.config import Settings
from genrm_trio.domain.model import CompareResult, GroupFailed, Masked, Scored, VerifyInput
from genrm_trio.domain.text import shown_id
from genrm_trio.engine import machine
from genrm_trio.engine.engine import Engine
from genrm_trio.engine.evaluation import EAGER_RATE_KEY
from genrm_trio.judge.base import JudgeHTTPError
from genrm_trio.store.sqlite import INTERRUPTED_TEMPLATE

LONG = {"cohort_collection_timeout_s": 30.0, "cohort_evaluation_timeout_s": 30.0}


def eager(**overrides: Any) -> Settings:
    return settings(**{**LONG, "judge_request_timeout_s": 5.0, **overrides})


async def arrive(
    engine: Engine, schedule: Sequence[tuple[float, VerifyInput]]
) -> tuple[dict[int, Reply], dict[int, float]]:
    """Send each item at its (absolute, virtual) time; the replies and reply times by slot."""
    start = trio.current_time()
    replies: dict[int, Reply] = {}
    at: dict[int, float] = {}

    async def one(when: float, item: VerifyInput) -> None:
        await trio.sleep_until(start + when)
        reply = await verify(engine, item)
        assert item.rollout_index is not None
        replies[item.rollout_index] = reply
        at[item.rollout_index] = trio.current_time() - start

    async with trio.open_nursery() as nursery:
        for when, item in schedule:
            nursery.start_soon(one, when, item)
    return replies, at


def starts(judge: ScriptedJudge, t0: float = 0.0) -> list[tuple[str, str, float]]:
    return [(*c.shown, c.started - t0) for c in judge.calls]


def metric(engine: Engine, name: str, **labels: str) -> float:
    value = engine.metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


def without_eager_rate(reply: Reply) -> Reply:
    if isinstance(reply, Scored):
        return Scored({k: v for k, v in reply.result.items() if k != EAGER_RATE_KEY})
    return reply


# --- when comparisons start -------------------------------------------------------------------


@pytest.mark.parametrize("on", [True, False], ids=["eager", "at-completion"])
async def test_a_comparison_starts_when_both_of_its_members_are_in(
    autojump_clock: MockClock, on: bool
) -> None:
    judge = ScriptedJudge(latency=0.5)
    config = eager(num_rollouts_per_prompt=4, eager_comparisons=on)
    t0 = trio.current_time()
    async with running(config, judge) as engine:
        async with trio.open_nursery() as nursery:

            async def check() -> None:
                await trio.sleep(2.2)
                [view] = engine.active_cohorts()
                assert view.state == "collecting"
                assert (view.comparisons_total, view.comparisons_done) == ((4, 1) if on else (0, 0))
                gauge = metric(engine, "genrm_trio_active_cohorts", state="collecting")
                assert gauge == 1  # an internal transition leaves the state gauges alone

            nursery.start_soon(check)
            replies, at = await arrive(engine, [(float(i), member(i)) for i in range(4)])
        if on:
            assert sorted(starts(judge, t0), key=lambda s: (s[2], s[0])) == [
                ("a0", "a1", 1.0),
                ("a1", "a2", 2.0),
                ("a2", "a3", 3.0),
                ("a3", "a0", 3.0),
            ]
        else:
            assert sorted(starts(judge, t0)) == [
                ("a0", "a1", 3.0),
                ("a1", "a2", 3.0),
                ("a2", "a3", 3.0),
                ("a3", "a0", 3.0),
            ]
        assert at == {0: 3.5, 1: 3.5, 2: 3.5, 3: 3.5}
        rows = {i: replies[i] for i in range(4)}
        # answer qualities 1..4; each member scores its own quality in both of its comparisons
        assert [r.result["reward"] if isinstance(r, Scored) else r for r in rows.values()] == [
            1.0,
            2.0,
            3.0,
            4.0,
        ]
        if on:
            # (0,1) and (1,2) were done (at 1.5 and 2.5) before the last member came in at 3
            assert {r.result[EAGER_RATE_KEY] for r in rows.values() if isinstance(r, Scored)} == {
                0.5
            }
        else:
            assert all(
                EAGER_RATE_KEY not in r.result for r in rows.values() if isinstance(r, Scored)
            )
        assert metric(engine, "genrm_trio_eager_comparisons_total") == (2 if on else 0)
        assert metric(engine, "genrm_trio_reward_latency_seconds_count") == 1
        assert metric(engine, "genrm_trio_reward_latency_seconds_sum") == 0.5
        waits = "genrm_trio_judge_queue_wait_seconds_count"
        assert metric(engine, waits, priority="collecting") == (2 if on else 0)
        assert metric(engine, waits, priority="complete") == (2 if on else 4)


async def test_comparisons_the_machine_refuses_to_start_early_start_with_the_complete_group(
    autojump_clock: MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Readiness claims a comparison only once `machine.start_comparisons` agreed: one it
    refuses is not lost but starts when the group is complete (with the old order, claim then
    trigger, it never started and the group failed at its deadline)."""
    refused: list[float] = []

    def refuse(model: object) -> bool:
        refused.append(trio.current_time() - t0)
        return False

    monkeypatch.setattr(machine, "start_comparisons", refuse)
    judge = ScriptedJudge(latency=0.5)
    t0 = trio.current_time()
    async with running(eager(num_rollouts_per_prompt=4), judge) as engine:
        replies, at = await arrive(engine, [(float(i), member(i)) for i in range(4)])
        assert metric(engine, "genrm_trio_eager_comparisons_total") == 0
    assert refused == [1.0, 2.0]  # (0, 1) ready at 1 s, (1, 2) at 2 s: asked once each
    assert sorted(starts(judge, t0)) == [
        ("a0", "a1", 3.0),
        ("a1", "a2", 3.0),
        ("a2", "a3", 3.0),
        ("a3", "a0", 3.0),
    ]
    assert at == {0: 3.5, 1: 3.5, 2: 3.5, 3: 3.5}
    rewards = [
        replies[i].result["reward"] if isinstance(replies[i], Scored) else None for i in range(4)
    ]
    assert rewards == [1.0, 2.0, 3.0, 4.0]


async def test_rows_are_the_same_with_and_without_eager_starts(autojump_clock: MockClock) -> None:
    got: dict[bool, dict[int, Reply]] = {}
    for on in (True, False):
        judge = ScriptedJudge(latency=0.3)
        config = eager(
            num_rollouts_per_prompt=5, eager_comparisons=on, position_balance="alternate"
        )
        async with running(config, judge) as engine:
            schedule = [(0.7 * k, member(i)) for k, i in enumerate([3, 0, 4, 1, 2])]
            got[on], _ = await arrive(engine, schedule)
        assert len(judge.calls) == 5
    assert {i: without_eager_rate(r) for i, r in got[True].items()} == got[False]


async def test_fixed_baseline_comparisons_start_with_their_member(
    autojump_clock: MockClock,
) -> None:
    judge = ScriptedJudge(latency=0.25)
    config = eager(num_rollouts_per_prompt=3, comparison_mode="fixed_baseline")
    t0 = trio.current_time()
    async with running(config, judge) as engine:
        schedule = [(float(i), member(i, baseline="base")) for i in range(3)]
        replies, at = await arrive(engine, schedule)
    started = sorted((c.started - t0, frozenset(c.shown)) for c in judge.calls)
    assert started == [(float(i), frozenset({f"a{i}", "base"})) for i in range(3)]
    assert at == {0: 2.25, 1: 2.25, 2: 2.25}
    assert all(isinstance(r, Scored) for r in replies.values())
    rates = {r.result[EAGER_RATE_KEY] for r in replies.values() if isinstance(r, Scored)}
    assert rates == {2 / 3}


# --- failures while collecting: the started comparisons hang up ---------------------------------


async def test_the_collection_deadline_hangs_up_the_started_comparisons(
    autojump_clock: MockClock,
) -> None:
    judge = ScriptedJudge(pairs={("a0", "a1"): hang()})
    config = eager(num_rollouts_per_prompt=3, cohort_collection_timeout_s=1.0)
    t0 = trio.current_time()
    async with running(config, judge) as engine:
        replies, at = await arrive(engine, [(0.0, member(0)), (0.0, member(1)), (1.5, member(2))])
        [call] = judge.calls
        assert (call.shown, call.started - t0) == (("a0", "a1"), 0.0)
        assert call.cancelled and call.cancelled_at is not None
        assert call.cancelled_at - t0 == 1.0
        assert metric(engine, "genrm_trio_deadline_failures_total", deadline="collection") == 1
        assert metric(engine, "genrm_trio_eager_comparisons_total") == 1
        assert metric(engine, "genrm_trio_reward_latency_seconds_count") == 0
    failure = GroupFailed(
        "cohort",
        "GenRM cohort 'group_id::g::group_attempt::0' did not collect 3 unique rollout indices "
        "within 1.0s",
    )
    assert replies == {0: failure, 1: failure, 2: failure}  # the late member: the record
    assert at == {0: 1.0, 1: 1.0, 2: 1.5}
    assert len(judge.calls) == 1  # no judge time after the failure


async def test_supersession_hangs_up_the_older_attempts_comparisons(
    autojump_clock: MockClock,
) -> None:
    judge = ScriptedJudge(pairs={("a0", "a1"): Step(delay=10.0)})
    config = eager(num_rollouts_per_prompt=3)
    t0 = trio.current_time()
    async with running(config, judge) as engine:
        newer = [(0.5, member(i, attempt=1, answer=f"b{i}")) for i in range(3)]
        replies: dict[str, dict[int, Reply]] = {}
        async with trio.open_nursery() as nursery:

            async def old() -> None:
                replies["old"], _ = await arrive(engine, [(0.0, member(0)), (0.0, member(1))])

            async def new() -> None:
                replies["new"], _ = await arrive(engine, newer)

            nursery.start_soon(old)
            nursery.start_soon(new)
    superseded = GroupFailed(
        "cohort", "GenRM group 'g' attempt 0 was superseded by attempt 1", "superseded"
    )
    assert replies["old"] == {0: superseded, 1: superseded}
    assert all(isinstance(r, Scored) for r in replies["new"].values())
    first = judge.calls[0]
    assert (first.shown, first.started - t0, first.cancelled_at) == (("a0", "a1"), 0.0, t0 + 0.5)
    assert sorted(c.shown for c in judge.calls[1:]) == [("b0", "b1"), ("b1", "b2"), ("b2", "b0")]
    assert len(judge.calls) == 4


async def test_shutdown_hangs_up_the_started_comparisons(autojump_clock: MockClock) -> None:
    judge = ScriptedJudge(pairs={("a0", "a1"): hang()})
    t0 = trio.current_time()
    got: dict[int, Reply] = {}
    config = eager(num_rollouts_per_prompt=3)
    async with running(config, judge) as engine, trio.open_nursery() as nursery:

        async def send() -> None:
            got.update((await arrive(engine, [(0.0, member(0)), (0.0, member(1))]))[0])

        nursery.start_soon(send)
        await trio.sleep(0.5)
        await engine.aclose()
    shutting_down = GroupFailed("cohort", "GenRM server is shutting down", "shutting_down")
    assert got == {0: shutting_down, 1: shutting_down}
    [call] = judge.calls
    assert call.cancelled_at == t0 + 0.5


async def test_a_non_judge_error_of_an_eager_comparison_fails_the_group_at_once(
    autojump_clock: MockClock,
) -> None:
    judge = ScriptedJudge(pairs={("a0", "a1"): Step(delay=0.2, error=RuntimeError("kaboom"))})
    async with running(eager(num_rollouts_per_prompt=3), judge) as engine:
        replies, at = await arrive(engine, [(0.0, member(0)), (0.0, member(1)), (1.0, member(2))])
    failure = GroupFailed("cohort", "GenRM cohort evaluation failed: RuntimeError: kaboom")
    assert replies == {0: failure, 1: failure, 2: failure}
    assert at == {0: 0.2, 1: 0.2, 2: 1.0}
    assert len(judge.calls) == 1


# --- judge failures and masking ---------------------------------------------------------------


async def test_an_eager_judge_failure_is_recorded_and_masking_waits_for_the_group(
    autojump_clock: MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    got: dict[bool, dict[int, Reply]] = {}
    for on in (True, False):
        judge = ScriptedJudge(pairs={("a0", "a1"): http_error()})
        config = eager(num_rollouts_per_prompt=3, eager_comparisons=on)
        caplog.clear()
        async with running(config, judge) as engine, trio.open_nursery() as nursery:

            async def check(on: bool = on) -> None:
                await trio.sleep(1.0)
                [view] = engine.active_cohorts()
                assert view.state == "collecting"  # the group keeps collecting
                done = (view.comparisons_done, view.comparisons_failed)
                assert done == ((1, 1) if on else (0, 0))
                dropped = [r for r in caplog.records if "dropped comparison" in r.getMessage()]
                assert len(dropped) == (1 if on else 0)

            nursery.start_soon(check)
            schedule = [(0.0, member(0)), (0.0, member(1)), (2.0, member(2))]
            got[on], at = await arrive(engine, schedule)
            assert at == {0: 2.0, 1: 2.0, 2: 2.0}
        assert len(judge.calls) == 3
    error = (
        "GenRM judge judge.test:8000 /v1/responses pair=(0, 1) deadline=5.0s: JudgeHTTPError: "
        "HTTP 500; response=judge unavailable"
    )
    for index in (0, 1):
        reason = (
            f"GenRM rollout_index={index} lost a comparison to a judge failure "
            f"(1 of 3 comparisons failed): {error}"
        )
        assert got[True][index] == got[False][index] == Masked(reason)
    scored = got[True][2]
    assert isinstance(scored, Scored) and scored.result[EAGER_RATE_KEY] == 1 / 3
    assert without_eager_rate(scored) == got[False][2]


async def test_an_eager_attempt_has_its_own_deadline_while_the_group_collects(
    autojump_clock: MockClock,
) -> None:
    judge = ScriptedJudge(pairs={("a0", "a1"): hang()})
    config = eager(num_rollouts_per_prompt=3, judge_request_timeout_s=0.5)
    t0 = trio.current_time()
    async with running(config, judge) as engine, trio.open_nursery() as nursery:

        async def check() -> None:
            await trio.sleep(0.6)
            [view] = engine.active_cohorts()
            assert (view.state, view.comparisons_done, view.comparisons_failed) == (
                "collecting",
                1,
                1,
            )

        nursery.start_soon(check)
        replies, _ = await arrive(engine, [(0.0, member(0)), (0.0, member(1)), (3.0, member(2))])
    assert judge.calls[0].cancelled_at == t0 + 0.5
    assert isinstance(replies[0], Masked) and "TimeoutError: judge attempt exceeded 0.5s" in (
        replies[0].reason
    )
    assert isinstance(replies[2], Scored)


# --- the group deadline runs from completion --------------------------------------------------


def deadline_judge(slow: float) -> ScriptedJudge:
    return ScriptedJudge(
        pairs={
            ("a0", "a1"): Step(delay=slow),
            ("a1", "a2"): Step(delay=0.9),
            ("a2", "a0"): Step(delay=0.9),
        }
    )


DEADLINE_SCHEDULE = [(0.0, member(0)), (0.0, member(1)), (1.0, member(2))]


async def test_the_group_deadline_runs_from_the_last_member(autojump_clock: MockClock) -> None:
    judge = deadline_judge(1.5)  # started at 0, ends at 1.5: after 1.0 s, inside the deadline
    config = eager(num_rollouts_per_prompt=3, cohort_evaluation_timeout_s=1.0)
    async with running(config, judge) as engine, trio.open_nursery() as nursery:

        async def check() -> None:
            await trio.sleep(1.5)
            [view] = engine.active_cohorts()
            assert (view.state, view.deadline) == ("judging", "evaluation")
            assert view.deadline_s_left == pytest.approx(0.5)

        nursery.start_soon(check)
        replies, at = await arrive(engine, DEADLINE_SCHEDULE)
    assert all(isinstance(r, Scored) for r in replies.values())
    assert at == {0: 1.9, 1: 1.9, 2: 1.9}


async def test_fail_group_at_the_deadline_after_completion(autojump_clock: MockClock) -> None:
    judge = deadline_judge(2.5)
    config = eager(num_rollouts_per_prompt=3, cohort_evaluation_timeout_s=1.0)
    t0 = trio.current_time()
    async with running(config, judge) as engine:
        replies, at = await arrive(engine, DEADLINE_SCHEDULE)
    failure = GroupFailed("judge", "GenRM cohort evaluation deadline exceeded after 1.0s")
    assert replies == {0: failure, 1: failure, 2: failure}
    assert at == {0: 2.0, 1: 2.0, 2: 2.0}
    assert judge.calls[0].cancelled_at == t0 + 2.0
    assert len(judge.calls) == 3


async def test_mask_pending_at_the_deadline_after_completion(autojump_clock: MockClock) -> None:
    judge = deadline_judge(2.5)
    config = eager(
        num_rollouts_per_prompt=3,
        cohort_evaluation_timeout_s=1.0,
        evaluation_deadline_policy="mask_pending",
    )
    async with running(config, judge) as engine:
        replies, at = await arrive(engine, DEADLINE_SCHEDULE)
    message = (
        "GenRM comparison (0, 1) (judge 0) was still running at the group deadline (1.0s) and "
        "was cancelled"
    )
    for index in (0, 1):
        assert replies[index] == Masked(
            f"GenRM rollout_index={index} lost a comparison to a judge failure "
            f"(1 of 3 comparisons failed): {message}"
        )
    assert isinstance(replies[2], Scored)
    assert at == {0: 2.0, 1: 2.0, 2: 2.0}


def retry_after_once(seconds: float) -> ScriptedJudge:
    """A judge whose first call of pair (0, 1) gets 503 with `Retry-After: seconds`; every
    other call answers after 0.1 s."""
    return ScriptedJudge(
        pairs={("a0", "a1"): [Step(error=JudgeHTTPError(503, b"slow down", seconds)), Step()]},
        latency=0.1,
    )


@pytest.mark.parametrize("policy", accepted_values("evaluation_deadline_policy"))
async def test_a_retry_after_taken_while_collecting_respects_the_deadline_set_later(
    autojump_clock: MockClock, policy: str
) -> None:
    """The first call of pair (0, 1) gets 503 with `Retry-After: 30` while the group collects;
    members 2 and 3 arrive 0.5 s later and set the 3 s group deadline. The 30 s no longer fits
    before it, so, as without eager starts, it is not slept: the retry follows the plain retry
    sleep, and every row is scored as with eager starts off."""
    got: dict[bool, dict[int, Reply]] = {}
    for on in (True, False):
        judge = retry_after_once(30.0)
        config = settings(
            num_rollouts_per_prompt=4,
            cohort_collection_timeout_s=30.0,
            cohort_evaluation_timeout_s=3.0,
            judge_request_timeout_s=2.0,
            genrm_parse_retries=3,
            genrm_parse_retry_sleep_s=0.2,
            evaluation_deadline_policy=policy,
            eager_comparisons=on,
        )
        t0 = trio.current_time()
        async with running(config, judge) as engine:
            schedule = [(0.0, member(0)), (0.0, member(1)), (0.5, member(2)), (0.5, member(3))]
            got[on], at = await arrive(engine, schedule)
        first_pair = [c.started - t0 for c in judge.calls if c.shown == ("a0", "a1")]
        if on:
            # 503 at 0; its sleep, sized at 0 (no deadline yet) to 30 s, is sized again at 0.5
            # against the deadline of 3.5: the 0.2 s retry sleep, already over
            assert first_pair == pytest.approx([0.0, 0.5])
            assert at == {i: pytest.approx(0.6) for i in range(4)}
        else:
            assert first_pair == pytest.approx([0.5, 0.7])  # 30 s does not fit: 0.2 s
            assert at == {i: pytest.approx(0.7) for i in range(4)}
        assert len(judge.calls) == 5
        assert all(isinstance(r, Scored) for r in got[on].values())
    assert {i: without_eager_rate(r) for i, r in got[True].items()} == got[False]


async def test_a_retry_after_that_fits_the_deadline_set_later_is_kept(
    autojump_clock: MockClock,
) -> None:
    from genrm_trio.judge.attempts import RETRY_AFTER_JITTER

    judge = retry_after_once(2.0)
    config = eager(
        num_rollouts_per_prompt=3,
        cohort_evaluation_timeout_s=3.0,
        genrm_parse_retries=3,
        genrm_parse_retry_sleep_s=0.2,
    )
    t0 = trio.current_time()
    async with running(config, judge) as engine:
        schedule = [(0.0, member(0)), (0.0, member(1)), (0.5, member(2))]
        replies, _ = await arrive(engine, schedule)
    [retry] = [c.started - t0 for c in judge.calls if c.shown == ("a0", "a1")][1:]
    # 2 s stretched by its jitter, from 0: it ends before the deadline (3.5) and is slept
    assert 2.0 <= retry <= 2.0 * (1 + RETRY_AFTER_JITTER)
    assert all(isinstance(r, Scored) for r in replies.values())


# --- the critical-path judge queue ------------------------------------------------------------


async def test_judge_slots_go_to_complete_groups_first(autojump_clock: MockClock) -> None:
    """One judge slot, four groups of 3 (answers named after their group), calls of 1 s.

    A collects first and its (0,1) takes the free slot; D's and C's (0,1) wait as collecting;
    B completes at 0.25 and A at 0.3, so their attempts wait as complete, B first.
    B's (0,1) fails once: its retry keeps B's place (before B's (2,0) and A's). C completes at
    4.5: its waiting (0,1) is promoted ahead of D's older one. D completes at 9.5."""
    judge = ScriptedJudge(
        pairs={("B0", "B1"): [http_error(delay=1.0), Step(delay=1.0)]},
        latency=1.0,
    )
    config = eager(num_rollouts_per_prompt=3, genrm_parse_retries=1, judge={"max_concurrency": 1})
    t0 = trio.current_time()

    def group(name: str, times: Sequence[float]) -> list[tuple[float, VerifyInput]]:
        return [(when, member(i, group=name, answer=f"{name}{i}")) for i, when in enumerate(times)]

    done: dict[str, float] = {}
    async with running(config, judge) as engine:

        async def run(name: str, times: Sequence[float]) -> None:
            replies, at = await arrive(engine, group(name, times))
            assert all(isinstance(r, Scored) for r in replies.values()), replies
            done[name] = max(at.values())

        async with trio.open_nursery() as nursery:
            nursery.start_soon(run, "A", [0.0, 0.0, 0.3])
            nursery.start_soon(run, "D", [0.05, 0.05, 9.5])
            nursery.start_soon(run, "C", [0.1, 0.1, 4.5])
            nursery.start_soon(run, "B", [0.2, 0.2, 0.25])
        stats = engine.statistics().judge
        queue = engine._queue.statistics()
        assert queue.promotions == 3  # B's, C's and D's waiting (0,1), as each group completed
    assert starts(judge, t0) == [
        ("A0", "A1", 0.0),
        ("B0", "B1", 1.0),
        ("B1", "B2", 2.0),
        ("B0", "B1", 3.0),  # the retry, in B's place
        ("B2", "B0", 4.0),
        ("A1", "A2", 5.0),
        ("A2", "A0", 6.0),
        ("C0", "C1", 7.0),  # promoted at 4.5: before D's (0,1), ready earlier but collecting
        ("C1", "C2", 8.0),
        ("C2", "C0", 9.0),
        ("D0", "D1", 10.0),
        ("D1", "D2", 11.0),
        ("D2", "D0", 12.0),
    ]
    assert done == {"B": 5.0, "A": 7.0, "C": 10.0, "D": 13.0}
    assert (stats.calls, stats.retries) == (13, 1)
    assert judge.in_flight == 0


async def test_compare_batches_count_as_complete(autojump_clock: MockClock) -> None:
    judge = ScriptedJudge(latency=1.0)
    config = eager(num_rollouts_per_prompt=3, judge={"max_concurrency": 1})
    t0 = trio.current_time()
    results: list[object] = []
    async with running(config, judge) as engine, trio.open_nursery() as nursery:

        async def groups() -> None:
            await arrive(
                engine,
                [(0.0, member(i, group="A", answer=f"A{i}")) for i in range(2)]
                + [(0.1, member(i, group="C", answer=f"C{i}")) for i in range(2)]
                + [(20.0, member(2, group="A", answer="A2"))]
                + [(20.0, member(2, group="C", answer="C2"))],
            )

        async def compare() -> None:
            await trio.sleep(0.2)
            results.append(await engine.compare(compare_input(["x0", "x1"])))
            results.append(trio.current_time() - t0)

        nursery.start_soon(groups)
        nursery.start_soon(compare)
    order = starts(judge, t0)
    assert order[0] == ("A0", "A1", 0.0)
    # /compare is complete: both of its comparisons go before C's eager (0,1), waiting since 0.1
    assert [t for *_, t in order[1:3]] == [1.0, 2.0]
    assert {(first, second) for first, second, _ in order[1:3]} == {("x0", "x1"), ("x1", "x0")}
    assert order[3] == ("C0", "C1", 3.0)
    assert isinstance(results[0], CompareResult) and results[1] == 3.0


# --- durable state: a restart judges a collecting group again ---------------------------------


async def test_a_restart_judges_a_collecting_groups_comparisons_again(tmp_path: Path) -> None:
    """Real clock (the store works in a thread). The finished eager comparison of a group that
    was collecting is not kept: the group comes back interrupted, and its new attempt is judged
    whole."""
    config = settings(
        num_rollouts_per_prompt=3,
        state_path=str(tmp_path / "state.db"),
        cohort_collection_timeout_s=30.0,
    )
    first = ScriptedJudge()
    got: dict[int, Reply] = {}
    with trio.fail_after(20):
        async with durable_engine(config, first) as engine, trio.open_nursery() as nursery:

            async def send(index: int) -> None:
                got[index] = await verify(engine, member(index))

            for index in (0, 1):
                nursery.start_soon(send, index)
            # real time: the store's worker thread moves the state, so poll
            while not engine.active_cohorts() or engine.active_cohorts()[0].comparisons_done < 1:  # noqa: ASYNC110
                await trio.sleep(0.01)
            assert [c.shown for c in first.calls] == [("a0", "a1")]
            await engine.aclose()
    shutting_down = GroupFailed("cohort", "GenRM server is shutting down", "shutting_down")
    assert got == {i: shutting_down for i in (0, 1)}
    second = ScriptedJudge()
    interrupted = GroupFailed(
        "cohort", INTERRUPTED_TEMPLATE.format(key=shown_id("group_id::g::group_attempt::0"))
    )
    with trio.fail_after(20):
        async with durable_engine(config, second) as engine:
            assert await verify(engine, member(2)) == interrupted
            assert second.calls == []
            fresh: dict[int, Reply] = {}
            async with trio.open_nursery() as nursery:

                async def again(index: int) -> None:
                    fresh[index] = await verify(engine, member(index, attempt=1))

                for index in range(3):
                    nursery.start_soon(again, index)
    assert all(isinstance(r, Scored) for r in fresh.values())
    assert sorted(c.shown for c in second.calls) == [("a0", "a1"), ("a1", "a2"), ("a2", "a0")]


# --- logging ----------------------------------------------------------------------------------


async def test_no_warning_for_eager_starts(
    autojump_clock: MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, "genrm_trio"):
        async with running(eager(num_rollouts_per_prompt=3), ScriptedJudge()) as engine:
            await arrive(engine, [(float(i), member(i)) for i in range(3)])
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
