"""`/compare` (docs/http-api.md, D40, D27): defaults, rows, metrics, fail-fast."""

from __future__ import annotations

import pytest
import trio
from judges import (
    ScriptedJudge,
    Step,
    boom,
    compare,
    compare_input,
    hang,
    http_error,
    judge_error,
    ok,
    running,
    settings,
)
from trio.testing import MockClock

from genrm_trio.domain.model import CompareFailed, CompareResult, Rejection, RequestRejected
from genrm_trio.engine.evaluation import NON_FINITE_MESSAGE
from genrm_trio.judge.base import ReplyStatus


async def test_single_response_returns_default(autojump_clock: MockClock) -> None:
    judge = ScriptedJudge()
    async with running(settings(default_score=3.0), judge) as engine:
        result = await engine.compare(compare_input(["only"]))
        assert result == CompareResult([3.0], None, None)
        assert await engine.compare(compare_input([])) == CompareResult([], None, None)
    assert judge.calls == []


async def test_two_answers_rows_and_metrics(autojump_clock: MockClock) -> None:
    judge = ScriptedJudge(
        pairs={("x", "y"): ok(3, 3, 3.5, tokens=20), ("y", "x"): ok(3, 3, 3.5, tokens=40)}
    )
    async with running(settings(), judge) as engine:
        result = await engine.compare(compare_input(["x", "y"]))
    assert result.rewards == [3.0, 3.0]
    assert result.comparison_results == [
        {
            "response_i": 0,
            "response_j": 1,
            "judge_idx": 0,
            "score_1": 3,
            "score_2": 3,
            "ranking": 3.5,
        },
        {
            "response_i": 1,
            "response_j": 0,
            "judge_idx": 0,
            "score_1": 3,
            "score_2": 3,
            "ranking": 3.5,
        },
    ]
    assert result.metrics == {
        "mean_individual_score": 3.0,
        "std_individual_score": 0.0,
        "tiebreak_usage_rate": 1.0,
        "genrm_parse_failure_rate_per_group": 0.0,
        "genrm_rubric_parse_failure_rate_per_group": 0.0,
        "genrm_input_tokens_per_comparison_mean": 100.0,
        "genrm_input_tokens_per_comparison_p50": 100.0,
        "genrm_input_tokens_per_comparison_p95": 100.0,
        "genrm_output_tokens_per_comparison_mean": 30.0,
        "genrm_output_tokens_per_comparison_p50": 30.0,
        "genrm_output_tokens_per_comparison_p95": 39.0,
        "genrm_output_tokens_total_per_group": 60.0,
        "genrm_max_output_tokens_hit_rate_per_group": 0.0,
    }


async def test_compare_uses_strategy_judges_and_alternate(autojump_clock: MockClock) -> None:
    config = settings(
        comparison_strategy="all_pairs", num_judges_per_comparison=2, position_balance="alternate"
    )
    judge = ScriptedJudge()
    async with running(config, judge) as engine:
        result = await engine.compare(compare_input(["a0", "a1", "a2"]))
    assert result.comparison_results is not None
    rows = result.comparison_results
    assert [(r["response_i"], r["response_j"], r["judge_idx"]) for r in rows] == [
        (0, 1, 0), (0, 2, 0), (1, 2, 0), (0, 1, 1), (0, 2, 1), (1, 2, 1)
    ]  # fmt: skip
    # member orientation after the flip back: score_1 is always response_i's quality
    assert [r["score_1"] for r in result.comparison_results] == [1, 1, 2, 1, 1, 2]
    assert result.metrics is not None
    assert result.metrics["genrm_position_disagreement_rate_per_group"] == 0.0
    assert "genrm_failed_comparison_rate_per_group" not in result.metrics
    assert len(judge.calls) == 6
    shown = {c.shown for c in judge.calls}
    assert ("a1", "a0") in shown and ("a0", "a1") in shown


async def test_judge_failure_is_503_with_the_judge_message(autojump_clock: MockClock) -> None:
    judge = ScriptedJudge(pairs={("a0", "a1"): http_error()})
    async with running(settings(), judge) as engine:
        failed = await compare(engine, compare_input(["a0", "a1"]))
    assert isinstance(failed, CompareFailed) and failed.detail == judge_error((0, 1))


@pytest.mark.parametrize("status", [ReplyStatus.UNUSABLE, ReplyStatus.BUDGET_EXHAUSTED])
async def test_unsuccessful_reply_is_503(autojump_clock: MockClock, status: ReplyStatus) -> None:
    judge = ScriptedJudge(script=lambda r1, r2, n: Step(text="", status=status))
    async with running(settings(), judge) as engine:
        failed = await compare(engine, compare_input(["a0", "a1"]))
    assert isinstance(failed, CompareFailed)
    assert "no completed answer after 1 attempts" in failed.detail.lower()


async def test_fail_fast_one_failing_one_pending(autojump_clock: MockClock) -> None:
    """The partial-masking PR reviewer's regression test: the 503 comes when the first comparison
    fails, at that virtual time, and the pending comparison is cancelled."""
    judge = ScriptedJudge(
        pairs={("a0", "a1"): http_error(delay=0.05), ("a1", "a0"): Step(delay=0.19)}
    )
    t0 = trio.current_time()
    async with running(settings(), judge) as engine:
        failed = await compare(engine, compare_input(["a0", "a1"]))
        assert trio.current_time() - t0 == pytest.approx(0.05)
        assert engine.statistics().compares_in_flight == 0
    assert isinstance(failed, CompareFailed) and failed.detail == judge_error((0, 1))
    [pending] = [c for c in judge.calls if c.shown == ("a1", "a0")]
    assert pending.cancelled and pending.ended is None


async def test_non_judge_error_propagates_and_cancels_siblings(autojump_clock: MockClock) -> None:
    judge = ScriptedJudge(pairs={("a0", "a1"): boom("bug", delay=0.05), ("a1", "a0"): hang()})
    config = settings(judge_request_timeout_s=5.0)
    async with running(config, judge) as engine:
        with pytest.raises(RuntimeError, match="bug"):
            await engine.compare(compare_input(["a0", "a1"]))
    [pending] = [c for c in judge.calls if c.shown == ("a1", "a0")]
    assert pending.cancelled


async def test_compare_deadline(autojump_clock: MockClock) -> None:
    judge = ScriptedJudge(script=lambda r1, r2, n: hang())
    config = settings(cohort_evaluation_timeout_s=0.5, judge_request_timeout_s=5.0)
    t0 = trio.current_time()
    async with running(config, judge) as engine:
        failed = await compare(engine, compare_input(["a0", "a1"]))
        assert trio.current_time() - t0 == pytest.approx(0.5)
        assert engine.metrics.deadline_failures.labels("compare")._value.get() == 1
    assert isinstance(failed, CompareFailed)
    assert failed.detail == "GenRM compare deadline exceeded after 0.5s"
    assert all(c.cancelled for c in judge.calls)


async def test_compare_during_and_after_shutdown(autojump_clock: MockClock) -> None:
    judge = ScriptedJudge(script=lambda r1, r2, n: hang())
    config = settings(judge_request_timeout_s=5.0, cohort_evaluation_timeout_s=5.0)
    async with running(config, judge) as engine:
        async with trio.open_nursery() as nursery:
            replies: list[object] = []

            async def send() -> None:
                replies.append(await compare(engine, compare_input(["a0", "a1"])))

            nursery.start_soon(send)
            await trio.sleep(0.1)
            assert engine.statistics().compares_in_flight == 1
            await engine.aclose()
        assert [getattr(r, "detail", r) for r in replies] == ["GenRM server is shutting down"]
        after = await compare(engine, compare_input(["a0", "a1"]))
        assert isinstance(after, CompareFailed) and after.detail == "GenRM server is shutting down"


async def test_rubric_mean_requires_ids(autojump_clock: MockClock) -> None:
    async with running(settings(score_source="rubric_mean"), ScriptedJudge()) as engine:
        with pytest.raises(RequestRejected) as caught:
            await engine.compare(compare_input(["a0", "a1"]))
    assert caught.value.reason is Rejection.INVALID
    assert caught.value.detail == "score_source=rubric_mean requires expected_rubric_ids"


async def test_compare_ignores_fixed_baseline_mode(autojump_clock: MockClock) -> None:
    judge = ScriptedJudge()
    async with running(settings(comparison_mode="fixed_baseline"), judge) as engine:
        result = await engine.compare(compare_input(["a0", "a1"]))
    assert result.rewards == [1.0, 2.0]
    assert sorted(c.shown for c in judge.calls) == [("a0", "a1"), ("a1", "a0")]


async def test_principle_reaches_the_judge_only_when_enabled(autojump_clock: MockClock) -> None:
    judge = ScriptedJudge()
    async with running(settings(use_principle=True, default_principle="P0"), judge) as engine:
        await engine.compare(compare_input(["a0", "a1"], principle="be brief"))
        await engine.compare(compare_input(["a0", "a1"]))
    assert [c.call.principle for c in judge.calls] == ["be brief", "be brief", "P0", "P0"]
    judge = ScriptedJudge()
    async with running(settings(), judge) as engine:
        await engine.compare(compare_input(["a0", "a1"], principle="be brief"))
    assert [c.call.principle for c in judge.calls] == [None, None]


@pytest.mark.parametrize(("coeff", "rewards"), [(0.0, [3.0, 3.0]), (1.0, [3.5, 2.5])])
async def test_style_penalty_is_applied_only_when_on(
    autojump_clock: MockClock, coeff: float, rewards: list[float]
) -> None:
    plain, styled = "plain answer", "# Title\n- item\n**bold**"
    judge = ScriptedJudge(pairs={(plain, styled): ok(3, 3, 3.5), (styled, plain): ok(3, 3, 3.5)})
    async with running(settings(group_style_penalty_coeff=coeff), judge) as engine:
        result = await engine.compare(compare_input([plain, styled]))
    assert result.rewards == rewards  # docs/scoring.md 3 (c): +0.5 / -0.5 at coeff 1


async def test_non_finite_rewards_are_a_503_not_an_internal_error(
    autojump_clock: MockClock,
) -> None:
    # Unvalidated absurd verdicts overflow the reward sums: the reply could not be JSON.
    judge = ScriptedJudge(script=lambda r1, r2, n: ok(1e308, 1e308, 3.5))
    config = settings(validate_verdict_range=False, num_rollouts_per_prompt=4)
    async with running(config, judge) as engine:
        failed = await compare(engine, compare_input(["a0", "a1", "a2", "a3"]))
    assert isinstance(failed, CompareFailed)
    assert failed.detail.startswith(NON_FINITE_MESSAGE)
    assert len(judge.calls) == 4  # every comparison ran; nothing is retried
