"""`aggregator_method: bradley_terry` and `mask_policy: component` through the engine, in virtual
time (docs/scoring.md "Bradley–Terry", "Masking by connectivity"; D45, D46): /verify and /compare,
both strategies, J passes, position balance, fixed baseline, escalation, the fleet, mask_pending
and rubric means; exact judge-call counts, exact times and exact masked sets."""

from __future__ import annotations

import json
import math

import pytest
import trio
from judges import (
    NO_ADJ,
    ScriptedJudge,
    Step,
    compare_input,
    gather,
    hang,
    http_error,
    judge_error,
    masked,
    member,
    member_oriented,
    ok,
    running,
    scored,
    settings,
)
from trio.testing import MockClock

from genrm_trio.domain.model import GroupFailed, Scored
from genrm_trio.domain.scoring import (
    BT_LOG_LIKELIHOOD,
    CYCLE_RATE,
    JudgedComparison,
    aggregate,
)
from genrm_trio.engine.engine import open_engine
from genrm_trio.judge.base import ReplyStatus
from genrm_trio.judge.fleet import JudgeFleet

BT = {"aggregator_method": "bradley_terry"}
COMPONENT = {"mask_policy": "component"}


def sigma(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def optimality_residual(rewards: dict[int, float], comparisons: list[JudgedComparison]) -> float:
    """max |∂F/∂θ_m| at θ_m = logit((reward_m − 1)/4), one term per observation (every member
    scored and no adjustments, so Σθ = 0 and these are the fitted θ)."""
    theta = {m: math.log((r - 1.0) / (5.0 - r)) for m, r in rewards.items()}
    grad = {m: -0.1 * t for m, t in theta.items()}
    for c in comparisons:
        g = (6.0 - c.scores[2]) / 5.0 - sigma(theta[c.i] - theta[c.j])
        grad[c.i] += g
        grad[c.j] -= g
    return max(abs(g) for g in grad.values())


# --- /verify with bradley_terry ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("strategy", "judges", "balance", "calls"),
    [("circular", 1, "none", 5), ("all_pairs", 1, "none", 10), ("all_pairs", 2, "alternate", 20),
     ("circular", 2, "alternate", 10)],
)  # fmt: skip
async def test_verify_rewards_are_the_bradley_terry_fit(
    autojump_clock: MockClock, strategy: str, judges: int, balance: str, calls: int
) -> None:
    n = 5
    config = settings(
        num_rollouts_per_prompt=n,
        comparison_strategy=strategy,
        num_judges_per_comparison=judges,
        position_balance=balance,
        **BT,
    )
    judge = ScriptedJudge(latency=0.1)
    t0 = trio.current_time()
    async with running(config, judge) as engine:
        replies = await gather(engine, [member(i) for i in range(n)])
        assert trio.current_time() - t0 == pytest.approx(0.1)  # every comparison at once
    assert len(judge.calls) == calls
    rows = scored(replies)
    assert sorted(rows) == list(range(n))
    rewards = {m: row["reward"] for m, row in rows.items()}
    comparisons = member_oriented(n, strategy, judges, balance)
    expected = aggregate(comparisons, list(range(n)), {}, **NO_ADJ, method="bradley_terry")
    assert rewards == expected.final
    assert optimality_residual(rewards, comparisons) <= 1e-8
    # the judge's qualities 1..5 for a0..a4: the fit orders the members the same way
    assert sorted(rewards, key=rewards.__getitem__) == [0, 1, 2, 3, 4]
    for row in rows.values():
        assert row["reward_score_raw"] == row["reward"]  # no adjustments configured
        assert row["reward_overall_score"] == row["reward"]
        assert row[BT_LOG_LIKELIHOOD] == expected.method_metrics[BT_LOG_LIKELIHOOD]
        assert (CYCLE_RATE in row) == (strategy == "all_pairs")
        assert row["genrm_masked_rollout_rate_per_group"] == 0.0
    if strategy == "all_pairs":
        assert rows[0][CYCLE_RATE] == 0.0  # the default judge is transitive


async def test_a_judge_that_always_prefers_the_first_is_cancelled_by_alternate(
    autojump_clock: MockClock,
) -> None:
    """all_pairs, J = 2, alternate: every pair is seen once each way, y = 1 then 0, so θ = 0
    exactly and every member scores exactly 3; each observation is log σ(0) = −log 2."""
    config = settings(
        num_rollouts_per_prompt=4,
        comparison_strategy="all_pairs",
        num_judges_per_comparison=2,
        position_balance="alternate",
        **BT,
    )
    judge = ScriptedJudge(script=lambda r1, r2, n: ok(4, 2, 1))
    async with running(config, judge) as engine:
        replies = await gather(engine, [member(i) for i in range(4)])
    rows = scored(replies)
    assert [rows[m]["reward"] for m in range(4)] == [3.0] * 4
    assert rows[0][BT_LOG_LIKELIHOOD] == pytest.approx(-math.log(2), abs=1e-15)
    assert rows[0]["genrm_position_disagreement_rate_per_group"] == 1.0
    assert CYCLE_RATE not in rows[0]  # every pair is undecided: no triangle counts
    assert len(judge.calls) == 12


async def test_default_rows_carry_no_graph_metrics(autojump_clock: MockClock) -> None:
    config = settings(num_rollouts_per_prompt=4, comparison_strategy="all_pairs")
    async with running(config, ScriptedJudge()) as engine:
        replies = await gather(engine, [member(i) for i in range(4)])
    for row in scored(replies).values():
        assert BT_LOG_LIKELIHOOD not in row and CYCLE_RATE not in row


async def test_bradley_terry_with_pair_masking_fits_masked_members_too(
    autojump_clock: MockClock,
) -> None:
    """Circular N = 4, (0,1) fails: 0 and 1 are masked (pair), but their other comparisons,
    (1,2) and (3,0), still take part in the fit; θ̄ is over {2, 3}."""
    judge = ScriptedJudge(pairs={("a0", "a1"): http_error()})
    async with running(settings(num_rollouts_per_prompt=4, **BT), judge) as engine:
        replies = await gather(engine, [member(i) for i in range(4)])
    assert sorted(masked(replies)) == [0, 1]
    rows = scored(replies)
    comparisons = [c for c in member_oriented(4, "circular", 1, "none") if (c.i, c.j) != (0, 1)]
    expected = aggregate(comparisons, [2, 3], {}, **NO_ADJ, method="bradley_terry")
    assert {m: rows[m]["reward"] for m in rows} == expected.final
    assert rows[2]["reward"] + rows[3]["reward"] == pytest.approx(6.0, abs=1e-12)


async def test_fixed_baseline_with_bradley_terry_and_component(autojump_clock: MockClock) -> None:
    """N = 3, J = 2 against a baseline: member 1 fails both passes (masked), member 0 one of two
    (scored from the other under component). θ̄ is over the members, so 3 is the average member,
    not the baseline."""
    n = 3
    seen_a0: list[int] = []

    def script(r1: str, r2: str, ordinal: int) -> Step | None:
        answer = r1 if r1 != "base" else r2
        if answer == "a0":
            seen_a0.append(ordinal)
            if len(seen_a0) == 1:  # the first of its two passes to arrive
                return http_error()
        return http_error() if answer == "a1" else None

    config = settings(
        num_rollouts_per_prompt=n,
        comparison_mode="fixed_baseline",
        num_judges_per_comparison=2,
        **BT,
        **COMPONENT,
    )
    judge = ScriptedJudge(script=script)
    async with running(config, judge) as engine:
        replies = await gather(engine, [member(i, baseline="base") for i in range(n)])
    assert sorted(masked(replies)) == [1]
    assert masked(replies)[1].startswith(
        "GenRM rollout_index=1 is outside the largest connected component of the comparison "
        "graph (2 of 3 rollouts are in it; 3 of 6 comparisons failed) and lost a comparison"
    )
    rows = scored(replies)
    assert sorted(rows) == [0, 2]
    # qualities: a0 = 1, a2 = 3, the baseline "base" = 3; a2 beats a0
    assert rows[2]["reward"] > 3.0 > rows[0]["reward"]
    assert rows[0]["reward"] + rows[2]["reward"] == pytest.approx(6.0, abs=1e-12)
    assert rows[0]["genrm_failed_comparison_rate_per_group"] == 0.5
    assert rows[0]["genrm_masked_rollout_rate_per_group"] == 1 / 3
    assert len(judge.calls) == 6


async def test_unvalidated_absurd_rankings_fail_the_group_as_non_finite(
    autojump_clock: MockClock,
) -> None:
    judge = ScriptedJudge(pairs={("a0", "a1"): ok(3, 3, -1e300)})
    config = settings(num_rollouts_per_prompt=3, validate_verdict_range=False, **BT)
    async with running(config, judge) as engine:
        replies = await gather(engine, [member(i) for i in range(3)])
    message = "GenRM cohort evaluation failed: ValueError: GenRM returned non-finite cohort rewards"
    assert replies == [GroupFailed("cohort", message)] * 3


async def test_rubric_mean_with_bradley_terry(autojump_clock: MockClock) -> None:
    """Rubric means are the selected verdicts, the overall verdicts give reward_overall_score,
    and reward_rubric_aggregate_valid is a fit over the comparisons whose rubric parsed."""

    def rubric(entries: list[tuple[int, float, float, float]], overall: tuple) -> str:
        return json.dumps(
            {
                "rubric_evaluations": [
                    {"rubric_id": r, "score_1": a, "score_2": b, "ranking": k}
                    for r, a, b, k in entries
                ],
                "overall": dict(zip(("score_1", "score_2", "ranking"), overall, strict=True)),
            }
        )

    judge = ScriptedJudge(
        pairs={
            ("a0", "a1"): Step(text=rubric([(1, 4, 2, 2), (2, 2, 2, 3)], (5, 1, 1))),
            ("a1", "a2"): Step(text='{"score_1": 4, "score_2": 2, "ranking": 2}'),  # no rubric
            ("a2", "a0"): Step(text=rubric([(1, 3, 3, 2), (2, 5, 1, 1)], (3, 3, 3.5))),
        }
    )
    config = settings(num_rollouts_per_prompt=3, score_source="rubric_mean", **BT)
    async with running(config, judge) as engine:
        replies = await gather(engine, [member(i, rubric_ids=(1, 2)) for i in range(3)])
    rows = scored(replies)
    selected = [
        JudgedComparison(0, 1, 0, (3.0, 2.0, 2.5)),
        JudgedComparison(1, 2, 0, (3.0, 3.0, 3.5)),  # the fallback: y = 0.5
        JudgedComparison(2, 0, 0, (4.0, 2.0, 1.5)),
    ]
    overall = [
        JudgedComparison(0, 1, 0, (5.0, 1.0, 1.0)),
        JudgedComparison(1, 2, 0, (4.0, 2.0, 2.0)),
        JudgedComparison(2, 0, 0, (3.0, 3.0, 3.5)),
    ]
    population = [0, 1, 2]
    reward = aggregate(selected, population, {}, **NO_ADJ, method="bradley_terry").final
    overall_reward = aggregate(overall, population, {}, **NO_ADJ, method="bradley_terry").final
    valid = aggregate([selected[0], selected[2]], population, {}, **NO_ADJ, method="bradley_terry")
    assert [rows[m]["reward"] for m in population] == [reward[m] for m in population]
    assert [rows[m]["reward_overall_score"] for m in population] == [
        overall_reward[m] for m in population
    ]
    assert [rows[m]["reward_rubric_aggregate_valid"] for m in population] == [
        valid.base[0],
        None,
        None,
    ]


# --- /verify with component --------------------------------------------------------------------


async def test_all_pairs_one_failure_masks_nobody_under_component(
    autojump_clock: MockClock,
) -> None:
    """all_pairs N = 4, (0,1) fails: pair masks 0 and 1; component scores all four, each from
    its own successful comparisons (simple_tiebreaker). Qualities 1..4 are the scores."""
    judge = ScriptedJudge(pairs={("a0", "a1"): http_error()})
    config = settings(num_rollouts_per_prompt=4, comparison_strategy="all_pairs", **COMPONENT)
    async with running(config, judge) as engine:
        replies = await gather(engine, [member(i) for i in range(4)])
    rows = scored(replies)
    assert masked(replies) == {}
    assert [rows[m]["reward"] for m in range(4)] == [1.0, 2.0, 3.0, 4.0]
    assert rows[0]["genrm_failed_comparison_rate_per_group"] == 1 / 6
    assert rows[0]["genrm_masked_rollout_rate_per_group"] == 0.0
    assert len(judge.calls) == 6
    pair_judge = ScriptedJudge(pairs={("a0", "a1"): http_error()})
    pair_config = settings(num_rollouts_per_prompt=4, comparison_strategy="all_pairs")
    async with running(pair_config, pair_judge) as engine:
        pair = await gather(engine, [member(i, group="p") for i in range(4)])
    assert sorted(masked(pair)) == [0, 1]


async def test_circular_cut_twice_masks_the_smaller_arc_with_reasons(
    autojump_clock: MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    n = 8
    judge = ScriptedJudge(pairs={("a0", "a1"): http_error(), ("a3", "a4"): http_error()})
    async with running(settings(num_rollouts_per_prompt=n, **COMPONENT), judge) as engine:
        replies = await gather(engine, [member(i) for i in range(n)])
    where = (
        "is outside the largest connected component of the comparison graph (5 of 8 rollouts "
        "are in it; 2 of 8 comparisons failed)"
    )
    assert masked(replies) == {
        1: f"GenRM rollout_index=1 {where} and lost a comparison to a judge failure: "
        + judge_error((0, 1)),
        2: f"GenRM rollout_index=2 {where}; it lost no comparison, failures elsewhere cut it off: "
        + judge_error((0, 1)),
        3: f"GenRM rollout_index=3 {where} and lost a comparison to a judge failure: "
        + judge_error((3, 4)),
    }
    rows = scored(replies)
    assert sorted(rows) == [0, 4, 5, 6, 7]
    assert rows[0]["genrm_masked_rollout_rate_per_group"] == 3 / 8
    assert rows[0]["genrm_failed_comparison_rate_per_group"] == 2 / 8
    # member 0 is scored from its one successful comparison (7,0); member 4 from (4,5)
    assert rows[0]["reward"] == 1.0 and rows[4]["reward"] == 5.0
    assert sum("GenRM masked one rollout" in r.getMessage() for r in caplog.records) == 3


async def test_every_comparison_failed_fails_the_group_under_component(
    autojump_clock: MockClock,
) -> None:
    judge = ScriptedJudge(script=lambda r1, r2, n: http_error())
    async with running(settings(num_rollouts_per_prompt=3, **COMPONENT), judge) as engine:
        replies = await gather(engine, [member(i) for i in range(3)])
    message = (
        "GenRM masked every rollout of the group after judge failures (3 of 3 comparisons "
        "failed): " + judge_error((0, 1))
    )
    assert replies == [GroupFailed("judge", message)] * 3


async def test_mask_pending_under_component_keeps_a_connected_group(
    autojump_clock: MockClock,
) -> None:
    """The comparison still running at the deadline counts as failed, and the rest of the
    circle still connects everyone."""
    judge = ScriptedJudge(pairs={("a0", "a1"): hang()})
    config = settings(
        num_rollouts_per_prompt=4,
        cohort_evaluation_timeout_s=0.5,
        judge_request_timeout_s=5.0,
        evaluation_deadline_policy="mask_pending",
        **COMPONENT,
        **BT,
    )
    t0 = trio.current_time()
    async with running(config, judge) as engine:
        replies = await gather(engine, [member(i) for i in range(4)])
        assert trio.current_time() - t0 == pytest.approx(0.5)
    rows = scored(replies)
    assert sorted(rows) == [0, 1, 2, 3]
    assert rows[0]["genrm_failed_comparison_rate_per_group"] == 0.25
    assert rows[0]["genrm_masked_rollout_rate_per_group"] == 0.0


async def test_escalation_with_both_keys(autojump_clock: MockClock) -> None:
    """An exhausted first attempt escalates and then answers: nothing fails, and the rows carry
    the escalation rate beside the Bradley–Terry keys."""
    judge = ScriptedJudge(
        pairs={("a0", "a1"): [Step(text="", status=ReplyStatus.BUDGET_EXHAUSTED), Step()]}
    )
    config = settings(
        num_rollouts_per_prompt=4,
        genrm_parse_retries=1,
        judge={"budget_escalation": {}},
        **BT,
        **COMPONENT,
    )
    async with running(config, judge) as engine:
        replies = await gather(engine, [member(i) for i in range(4)])
    rows = scored(replies)
    assert sorted(rows) == [0, 1, 2, 3]
    assert rows[0]["genrm_budget_escalation_rate_per_group"] == 0.25
    assert BT_LOG_LIKELIHOOD in rows[0]
    budgets = [c.call.max_output_tokens for c in judge.calls if c.shown == ("a0", "a1")]
    assert budgets == [16384, 32768]
    assert len(judge.calls) == 5


async def test_a_fleet_of_judges_gives_the_same_rewards(autojump_clock: MockClock) -> None:
    """Replica b answers 500 to everything, so every comparison it gets is retried on a; the
    rewards are those of one healthy judge."""
    healthy, broken = ScriptedJudge(), ScriptedJudge(script=lambda r1, r2, n: http_error())
    fleet = JudgeFleet([("http://a:8000/v1", healthy), ("http://b:8000/v1", broken)])
    config = settings(
        num_rollouts_per_prompt=4,
        comparison_strategy="all_pairs",
        genrm_parse_retries=2,
        **BT,
        **COMPONENT,
    )
    async with open_engine(config, fleet) as engine:
        replies = await gather(engine, [member(i) for i in range(4)])
    rows = scored(replies)
    expected = aggregate(
        member_oriented(4, "all_pairs", 1, "none"), [0, 1, 2, 3], {}, **NO_ADJ,
        method="bradley_terry",
    )  # fmt: skip
    assert {m: rows[m]["reward"] for m in rows} == expected.final
    assert len(healthy.calls) == 6


# --- /compare ------------------------------------------------------------------------------------


async def test_compare_with_bradley_terry(autojump_clock: MockClock) -> None:
    config = settings(comparison_strategy="all_pairs", **BT)
    judge = ScriptedJudge(latency=0.05)
    t0 = trio.current_time()
    async with running(config, judge) as engine:
        result = await engine.compare(compare_input(["a0", "a1", "a2"]))
        assert trio.current_time() - t0 == pytest.approx(0.05)
    expected = aggregate(
        member_oriented(3, "all_pairs", 1, "none"), [0, 1, 2], {}, **NO_ADJ,
        method="bradley_terry",
    )  # fmt: skip
    assert result.rewards == [expected.final[m] for m in range(3)]
    assert result.metrics is not None
    assert result.metrics[BT_LOG_LIKELIHOOD] == expected.method_metrics[BT_LOG_LIKELIHOOD]
    assert result.metrics[CYCLE_RATE] == 0.0
    assert result.metrics["tiebreak_usage_rate"] == 0.0  # D10 metrics are kept
    assert "genrm_failed_comparison_rate_per_group" not in result.metrics
    assert len(judge.calls) == 3


async def test_compare_ignores_mask_policy_and_stays_fail_fast(autojump_clock: MockClock) -> None:
    from judges import compare

    from genrm_trio.domain.model import CompareFailed

    judge = ScriptedJudge(pairs={("a0", "a1"): http_error()})
    config = settings(comparison_strategy="all_pairs", **BT, **COMPONENT)
    async with running(config, judge) as engine:
        result = await compare(engine, compare_input(["a0", "a1", "a2"]))
    assert isinstance(result, CompareFailed) and str(result) == judge_error((0, 1))


async def test_the_singleton_path_is_unchanged_under_both_keys(autojump_clock: MockClock) -> None:
    judge = ScriptedJudge()
    config = settings(num_rollouts_per_prompt=1, **BT, **COMPONENT)
    async with running(config, judge) as engine:
        [reply] = await gather(engine, [member(0)])
    assert isinstance(reply, Scored) and reply.result["reward"] == 3.0
    assert BT_LOG_LIKELIHOOD not in reply.result and CYCLE_RATE not in reply.result
    assert judge.calls == []
