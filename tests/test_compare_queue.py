"""`/compare` batches in the critical-path judge queue (judge/queue.py): a batch is one complete
group from the start, its comparisons' places taken in plan order, so a batch waiting for judge
slots is served in plan order and after every batch that came before it."""

from __future__ import annotations

import trio
import trio.testing
from judges import ScriptedJudge, compare_input, running, settings
from trio.testing import MockClock

from genrm_trio.domain.model import CompareResult


def circular(answers: list[str]) -> list[tuple[str, str]]:
    """The pairs shown to the judge for a circular plan, in plan order."""
    n = len(answers)
    if n == 2:
        return [(answers[0], answers[1]), (answers[1], answers[0])]
    return [(answers[i], answers[(i + 1) % n]) for i in range(n)]


async def test_waiting_batches_are_judged_in_plan_order_one_after_the_other(
    autojump_clock: MockClock,
) -> None:
    """One judge slot, 1 s a call. A batch of two takes the slot; then a batch of four arrives,
    then another: both wait, and are judged after the first, each in plan order (whatever order
    trio started their comparison tasks in), ten times over. (The slot free at the start goes
    to whichever comparison asks first: the queue orders those that wait.)"""
    judge = ScriptedJudge(latency=1.0)
    config = settings(
        judge={"max_concurrency": 1}, judge_request_timeout_s=5.0, cohort_evaluation_timeout_s=60.0
    )
    batches = [["x0", "x1"], ["a0", "a1", "a2", "a3"], ["b0", "b1", "b2", "b3"]]
    expected = [pair for answers in batches for pair in circular(answers)]
    async with running(config, judge) as engine:
        for round_ in range(10):
            start = trio.current_time()
            results: list[object] = []

            async def batch(answers: list[str]) -> None:
                results.append(await engine.compare(compare_input(answers)))  # noqa: B023

            async with trio.open_nursery() as nursery:
                for answers in batches:
                    nursery.start_soon(batch, answers)
                    await trio.testing.wait_all_tasks_blocked()  # each waits for the slot
            assert len(results) == 3 and all(isinstance(r, CompareResult) for r in results)
            calls = judge.calls[10 * round_ :]
            # the first batch's first call to run took the free slot; everything after waited
            assert sorted(c.shown for c in calls[:2]) == sorted(expected[:2]), round_
            assert [c.shown for c in calls[2:]] == expected[2:], round_
            assert [c.started - start for c in calls] == [float(k) for k in range(10)]
    assert len(judge.calls) == 100
