"""Property tests: random groups, judge failures, arrival times and disconnects.

Whatever happens, a cohort's members get one consistent story: all scored or masked exactly as
the failed comparisons dictate, or all the same group failure; and nothing is left behind.
"""

from __future__ import annotations

from typing import Any

import trio
from graph_keys import degree, graphs
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from judges import ScriptedJudge, assert_no_leaks, http_error, member, settings, verify
from trio.testing import MockClock

from genrm_trio.domain.model import GroupFailed, Masked, Scored
from genrm_trio.domain.scoring import PlannedComparison, plan_comparisons
from genrm_trio.engine.engine import open_engine


@st.composite
def scenarios(draw: st.DrawFn) -> dict[str, Any]:
    n = draw(st.integers(2, 5))
    graph = draw(graphs(n))
    judges = draw(st.integers(1, 2))
    plan = plan_comparisons(n, graph["comparison_strategy"], judges, "none", degree(graph))
    shown = sorted({(p.i, p.j) for p in plan})
    failing = draw(st.sets(st.sampled_from(shown), max_size=len(shown)))
    arrivals = draw(st.lists(st.sampled_from([0.0, 0.3, 0.9, 1.5]), min_size=n, max_size=n))
    disconnect = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    latency = draw(st.sampled_from([0.0, 0.05, 0.15]))
    eager = draw(st.booleans())
    return {
        "eager": eager,
        "n": n,
        "graph": graph,
        "judges": judges,
        "failing": failing,
        "arrivals": arrivals,
        "disconnect": disconnect,
        "latency": latency,
    }


def _plan(scenario: dict[str, Any]) -> list[PlannedComparison]:
    graph = scenario["graph"]
    n, judges = scenario["n"], scenario["judges"]
    return plan_comparisons(n, graph["comparison_strategy"], judges, "none", degree(graph))


@hsettings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_every_member_gets_one_consistent_story(scenario: dict[str, Any]) -> None:
    n = scenario["n"]
    failing = scenario["failing"]
    latency = scenario["latency"]
    judge = ScriptedJudge(
        pairs={(f"a{i}", f"a{j}"): http_error(delay=latency) for i, j in failing},
        latency=latency,
    )
    config = settings(
        num_rollouts_per_prompt=n,
        **scenario["graph"],
        num_judges_per_comparison=scenario["judges"],
        eager_comparisons=scenario["eager"],
    )
    replies: dict[int, object] = {}
    retried: dict[int, object] = {}

    async def main() -> None:
        with trio.fail_after(3600):
            async with open_engine(config, judge) as engine:

                async def send(i: int) -> None:
                    await trio.sleep(scenario["arrivals"][i])
                    if scenario["disconnect"][i]:
                        with trio.move_on_after(0.01):
                            await verify(engine, member(i))
                        retried[i] = await verify(engine, member(i))  # identical retry
                    else:
                        replies[i] = await verify(engine, member(i))

                async with trio.open_nursery() as nursery:
                    for i in range(n):
                        nursery.start_soon(send, i)
        assert_no_leaks(engine, judge)

    trio.run(main, clock=MockClock(autojump_threshold=0))
    answers = {**replies, **retried}
    assert sorted(answers) == list(range(n))
    # the collection deadline runs from the first arrival (1.0 s); no spread is exactly 1.0
    arrivals = scenario["arrivals"]
    collected = max(arrivals) - min(arrivals) < 1.0
    kinds = {type(a) for a in answers.values()}
    if not collected:
        assert kinds == {GroupFailed}
        assert len(set(answers.values())) == 1
        [failure] = set(answers.values())
        assert isinstance(failure, GroupFailed) and failure.kind == "cohort"
        assert "did not collect" in failure.message
        if not scenario["eager"]:
            assert judge.calls == []
            return
        # eager comparisons started while collecting; the collection deadline hung them up
        deadline = min(arrivals) + 1.0
        assert len(judge.calls) <= len(_plan(scenario))
        for call in judge.calls:
            assert call.started < deadline
            assert call.cancelled or (call.ended is not None and call.ended <= deadline)
        return
    masked = {m for pair in failing for m in pair}
    if masked == set(range(n)):
        assert kinds == {GroupFailed}
        [failure] = set(answers.values())
        assert isinstance(failure, GroupFailed) and failure.kind == "judge"
        assert failure.message.startswith("GenRM masked every rollout of the group")
    else:
        assert {i for i, a in answers.items() if isinstance(a, Masked)} == masked
        assert {i for i, a in answers.items() if isinstance(a, Scored)} == set(range(n)) - masked
    plan = _plan(scenario)
    assert len(judge.calls) == len(plan)  # one attempt each (A = 1), never judged twice
