"""Scoring at scale (docs/architecture.md, "Scoring off the loop"; docs/scoring.md,
"Bradley–Terry"): the fit's two solvers agree, the bitset cycle count equals counting every
triangle, and large groups are scored in a worker thread with the rewards of the direct path."""

from __future__ import annotations

import gc
import random
import threading
from typing import Any, get_args

import pytest
import trio
import trio.lowlevel
import trio.testing
from judges import NO_ADJ, ScriptedJudge, compare_input, member, member_oriented, settings

from genrm_trio.config import ComparisonStrategy
from genrm_trio.domain.model import SHUTTING_DOWN, GroupFailed, Scored
from genrm_trio.domain.scoring import (
    JudgedComparison,
    PairObservations,
    aggregate,
    fit_bradley_terry,
    plan_comparisons,
    preference_cycle_rate,
)
from genrm_trio.domain.scoring import bradley_terry as bt
from genrm_trio.engine import compare as compare_module
from genrm_trio.engine import group_run
from genrm_trio.engine.engine import open_engine
from genrm_trio.engine.evaluation import scored_off_loop
from genrm_trio.judge.offload import score_off_loop


def random_pairs(rng: random.Random, n: int, density: float) -> list[PairObservations]:
    pairs = []
    for a in range(n):
        for b in range(a + 1, n):
            if rng.random() < density or b == a + 1:  # a path keeps it connected
                count = rng.randint(1, 3)
                pairs.append(PairObservations(a, b, count, rng.uniform(0, count)))
    return pairs


@pytest.mark.parametrize("density", [0.05, 0.3, 1.0])
def test_conjugate_gradients_and_cholesky_solve_the_same_system(density: float) -> None:
    rng = random.Random(int(density * 100))
    for n in (5, 17, 40):
        pairs = random_pairs(rng, n, density)
        theta = [rng.gauss(0, 1) for _ in range(n)]
        grad, diagonal, weights = bt._derivatives(theta, pairs, 0.1)
        first = bt._envelope(n, pairs)
        direct = bt._cholesky_solve(bt._envelope_rows(diagonal, pairs, weights, first), first, grad)
        iterative = bt._cg_solve(diagonal, pairs, weights, grad)
        assert iterative == pytest.approx(direct, rel=1e-9, abs=1e-11)


@pytest.mark.parametrize(("n", "strategy"), [(64, "all_pairs"), (128, "regular"), (256, "regular")])
def test_large_fits_take_conjugate_gradients_and_reach_the_optimum(n: int, strategy: str) -> None:
    rng = random.Random(n)
    plan = plan_comparisons(n, strategy, 1, "none", 8)
    pairs = [PairObservations(p.i, p.j, 1, rng.random()) for p in plan]
    first = bt._envelope(n, pairs)
    assert bt._cholesky_cost(first) > bt._cg_cost(n, len(pairs))  # the iterative path
    fit = fit_bradley_terry(n, pairs, 0.1)
    grad, _, _ = bt._derivatives(fit.theta, pairs, 0.1)
    assert max(map(abs, grad)) <= 1e-9


def test_small_fits_keep_the_cholesky() -> None:
    for n, strategy in [(16, "all_pairs"), (32, "all_pairs"), (64, "regular"), (512, "circular")]:
        pairs = [PairObservations(p.i, p.j, 1, 0.5) for p in plan_comparisons(n, strategy, 1)]
        assert bt._cholesky_cost(bt._envelope(n, pairs)) <= bt._cg_cost(n, len(pairs))


def cycle_rate_by_every_triangle(
    comparisons: list[JudgedComparison], members: list[int]
) -> float | None:
    """The definition, literally: every triple a < b < c of scored members."""
    sums: dict[tuple[int, int], float] = {}
    for c in comparisons:
        if c.i == c.j or c.i not in members or c.j not in members:
            continue
        a, b = sorted((c.i, c.j))
        r = c.scores[2] if c.i == a else 7 - c.scores[2]
        sums[(a, b)] = sums.get((a, b), 0.0) + (3.5 - r)
    sign = {k: (v > 0) - (v < 0) for k, v in sums.items() if v != 0}
    triangles = cyclic = 0
    ordered = sorted(members)
    for x, a in enumerate(ordered):
        for y, b in enumerate(ordered[x + 1 :], x + 1):
            for c in ordered[y + 1 :]:
                if (a, b) in sign and (b, c) in sign and (a, c) in sign:
                    triangles += 1
                    cyclic += sign[(a, b)] == sign[(b, c)] == -sign[(a, c)]
    return cyclic / triangles if triangles else None


def test_the_bitset_cycle_count_is_every_triangle_counted() -> None:
    rng = random.Random(5)
    for _ in range(300):
        n = rng.randint(3, 12)
        strategy = rng.choice(get_args(ComparisonStrategy))
        degree = rng.choice([d for d in range(2, n) if n * d % 2 == 0])
        comparisons = [
            JudgedComparison(p.i, p.j, p.k, (3.0, 3.0, float(rng.choice([1, 2, 3.5, 5, 6]))))
            for p in plan_comparisons(n, strategy, rng.randint(1, 2), "alternate", degree)
            if rng.random() > 0.1
        ]
        members = sorted(rng.sample(range(n), rng.randint(0, n)))
        assert preference_cycle_rate(comparisons, members) == cycle_rate_by_every_triangle(
            comparisons, members
        )


def test_which_groups_are_scored_off_the_loop() -> None:
    assert not scored_off_loop(16, 240)  # 16 rollouts, all_pairs, J = 2
    assert not scored_off_loop(33, 33)  # fixed baseline, 32 members
    assert scored_off_loop(16, 241)
    assert scored_off_loop(64, 64)  # even a circular ring of 64
    assert scored_off_loop(64, 256)  # regular d = 8


def calling_threads(monkeypatch: Any, module: object, name: str) -> list[int]:
    """The threads `module.name` is called from, in order: it is patched to record each call's
    thread, then call through."""
    threads: list[int] = []
    original = getattr(module, name)

    def spy(*args: Any) -> Any:
        threads.append(threading.get_ident())
        return original(*args)

    monkeypatch.setattr(module, name, spy)
    return threads


async def test_a_large_group_is_scored_in_a_worker_thread(
    mock_clock: trio.testing.MockClock, monkeypatch: Any
) -> None:
    """N = 64, regular d = 8, Bradley–Terry. score_cohort runs outside the event loop's thread,
    and the rewards are the direct path's. The clock stands still (a thread would let an
    autojumping clock leap, and a real one races the attempt deadlines on a loaded machine)."""
    threads = calling_threads(monkeypatch, group_run, "score_cohort")
    n = 64
    config = settings(
        num_rollouts_per_prompt=n,
        comparison_strategy="regular",
        comparisons_per_rollout=8,
        aggregator_method="bradley_terry",
    )
    judge = ScriptedJudge()
    replies: list[Any] = [None] * n
    async with open_engine(config, judge) as engine:

        async def one(i: int) -> None:
            replies[i] = await engine.verify(member(i))

        async with trio.open_nursery() as nursery:
            for i in range(n):
                nursery.start_soon(one, i)
    assert trio.current_time() == 0.0  # frozen: nothing waited on the clock
    assert threads and all(t != threading.get_ident() for t in threads)
    assert len(judge.calls) == 256
    assert all(isinstance(r, Scored) for r in replies)
    expected = aggregate(
        member_oriented(n, "regular", degree=8),
        list(range(n)),
        {},
        **NO_ADJ,
        method="bradley_terry",
    )
    assert {i: r.result["reward"] for i, r in enumerate(replies)} == expected.final


async def test_a_large_compare_batch_is_scored_in_a_worker_thread(
    mock_clock: trio.testing.MockClock, monkeypatch: Any
) -> None:
    """40 answers all_pairs (780 comparisons): compare_result runs outside the event loop's
    thread. The clock stands still (a thread would let an autojumping clock leap, and a real
    one races the judging deadlines on a loaded machine): no deadline can fire, every call is
    judged at once."""
    threads = calling_threads(monkeypatch, compare_module, "compare_result")
    config = settings(num_rollouts_per_prompt=1, comparison_strategy="all_pairs")
    judge = ScriptedJudge()
    async with open_engine(config, judge) as engine:
        big = await engine.compare(compare_input([f"a{i}" for i in range(40)]))
    assert len(threads) == 1 and threads[0] != threading.get_ident()
    assert trio.current_time() == 0.0  # frozen: nothing waited on the clock
    assert len(judge.calls) == 40 * 39 // 2
    assert len(big.rewards) == 40
    # a0 … a39 have qualities 1 + i % 5: every quality class is ordered as the judge says
    assert big.rewards[4] > big.rewards[3] > big.rewards[2] > big.rewards[1] > big.rewards[0]


async def test_a_large_regular_compare_batch_chooses_its_graph_off_the_loop(
    mock_clock: trio.testing.MockClock, monkeypatch: Any
) -> None:
    """64 answers, regular d = 8 (256 comparisons): the graph's choice for a batch size not seen
    before (costly at this size, docs/benchmarks.md "The regular graph's choice") is made in a
    worker thread, as its scoring is; a small batch plans on the loop. The clock stands still,
    as above."""
    planned: list[tuple[int, int]] = []  # (batch size, thread)
    original = compare_module.plan_comparisons

    def spy(n: int, *args: Any) -> Any:
        planned.append((n, threading.get_ident()))
        return original(n, *args)

    monkeypatch.setattr(compare_module, "plan_comparisons", spy)
    config = settings(
        num_rollouts_per_prompt=1, comparison_strategy="regular", comparisons_per_rollout=8
    )
    judge = ScriptedJudge()
    async with open_engine(config, judge) as engine:
        big = await engine.compare(compare_input([f"a{i}" for i in range(64)]))
        small = await engine.compare(compare_input([f"a{i}" for i in range(16)]))
    loop = threading.get_ident()
    assert [n for n, _ in planned] == [64, 16]
    assert planned[0][1] != loop and planned[1][1] == loop
    assert len(judge.calls) == 64 * 8 // 2 + 16 * 8 // 2
    assert len(big.rewards) == 64 and len(small.rewards) == 16


async def test_a_shutdown_waits_for_a_scoring_thread_already_running(
    mock_clock: trio.testing.MockClock, monkeypatch: Any
) -> None:
    """The S of the stop's bound (docs/architecture.md, "How cancellation flows"): a thread
    cannot be cancelled, so `Engine.aclose` returns only once the group's `score_cohort` has,
    and the group, failed by the shutdown meanwhile, publishes nothing. Events, not sleeps;
    the clock stands still."""
    started, release = threading.Event(), threading.Event()
    original = group_run.score_cohort

    def held(*args: Any) -> Any:
        started.set()
        release.wait()
        return original(*args)

    monkeypatch.setattr(group_run, "score_cohort", held)
    n = 64  # regular d = 8: 256 comparisons, scored off the loop
    config = settings(
        num_rollouts_per_prompt=n, comparison_strategy="regular", comparisons_per_rollout=8
    )
    judge = ScriptedJudge()
    replies: list[Any] = [None] * n
    closed: list[float] = []
    async with open_engine(config, judge) as engine:

        async def one(i: int) -> None:
            replies[i] = await engine.verify(member(i))

        async def close() -> None:
            await engine.aclose()
            closed.append(trio.current_time())

        async with trio.open_nursery() as nursery:
            for i in range(n):
                nursery.start_soon(one, i)
            await trio.to_thread.run_sync(started.wait)
            nursery.start_soon(close)
            await trio.testing.wait_all_tasks_blocked()
            assert closed == []  # the cohort is failed, its task still waits for the thread
            assert engine.statistics().running_tasks == 1
            release.set()
    assert closed == [0.0]
    assert len(judge.calls) == 256
    assert replies == [GroupFailed("cohort", SHUTTING_DOWN, "shutting_down")] * n


async def test_score_off_loop_pauses_the_collector_and_restores_it() -> None:
    """The collector is off while a scoring thread runs, on again after the last one, and left
    off when it was off before; results and exceptions come back unchanged."""
    limiter = trio.CapacityLimiter(2)
    seen: list[bool] = []

    def work() -> int:
        seen.append(gc.isenabled())
        return 7

    assert gc.isenabled()
    assert await score_off_loop(work, limiter) == 7
    assert seen == [False] and gc.isenabled()

    started, release = threading.Event(), threading.Event()

    def slow() -> None:
        started.set()
        release.wait()
        seen.append(gc.isenabled())

    async with trio.open_nursery() as nursery:  # two at once: on again only after both
        nursery.start_soon(score_off_loop, slow, limiter)
        await trio.to_thread.run_sync(started.wait)  # events, not sleeps: no race under load
        assert not gc.isenabled()
        assert await score_off_loop(work, limiter) == 7  # begins and ends while slow runs
        assert not gc.isenabled()
        release.set()
    assert seen[1:] == [False, False] and gc.isenabled()

    started.clear()
    release.clear()
    returned: list[object] = []

    async def cancelled_caller() -> None:
        returned.append(await score_off_loop(slow, limiter))
        await trio.lowlevel.checkpoint()  # where the cancellation reaches it
        returned.append("not reached")

    with trio.CancelScope() as scope:  # cancelled while it runs: waits for it, then on again
        async with trio.open_nursery() as nursery:
            nursery.start_soon(cancelled_caller)
            await trio.to_thread.run_sync(started.wait)
            scope.cancel()
            release.set()
    assert scope.cancelled_caught and returned == [None]  # the result, then the cancellation
    assert seen[3:] == [False] and gc.isenabled()

    def boom() -> None:
        raise ValueError("non-finite")

    with pytest.raises(ValueError, match="non-finite"):
        await score_off_loop(boom, limiter)
    assert gc.isenabled()
    gc.disable()
    try:
        assert await score_off_loop(work, limiter) == 7
        assert not gc.isenabled()  # it was off before: left off
    finally:
        gc.enable()
