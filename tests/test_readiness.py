"""Which comparisons a group's members make ready (genrm_trio/engine/readiness.py, pure)."""

from __future__ import annotations

from typing import Any

import pytest
from graph_keys import degree, graphs
from hypothesis import given
from hypothesis import strategies as st

from genrm_trio.domain.scoring import plan_comparisons, plan_fixed_baseline
from genrm_trio.engine.readiness import Readiness, ReadinessIndex


def pairs(plan: list, comparisons: list[int]) -> list[tuple[int, int, int]]:
    return [(plan[c].i, plan[c].j, plan[c].k) for c in comparisons]


def claim(ready: Readiness, members: list[int]) -> list[int]:
    """What the engine does when the machine agrees: find the ready comparisons, take them."""
    got = ready.arrive(members)
    ready.take(got)
    return got


def test_circular_comparisons_start_with_their_second_member() -> None:
    plan = plan_comparisons(4, "circular", 1)
    ready = Readiness(ReadinessIndex(plan, 4))
    assert claim(ready, [2]) == []
    assert pairs(plan, claim(ready, [3])) == [(2, 3, 0)]
    assert pairs(plan, claim(ready, [0])) == [(3, 0, 0)]
    assert ready.unstarted == 2
    assert pairs(plan, claim(ready, [1])) == [(0, 1, 0), (1, 2, 0)]  # plan order
    assert ready.rest() == [] and ready.unstarted == 0


def test_members_arriving_together_and_every_judge_pass() -> None:
    plan = plan_comparisons(3, "all_pairs", 2, "alternate")
    ready = Readiness(ReadinessIndex(plan, 3))
    assert pairs(plan, claim(ready, [0, 2])) == [(0, 2, 0), (0, 2, 1)]
    assert pairs(plan, ready.rest()) == [(0, 1, 0), (1, 2, 0), (0, 1, 1), (1, 2, 1)]
    assert claim(ready, [1]) == []  # each comparison is handed out once


def test_fixed_baseline_comparisons_start_with_their_member() -> None:
    plan = plan_fixed_baseline(3, 2, "group_id::g::group_attempt::0")
    ready = Readiness(ReadinessIndex(plan, 3))
    assert pairs(plan, claim(ready, [1])) == [(1, 3, 0), (1, 3, 1)]
    assert pairs(plan, claim(ready, [0])) == [(0, 3, 0), (0, 3, 1)]
    assert pairs(plan, ready.rest()) == [(2, 3, 0), (2, 3, 1)]


def test_an_index_is_shared_by_groups_of_one_plan() -> None:
    plan = plan_comparisons(3, "circular", 1)
    index = ReadinessIndex(plan, 3)
    first, second = Readiness(index), Readiness(index)
    assert claim(first, [0, 1]) == [0]
    assert claim(second, [0]) == []
    assert claim(second, [2]) == [2]
    assert first.unstarted == second.unstarted == 2


@given(
    st.integers(2, 7).flatmap(lambda n: st.tuples(st.just(n), graphs(n))),
    st.integers(1, 3),
    st.randoms(use_true_random=False),
)
def test_every_comparison_starts_once_when_its_members_are_in(
    group: tuple[int, dict[str, Any]], judges: int, rng: object
) -> None:
    n, graph = group
    plan = plan_comparisons(n, graph["comparison_strategy"], judges, "none", degree(graph))
    ready = Readiness(ReadinessIndex(plan, n))
    order = list(range(n))
    rng.shuffle(order)  # type: ignore[attr-defined]
    present: set[int] = set()
    started: list[int] = []
    for m in order[:-1]:
        present.add(m)
        got = claim(ready, [m])
        assert got == sorted(got)
        assert all({plan[c].i, plan[c].j} <= present and m in (plan[c].i, plan[c].j) for c in got)
        started += got
    expected = [c for c, p in enumerate(plan) if {p.i, p.j} <= set(order[:-1])]
    assert sorted(started) == expected
    rest = ready.rest()
    assert sorted(started + rest) == list(range(len(plan)))
    assert ready.unstarted == 0


def test_finding_ready_comparisons_claims_none_of_them() -> None:
    """The engine claims what it starts; a comparison it could not start (the machine refused
    `start_comparisons`) is still handed out by `rest`, and `arrive` finds it again."""
    plan = plan_comparisons(3, "circular", 1)
    ready = Readiness(ReadinessIndex(plan, 3))
    assert pairs(plan, ready.arrive([0, 1])) == [(0, 1, 0)]
    assert ready.unstarted == 3
    assert pairs(plan, ready.arrive([1])) == [(0, 1, 0)]  # not taken: still ready
    assert pairs(plan, ready.rest()) == [(0, 1, 0), (1, 2, 0), (2, 0, 0)]
    assert ready.unstarted == 0
    assert ready.arrive([2]) == []  # all taken now


def test_a_comparison_is_taken_once() -> None:
    plan = plan_comparisons(3, "circular", 1)
    ready = Readiness(ReadinessIndex(plan, 3))
    ready.take(ready.arrive([0, 1]))
    with pytest.raises(ValueError, match="comparison 0 was already taken"):
        ready.take([0])
    assert ready.unstarted == 2
