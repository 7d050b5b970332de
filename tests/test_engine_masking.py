"""Partial masking (docs/differences.md, docs/scoring.md section 4): the partial-masking PR's
validation cases, the worked examples, judge failures and the failsafe, and the mask_pending
deadline policy (D12)."""

from __future__ import annotations

import logging

import pytest
import trio
from judges import (
    ScriptedJudge,
    Step,
    boom,
    connect_error,
    gather,
    hang,
    http_error,
    judge_error,
    masked,
    member,
    ok,
    running,
    scored,
    settings,
    verify,
)
from trio.testing import MockClock

from genrm_trio.domain.model import GroupFailed, Masked, Rejection, RequestRejected, Scored
from genrm_trio.engine.engine import open_engine
from genrm_trio.judge.base import JudgeHTTPError, ReplyStatus


def masked_reason(i: int, f: int, c: int, pair: tuple[int, int]) -> str:
    return (
        f"GenRM rollout_index={i} lost a comparison to a judge failure "
        f"({f} of {c} comparisons failed): {judge_error(pair)}"
    )


def failing(*pairs: tuple[int, int]) -> ScriptedJudge:
    """Default verdicts, except that the shown pairs (i, j) of answers a{i}/a{j} fail with 500."""
    return ScriptedJudge(pairs={(f"a{i}", f"a{j}"): http_error() for i, j in pairs})


class TimedLog(logging.Handler):
    """Records (virtual seconds since t0, message) for every genrm_trio record."""

    def __init__(self, t0: float) -> None:
        super().__init__(logging.DEBUG)
        self.t0 = t0
        self.lines: list[tuple[float, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append((round(trio.current_time() - self.t0, 9), record.getMessage()))


# --- the partial-masking PR's validation cases ---------------------------------------------------


async def test_1_sixteen_circular_one_failure_masks_exactly_two(autojump_clock: MockClock) -> None:
    n = 16
    async with running(settings(num_rollouts_per_prompt=n), ScriptedJudge()) as engine:
        clean = scored(await gather(engine, [member(i, group="clean") for i in range(n)]))
    judge = failing((5, 6))
    async with running(settings(num_rollouts_per_prompt=n), judge) as engine:
        replies = await gather(engine, [member(i) for i in range(n)])
    assert masked(replies) == {
        5: masked_reason(5, 1, 16, (5, 6)),
        6: masked_reason(6, 1, 16, (5, 6)),
    }
    rows = scored(replies)
    assert sorted(rows) == [i for i in range(n) if i not in (5, 6)]
    for i, row in rows.items():
        assert row["reward"] == clean[i]["reward"]  # their own scores, from all comparisons
        assert row["genrm_failed_comparison_rate_per_group"] == 0.0625
        assert row["genrm_masked_rollout_rate_per_group"] == 0.125
    assert len(judge.calls) == 16
    assert engine.statistics().cohorts == 0


async def test_2_neighbours_of_masked_members_use_both_comparisons(
    autojump_clock: MockClock,
) -> None:
    """A position-biased judge: response_1 always 4, response_2 always 2. A member scored from
    both its circular comparisons averages 3.0; a dropped one would leave 4.0 or 2.0."""

    def biased(r1: str, r2: str, ordinal: int) -> Step | None:
        if (r1, r2) == ("a5", "a6"):
            return http_error()
        return ok(4.0, 2.0, 2.0)

    judge = ScriptedJudge(script=biased)
    async with running(settings(num_rollouts_per_prompt=16), judge) as engine:
        replies = await gather(engine, [member(i) for i in range(16)])
    rows = scored(replies)
    assert sorted(masked(replies)) == [5, 6]
    assert rows[4]["reward"] == 3.0 and rows[7]["reward"] == 3.0
    assert {row["reward"] for row in rows.values()} == {3.0}


async def test_3_two_non_adjacent_failures_mask_four(autojump_clock: MockClock) -> None:
    judge = failing((2, 3), (9, 10))
    async with running(settings(num_rollouts_per_prompt=16), judge) as engine:
        replies = await gather(engine, [member(i) for i in range(16)])
    assert sorted(masked(replies)) == [2, 3, 9, 10]
    assert masked(replies)[9] == masked_reason(9, 2, 16, (9, 10))
    for row in scored(replies).values():
        assert row["genrm_failed_comparison_rate_per_group"] == 0.125
        assert row["genrm_masked_rollout_rate_per_group"] == 0.25


async def test_4_adjacent_failures_then_exact_retry_replays(autojump_clock: MockClock) -> None:
    judge = failing((0, 1), (1, 2))
    async with running(settings(num_rollouts_per_prompt=4), judge) as engine:
        first = await gather(engine, [member(i) for i in range(4)])
        assert masked(first) == {
            0: masked_reason(0, 2, 4, (0, 1)),
            1: masked_reason(1, 2, 4, (0, 1)),  # the first failed comparison it lost (D31)
            2: masked_reason(2, 2, 4, (1, 2)),
        }
        assert sorted(scored(first)) == [3]
        assert engine.statistics().cohorts_by_state == {"partially_masked": 1}
        again = await gather(engine, [member(i) for i in range(4)])
        assert again == first
    assert len(judge.calls) == 4


async def test_5_masked_members_do_not_move_length_adjustments(autojump_clock: MockClock) -> None:
    answers = ["a0", "a1" + "x" * 50, "a2" + "x" * 10, "a3" + "x" * 20]
    judge = ScriptedJudge(pairs={(answers[0], answers[1]): http_error()})
    config = settings(num_rollouts_per_prompt=4, group_answer_length_penalty_coeff=1.0)
    async with running(config, judge) as engine:
        replies = await gather(engine, [member(i, answer=answers[i]) for i in range(4)])
    rows = scored(replies)
    assert sorted(rows) == [2, 3]
    assert rows[2]["reward_length_adjustment"] == 0.5
    assert rows[3]["reward_length_adjustment"] == -0.5
    assert rows[2]["reward"] == rows[2]["reward_score_raw"] + 0.5


async def test_6_all_pairs_one_failure_then_every_member_masked(autojump_clock: MockClock) -> None:
    config = settings(num_rollouts_per_prompt=4, comparison_strategy="all_pairs")
    judge = failing((0, 1))
    async with running(config, judge) as engine:
        replies = await gather(engine, [member(i) for i in range(4)])
    assert sorted(masked(replies)) == [0, 1]
    rows = scored(replies)
    # qualities 1..4; member 2 (q3) vs 0, 1, 3: scores 3, 3, 3 -> 3.0; member 3 (q4) -> 4.0
    assert (rows[2]["reward"], rows[3]["reward"]) == (3.0, 4.0)
    assert rows[2]["genrm_failed_comparison_rate_per_group"] == 1 / 6
    judge = failing((0, 1), (2, 3))
    async with running(config, judge) as engine:
        replies = await gather(engine, [member(i) for i in range(4)])
    message = (
        "GenRM masked every rollout of the group after judge failures (2 of 6 comparisons "
        f"failed): {judge_error((0, 1))}"
    )
    assert replies == [GroupFailed("judge", message)] * 4


async def test_7_every_comparison_fails_the_group(
    autojump_clock: MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    judge = failing((0, 1), (1, 2), (2, 3), (3, 0))
    async with running(settings(num_rollouts_per_prompt=4), judge) as engine:
        replies = await gather(engine, [member(i) for i in range(4)])
        assert engine.statistics().cohorts_by_state == {"failed": 1}
        masked_by = engine.metrics.masked_rollouts.labels
        # every rollout answered a failsafe row: counted, as masked with its whole group
        assert masked_by("alone")._value.get() == 0
        assert masked_by("whole_group")._value.get() == 4
        assert engine.metrics.failed_comparisons._value.get() == 4
    message = (
        "GenRM masked every rollout of the group after judge failures (4 of 4 comparisons "
        f"failed): {judge_error((0, 1))}"
    )
    assert replies == [GroupFailed("judge", message)] * 4
    assert "judge unavailable" in message
    lines = [r for r in caplog.records if "disposition=failed" in r.getMessage()]
    assert len(lines) == 1 and "kind=judge" in lines[0].getMessage()


async def test_8_non_judge_error_fails_everyone_and_cancels_comparisons(
    autojump_clock: MockClock,
) -> None:
    judge = ScriptedJudge(pairs={("a1", "a2"): boom("bad request", delay=0.05)}, latency=0.15)
    t0 = trio.current_time()
    async with running(settings(num_rollouts_per_prompt=4), judge) as engine:
        replies = await gather(engine, [member(i) for i in range(4)])
        assert trio.current_time() - t0 == pytest.approx(0.05)
    message = "GenRM cohort evaluation failed: RuntimeError: bad request"
    assert replies == [GroupFailed("cohort", message)] * 4
    cancelled = {c.shown for c in judge.calls if c.cancelled}
    assert cancelled == {("a0", "a1"), ("a2", "a3"), ("a3", "a0")}


@pytest.mark.parametrize("ender", ["non_judge_error", "group_deadline"])
async def test_9_failed_comparison_is_logged_when_it_fails(
    autojump_clock: MockClock, ender: str
) -> None:
    pairs: dict[tuple[str, str], Step] = {("a0", "a1"): http_error(delay=0.05)}
    if ender == "non_judge_error":
        pairs[("a1", "a0")] = boom("late bug", delay=0.1)
    else:
        pairs[("a1", "a0")] = hang()
    judge = ScriptedJudge(pairs=pairs)
    config = settings(cohort_evaluation_timeout_s=0.2, judge_request_timeout_s=5.0)
    t0 = trio.current_time()
    handler = TimedLog(t0)
    logger = logging.getLogger("genrm_trio")
    logger.addHandler(handler)
    try:
        async with running(config, judge) as engine:
            await gather(engine, [member(0), member(1)])
    finally:
        logger.removeHandler(handler)
    dropped = [(t, m) for t, m in handler.lines if "dropped comparison" in m]
    assert dropped == [
        (
            0.05,
            "GenRM dropped comparison (0, 1) (judge 0) of 2 after a judge failure: "
            "GenRM judge judge.test:8000 /v1/responses pair=(0, 1) deadline=5.0s: "
            "JudgeHTTPError: HTTP 500; response=judge unavailable",
        )
    ]
    ended = [t for t, m in handler.lines if "disposition=failed" in m]
    assert ended == [0.1 if ender == "non_judge_error" else 0.2]


async def test_10_late_requests_for_masked_and_scored_members(autojump_clock: MockClock) -> None:
    judge = failing((0, 1))
    async with running(settings(num_rollouts_per_prompt=4), judge) as engine:
        first = await gather(engine, [member(i) for i in range(4)])
        regenerated = await verify(engine, member(1, answer="new answer", rid="new-id"))
        assert regenerated == first[1] == Masked(masked_reason(1, 1, 4, (0, 1)))
        reply = await verify(engine, member(3, answer="new answer"))
        assert isinstance(reply, RequestRejected) and reply.reason is Rejection.CONFLICT
        assert "already has a different response for rollout_index=3" in reply.detail
        assert await verify(engine, member(3)) == first[3]
    assert len(judge.calls) == 4


async def test_12_fixed_baseline_failed_pass_masks_its_member(autojump_clock: MockClock) -> None:
    config = settings(
        num_rollouts_per_prompt=3, comparison_mode="fixed_baseline", num_judges_per_comparison=2
    )
    judge = ScriptedJudge(pairs={("a1", "base"): http_error(), ("base", "a1"): http_error()})
    async with running(config, judge) as engine:
        replies = await gather(engine, [member(i, baseline="base") for i in range(3)])
    assert sorted(masked(replies)) == [1]
    reason = masked(replies)[1]
    assert reason.startswith("GenRM rollout_index=1 lost a comparison to a judge failure (2 of 6")
    assert "pair=(1, 3)" in reason  # logged pair = (member, N)
    rows = scored(replies)
    assert sorted(rows) == [0, 2]
    # member m vs the baseline (quality 3): its own score averaged over its two passes
    assert (rows[0]["reward"], rows[2]["reward"]) == (1.0, 3.0)
    assert rows[0]["genrm_failed_comparison_rate_per_group"] == 2 / 6
    assert rows[0]["genrm_masked_rollout_rate_per_group"] == 1 / 3
    shown = sorted(c.shown for c in judge.calls)
    assert len(shown) == 6 and all("base" in pair for pair in shown)


async def test_12_fixed_baseline_singleton_is_judged_at_once(autojump_clock: MockClock) -> None:
    config = settings(num_rollouts_per_prompt=1, comparison_mode="fixed_baseline")
    judge = ScriptedJudge()
    async with running(config, judge) as engine:
        reply = await verify(engine, member(0, answer="a4", baseline="base"))
    assert isinstance(reply, Scored) and reply.result["reward"] == 5.0
    assert len(judge.calls) == 1


async def test_13_checkpoint_restores_masked_and_scored_without_judging(
    autojump_clock: MockClock,
) -> None:
    judge = failing((0, 1))
    config = settings(num_rollouts_per_prompt=4)
    async with running(config, judge) as engine:
        first = await gather(engine, [member(i) for i in range(4)])
        await gather(engine, [member(i, group="other") for i in range(4)])
        records = engine.terminal_records()
        watermarks = engine.watermark_records()
    assert [r.state for r in records] == ["partially_masked", "partially_masked"]
    masked_record = records[0].members[0]
    assert masked_record.masked_alone and masked_record.result is None
    assert masked_record.failure_reason == masked_reason(0, 1, 4, (0, 1))
    assert records[0].members[2].result == first[2].result
    fresh = ScriptedJudge()
    async with running(config, fresh) as engine:
        report = await engine.restore_records(records, watermarks)
        assert (report.added, report.unchanged, report.watermarks_updated) == (2, 0, 2)
        again = await engine.restore_records(records, watermarks)
        assert (again.added, again.unchanged, again.conflicts) == (0, 2, [])
        assert await gather(engine, [member(i) for i in range(4)]) == first
        assert await verify(engine, member(0, answer="regenerated")) == first[0]
        reply = await verify(engine, member(2, answer="regenerated"))
        assert isinstance(reply, RequestRejected) and reply.reason is Rejection.CONFLICT
        await gather(engine, [member(i, group="g", attempt=1) for i in range(4)])
        reply = await verify(engine, member(2))
        assert isinstance(reply, RequestRejected) and "superseded by attempt 1" in reply.detail
    assert len(fresh.calls) == 4  # only the new attempt was judged


# --- worked examples (docs/scoring.md section 4) --------------------------------------------------


async def test_worked_example_circular_one_failure(autojump_clock: MockClock) -> None:
    judge = ScriptedJudge(
        pairs={
            ("a0", "a1"): http_error(),
            ("a1", "a2"): ok(4, 2, 2),
            ("a2", "a3"): ok(3, 5, 5),
            ("a3", "a0"): ok(2, 4, 4),
        }
    )
    async with running(settings(num_rollouts_per_prompt=4), judge) as engine:
        replies = await gather(engine, [member(i) for i in range(4)])
    rows = scored(replies)
    assert sorted(masked(replies)) == [0, 1]
    assert (rows[2]["reward"], rows[3]["reward"]) == (2.5, 3.5)
    assert rows[2]["genrm_failed_comparison_rate_per_group"] == 0.25
    assert rows[2]["genrm_masked_rollout_rate_per_group"] == 0.5


async def test_worked_example_circular_two_failures(autojump_clock: MockClock) -> None:
    answers = [f"a{i}" + "x" * i for i in range(4)]
    judge = ScriptedJudge(
        pairs={
            (answers[0], answers[1]): http_error(),
            (answers[1], answers[2]): http_error(),
            (answers[2], answers[3]): ok(3, 5, 5),
            (answers[3], answers[0]): ok(2, 4, 4),
        }
    )
    config = settings(num_rollouts_per_prompt=4, group_answer_length_penalty_coeff=1.0)
    async with running(config, judge) as engine:
        replies = await gather(engine, [member(i, answer=answers[i]) for i in range(4)])
    assert sorted(masked(replies)) == [0, 1, 2]
    row = scored(replies)[3]
    assert row["reward"] == 3.5 and row["reward_length_adjustment"] == 0.0
    assert row["genrm_failed_comparison_rate_per_group"] == 0.5
    assert row["genrm_masked_rollout_rate_per_group"] == 0.75


# --- judge failures and the failsafe ------------------------------------------------------------


# (a 429 holds instead: tests/test_rate_limits.py)
@pytest.mark.parametrize(("status", "calls_each"), [(401, 1), (500, 2)])
async def test_judge_http_failure_never_completes_cohort(
    autojump_clock: MockClock, status: int, calls_each: int
) -> None:
    def offline(r1: str, r2: str, ordinal: int) -> Step:
        return Step(error=JudgeHTTPError(status, b"judge offline"))

    judge = ScriptedJudge(script=offline)
    config = settings(genrm_parse_retries=1)
    async with running(config, judge) as engine:
        replies = await gather(engine, [member(0), member(1)])
        assert isinstance(replies[0], GroupFailed) and replies[0].kind == "judge"
        assert replies == [replies[0]] * 2
        assert "judge offline" in replies[0].message and f"HTTP {status}" in replies[0].message
        assert "pair=(0, 1)" in replies[0].message and "deadline=0.2s" in replies[0].message
        assert await verify(engine, member(0, answer="regenerated")) == replies[0]
        assert len(judge.calls) == 2 * calls_each
        judge.script = None  # the judge is back: a new shared attempt recovers
        recovered = await gather(engine, [member(0, attempt=1), member(1, attempt=1)])
        assert [r.result["reward"] for r in recovered if isinstance(r, Scored)] == [1.0, 2.0]


async def test_judge_transport_failure_never_defaults(autojump_clock: MockClock) -> None:
    judge = ScriptedJudge(script=lambda r1, r2, n: connect_error())
    async with running(settings(), judge) as engine:
        replies = await gather(engine, [member(0), member(1)])
    assert isinstance(replies[0], GroupFailed) and replies[0].kind == "judge"
    assert "ConnectError: connection refused" in replies[0].message


@pytest.mark.parametrize("status", [ReplyStatus.UNUSABLE, ReplyStatus.BUDGET_EXHAUSTED])
async def test_unsuccessful_judge_reply_is_a_failure(
    autojump_clock: MockClock, status: ReplyStatus
) -> None:
    judge = ScriptedJudge(script=lambda r1, r2, n: Step(text="", status=status))
    async with running(settings(num_rollouts_per_prompt=4, genrm_parse_retries=3), judge) as e:
        replies = await gather(e, [member(i) for i in range(4)])
    assert isinstance(replies[0], GroupFailed) and replies[0].kind == "judge"
    assert "no completed answer after 4 attempts" in replies[0].message.lower()
    assert len(judge.calls) == 16  # 4 circular comparisons x 4 attempts, deterministic


async def test_explicit_judge_failure_requires_new_shared_attempt(
    autojump_clock: MockClock,
) -> None:
    judge = ScriptedJudge(script=lambda r1, r2, n: http_error())
    async with running(settings(num_rollouts_per_prompt=4), judge) as engine:
        first = await gather(engine, [member(i) for i in range(4)])
        reruns = await gather(engine, [member(i, answer=f"re{i}") for i in range(4)])
        assert reruns == first
        assert len(judge.calls) == 4
        judge.script = None
        recovered = await gather(engine, [member(i, attempt=1) for i in range(4)])
        assert all(isinstance(r, Scored) for r in recovered)
        assert len(judge.calls) == 8


async def test_legacy_masked_members_are_fenced_with_advice(autojump_clock: MockClock) -> None:
    """D33: a legacy cohort with a masked member keeps its record; masked slots answer their
    failure with the legacy advice, scored slots replay, a full rerun starts nothing new."""
    judge = failing((0, 1))
    async with running(settings(num_rollouts_per_prompt=4), judge) as engine:
        first = await gather(engine, [member(i, group=None) for i in range(4)])
        reason = first[0].reason
        assert reason.startswith(masked_reason(0, 1, 4, (0, 1)))
        assert "fresh _ng_group_id" in reason
        assert engine.statistics().cohorts_by_state == {"partially_masked": 1}
        rerun = await gather(engine, [member(i, group=None) for i in range(4)])
        assert rerun == first
        assert await verify(engine, member(0, group=None, answer="new")) == first[0]
    assert len(judge.calls) == 4


async def test_legacy_advice_survives_the_2000_character_cut(autojump_clock: MockClock) -> None:
    judge = ScriptedJudge(script=lambda r1, r2, n: Step(error=JudgeHTTPError(500, b"x" * 1000)))
    async with running(settings(), judge) as engine:
        replies = await gather(engine, [member(0, group=None), member(1, group=None)])
    assert isinstance(replies[0], GroupFailed)
    assert len(replies[0].message) <= 2000
    assert replies[0].message.endswith("could mix delayed answers with a replacement group.")


# --- D12 mask_pending ----------------------------------------------------------------------------


async def test_mask_pending_masks_only_the_running_comparisons(
    autojump_clock: MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    judge = ScriptedJudge(pairs={("a0", "a1"): hang()})
    config = settings(
        num_rollouts_per_prompt=4,
        cohort_evaluation_timeout_s=0.5,
        judge_request_timeout_s=5.0,
        evaluation_deadline_policy="mask_pending",
    )
    t0 = trio.current_time()
    async with running(config, judge) as engine:
        replies = await gather(engine, [member(i) for i in range(4)])
        assert trio.current_time() - t0 == pytest.approx(0.5)
        assert engine.metrics.deadline_failures.labels("evaluation")._value.get() == 1
        assert engine.metrics.failed_comparisons._value.get() == 1
    error = (
        "GenRM comparison (0, 1) (judge 0) was still running at the group deadline (0.5s) "
        "and was cancelled"
    )
    assert masked(replies) == {
        0: f"GenRM rollout_index=0 lost a comparison to a judge failure (1 of 4 comparisons "
        f"failed): {error}",
        1: f"GenRM rollout_index=1 lost a comparison to a judge failure (1 of 4 comparisons "
        f"failed): {error}",
    }
    assert sorted(scored(replies)) == [2, 3]
    assert [c.cancelled for c in judge.calls if c.shown == ("a0", "a1")] == [True]
    assert any(
        r.levelno == logging.WARNING
        and r.getMessage().endswith(error)
        and "dropped comparison (0, 1)" in r.getMessage()
        for r in caplog.records
    )


async def test_mask_pending_with_everything_pending_fails_the_group(
    autojump_clock: MockClock,
) -> None:
    judge = ScriptedJudge(script=lambda r1, r2, n: hang())
    config = settings(
        cohort_evaluation_timeout_s=0.5,
        judge_request_timeout_s=5.0,
        evaluation_deadline_policy="mask_pending",
    )
    async with running(config, judge) as engine:
        replies = await gather(engine, [member(0), member(1)])
    assert isinstance(replies[0], GroupFailed) and replies[0].kind == "judge"
    assert replies[0].message.startswith(
        "GenRM masked every rollout of the group after judge failures (2 of 2 comparisons "
        "failed): GenRM comparison (0, 1) (judge 0) was still running at the group deadline"
    )


@pytest.mark.parametrize("hanging", [2, 4])
async def test_the_evaluation_deadline_counts_the_group_once_under_mask_pending(
    autojump_clock: MockClock, hanging: int
) -> None:
    """`genrm_trio_deadline_failures_total{deadline="evaluation"}` counts groups (issue 36 item
    9): one group of 4 reaching its deadline with 2 or all 4 comparisons pending counts 1, as it
    does under fail_group, not one per pending comparison."""
    pending = [("a0", "a1"), ("a2", "a3"), ("a1", "a2"), ("a3", "a0")][:hanging]
    judge = ScriptedJudge(pairs={pair: hang() for pair in pending})
    config = settings(
        num_rollouts_per_prompt=4,
        cohort_evaluation_timeout_s=0.5,
        judge_request_timeout_s=5.0,
        evaluation_deadline_policy="mask_pending",
    )
    async with running(config, judge) as engine:
        await gather(engine, [member(i) for i in range(4)])
        assert engine.metrics.deadline_failures.labels("evaluation")._value.get() == 1
        assert engine.metrics.failed_comparisons._value.get() == hanging
    assert sum(c.cancelled for c in judge.calls) == hanging


async def test_fail_group_is_the_default_deadline_policy(autojump_clock: MockClock) -> None:
    judge = ScriptedJudge(pairs={("a0", "a1"): hang()})
    config = settings(
        num_rollouts_per_prompt=4, cohort_evaluation_timeout_s=0.5, judge_request_timeout_s=5.0
    )
    async with running(config, judge) as engine:
        replies = await gather(engine, [member(i) for i in range(4)])
    message = "GenRM cohort evaluation deadline exceeded after 0.5s"
    assert replies == [GroupFailed("judge", message)] * 4


async def test_judge_request_timeout_masks_when_it_fires_first(autojump_clock: MockClock) -> None:
    judge = ScriptedJudge(pairs={("a0", "a1"): hang()})
    config = settings(num_rollouts_per_prompt=4, judge_request_timeout_s=0.2)
    async with running(config, judge) as engine:
        replies = await gather(engine, [member(i) for i in range(4)])
    assert sorted(masked(replies)) == [0, 1]
    assert "TimeoutError: judge attempt exceeded 0.2s" in masked(replies)[0]


# --- position balance -----------------------------------------------------------------------------


async def test_alternate_flips_back_and_reports_disagreement(autojump_clock: MockClock) -> None:
    """N=2 circular, J=2, alternate: comparison (i, j, k) is shown swapped when i + j + k is odd,
    so pass 0 shows a1 first twice and pass 1 shows a0 first twice. A judge that always prefers
    the answer shown first disagrees with itself across orientations (rate 1.0), and flipping
    the verdicts back makes the two members equal."""
    config = settings(position_balance="alternate", num_judges_per_comparison=2)
    judge = ScriptedJudge(script=lambda r1, r2, n: ok(4, 2, 2))
    async with running(config, judge) as engine:
        replies = await gather(engine, [member(0), member(1)])
    rows = scored(replies)
    assert rows[0]["genrm_position_disagreement_rate_per_group"] == 1.0
    assert rows[0]["reward"] == rows[1]["reward"] == 3.0
    shown = sorted(c.shown for c in judge.calls)
    assert shown == [("a0", "a1"), ("a0", "a1"), ("a1", "a0"), ("a1", "a0")]


async def test_engine_metrics_count_masking(autojump_clock: MockClock) -> None:
    judge = failing((0, 1))
    async with open_engine(settings(num_rollouts_per_prompt=4), judge) as engine:
        await gather(engine, [member(i) for i in range(4)])
        text = engine.metrics.render().decode()
    assert 'genrm_trio_masked_rollouts_total{cause="alone"} 2.0' in text
    assert 'genrm_trio_masked_rollouts_total{cause="whole_group"} 0.0' in text
    assert "genrm_trio_failed_comparisons_total 1.0" in text
    assert 'genrm_trio_cohorts_terminal_total{state="partially_masked"} 1.0' in text
    assert 'genrm_trio_active_cohorts{state="judging"} 0.0' in text
