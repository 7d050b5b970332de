"""`comparison_strategy: regular` through the engine, in virtual time (docs/scoring.md, "The
regular graph"): exact judge-call counts C = N·d/2·J and the pairs shown, J passes with position
balance, eager starts as the members arrive, both aggregators, both mask policies, escalation,
the fleet, /compare batches of any size, and restored groups (checkpoint, durable state) that
replay."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any, get_args

import pytest
import trio
from judges import (
    NO_ADJ,
    ScriptedJudge,
    Step,
    compare_input,
    gather,
    http_error,
    masked,
    member,
    member_oriented,
    running,
    scored,
    settings,
)
from trio.testing import MockClock

from genrm_trio.app.compose import durable_engine
from genrm_trio.config import AggregatorMethod
from genrm_trio.domain.checkpoint import checkpoint, restore
from genrm_trio.domain.codec import decode_json, encode_json
from genrm_trio.domain.scoring import aggregate, plan_comparisons
from genrm_trio.engine.engine import open_engine
from genrm_trio.judge.base import ReplyStatus
from genrm_trio.judge.fleet import JudgeFleet

N = 8
REGULAR: dict[str, Any] = {"num_rollouts_per_prompt": N, "comparison_strategy": "regular"}


def shown_pairs(n: int, d: int, judges: int, balance: str) -> Counter[tuple[str, str]]:
    """The answer pairs the plan shows the judge, with multiplicity."""
    return Counter(
        (f"a{p.shown[0]}", f"a{p.shown[1]}")
        for p in plan_comparisons(n, "regular", judges, balance, d)
    )


@pytest.mark.parametrize("method", get_args(AggregatorMethod))
@pytest.mark.parametrize(("d", "judges", "balance"), [(3, 1, "none"), (4, 2, "alternate")])
async def test_verify_judges_the_graph_and_scores_it(
    autojump_clock: MockClock, method: str, d: int, judges: int, balance: str
) -> None:
    config = settings(
        **REGULAR,
        comparisons_per_rollout=d,
        num_judges_per_comparison=judges,
        position_balance=balance,
        aggregator_method=method,
    )
    judge = ScriptedJudge(latency=0.1)
    t0 = trio.current_time()
    async with running(config, judge) as engine:
        replies = await gather(engine, [member(i) for i in range(N)])
        assert trio.current_time() - t0 == pytest.approx(0.1)
    assert len(judge.calls) == N * d // 2 * judges  # C = N·d/2·J
    assert Counter(c.shown for c in judge.calls) == shown_pairs(N, d, judges, balance)
    rows = scored(replies)
    assert sorted(rows) == list(range(N))
    expected = aggregate(
        member_oriented(N, "regular", judges, balance, d),
        list(range(N)),
        {},
        **NO_ADJ,
        method=method,
    )
    assert {m: rows[m]["reward"] for m in rows} == expected.final


async def test_eager_comparisons_start_when_both_members_are_in(autojump_clock: MockClock) -> None:
    """Member m arrives at t = m seconds; each comparison starts with its later member, and the
    last member's comparisons when the group is complete."""
    config = settings(**REGULAR, comparisons_per_rollout=3, cohort_collection_timeout_s=60.0)
    judge = ScriptedJudge(latency=0.1)
    t0 = trio.current_time()
    async with running(config, judge) as engine:
        replies = await gather(engine, [member(i) for i in range(N)], stagger=1.0)
    assert len(scored(replies)) == N
    assert len(judge.calls) == 12
    for call in judge.calls:
        i, j = (int(answer[1:]) for answer in call.shown)
        assert call.started - t0 == pytest.approx(max(i, j))
    rows = scored(replies)
    # the pairs without member 7 finished before it arrived: 9 of 12
    assert rows[0]["genrm_eager_comparison_rate_per_group"] == 9 / 12


@pytest.mark.parametrize(("policy", "masked_members"), [("pair", [0, 1]), ("component", [])])
async def test_one_failed_comparison_under_each_mask_policy(
    autojump_clock: MockClock, policy: str, masked_members: list[int]
) -> None:
    """d = 4: (0, 1) fails; `pair` masks its two members, `component` none (the graph stays
    connected through the other 15 comparisons)."""
    judge = ScriptedJudge(pairs={("a0", "a1"): http_error()})
    config = settings(**REGULAR, mask_policy=policy, aggregator_method="bradley_terry")
    async with running(config, judge) as engine:
        replies = await gather(engine, [member(i) for i in range(N)])
    assert sorted(masked(replies)) == masked_members
    assert len(scored(replies)) == N - len(masked_members)
    assert len(judge.calls) == 16
    row = scored(replies)[2]  # the per-group rates count C = N·d/2·J = 16 comparisons
    assert row["genrm_failed_comparison_rate_per_group"] == 1 / 16
    assert row["genrm_masked_rollout_rate_per_group"] == len(masked_members) / N


async def test_escalation_and_a_fleet(autojump_clock: MockClock) -> None:
    """Replica b answers 500 to everything and a's first attempt at (a0, a1) runs out of its
    output budget: every comparison ends on a, (a0, a1) with the escalated budget."""
    healthy = ScriptedJudge(
        pairs={("a0", "a1"): [Step(text="", status=ReplyStatus.BUDGET_EXHAUSTED), Step()]}
    )
    broken = ScriptedJudge(script=lambda r1, r2, n: http_error())
    fleet = JudgeFleet([("http://a:8000/v1", healthy), ("http://b:8000/v1", broken)])
    config = settings(
        **REGULAR, genrm_parse_retries=3, judge={"budget_escalation": {}}, mask_policy="component"
    )
    async with open_engine(config, fleet) as engine:
        replies = await gather(engine, [member(i) for i in range(N)])
    rows = scored(replies)
    assert sorted(rows) == list(range(N))
    assert rows[0]["genrm_budget_escalation_rate_per_group"] == 1 / 16
    successes = [c for c in healthy.calls if c.ended is not None and c.shown != ("a0", "a1")]
    assert Counter(c.shown for c in successes) + Counter({("a0", "a1"): 1}) == shown_pairs(
        N, 4, 1, "none"
    )
    budgets = [c.call.max_output_tokens for c in healthy.calls if c.shown == ("a0", "a1")]
    assert budgets == [16384, 32768]


@pytest.mark.parametrize(("n", "calls"), [(2, 1), (3, 3), (5, 10), (8, 16), (9, 18)])
async def test_compare_batches_of_any_size(autojump_clock: MockClock, n: int, calls: int) -> None:
    """d = 4 where it fits (n·4/2 calls); n = 2 one pair, n = 3 the triangle (d' = 2)."""
    config = settings(
        num_rollouts_per_prompt=1, comparison_strategy="regular", aggregator_method="bradley_terry"
    )
    judge = ScriptedJudge()
    async with running(config, judge) as engine:
        result = await engine.compare(compare_input([f"a{i}" for i in range(n)]))
    assert len(judge.calls) == calls
    assert len(result.rewards) == n
    assert result.comparison_results is not None
    assert len(result.comparison_results) == calls


async def test_a_restored_group_replays_its_rows(autojump_clock: MockClock) -> None:
    """A checkpoint of a regular group restores into a fresh engine with the same settings:
    every member replays its row, and nothing is judged again."""
    config = settings(**REGULAR, comparisons_per_rollout=3, aggregator_method="bradley_terry")
    async with running(config, ScriptedJudge()) as engine:
        first = await gather(engine, [member(i) for i in range(N)])
        exported = checkpoint(engine)
    judge = ScriptedJudge()
    async with running(config, judge) as engine:
        await restore(engine, decode_json(encode_json(exported)), num_rollouts=N)
        again = await gather(engine, [member(i) for i in range(N)])
    assert judge.calls == []
    assert again == first
    assert json.dumps(scored(again), sort_keys=True) == json.dumps(scored(first), sort_keys=True)


async def test_a_restart_with_durable_state_replays_a_regular_group(tmp_path: Path) -> None:
    """Real clock (the store works in a thread): the group's rows survive a restart and replay
    without a judge call; its next attempt is judged on the same graph. Deadlines far beyond the
    test's own bound, so a loaded machine cannot race them."""
    config = settings(
        **REGULAR,
        comparisons_per_rollout=3,
        state_path=str(tmp_path / "state.db"),
        cohort_collection_timeout_s=60.0,
        cohort_evaluation_timeout_s=60.0,
        judge_request_timeout_s=30.0,
    )
    first = ScriptedJudge()
    with trio.fail_after(20):
        async with durable_engine(config, first) as engine:
            rows = await gather(engine, [member(i) for i in range(N)])
    second = ScriptedJudge()
    with trio.fail_after(20):
        async with durable_engine(config, second) as engine:
            assert await gather(engine, [member(i) for i in range(N)]) == rows
            assert second.calls == []
            await gather(engine, [member(i, attempt=1) for i in range(N)])
    assert Counter(c.shown for c in second.calls) == Counter(c.shown for c in first.calls)
    assert Counter(c.shown for c in first.calls) == shown_pairs(N, 3, 1, "none")
