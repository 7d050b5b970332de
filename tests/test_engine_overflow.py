"""Huge finite verdicts through the engine: the non-finite check, not an OverflowError.

With ``validate_verdict_range: false`` a judge may return ``score_1: 1e308``. Aggregation then
overflows to inf (it used to raise ``OverflowError: intermediate overflow in fsum`` first), and
the engine's post-check fails the cohort with the exact message of docs/scoring.md section 7.
"""

from __future__ import annotations

import json
import math

from judges import ScriptedJudge, Step, gather, member, running, settings
from trio.testing import MockClock

from genrm_trio.domain.model import GroupFailed, Scored

NON_FINITE = "GenRM cohort evaluation failed: ValueError: GenRM returned non-finite cohort rewards"
HUGE = '{"score_1": 1e308, "score_2": 1e308, "ranking": 1}'


def huge_judge() -> ScriptedJudge:
    return ScriptedJudge(script=lambda r1, r2, n: Step(text=HUGE))


async def test_huge_scores_fail_the_cohort_as_non_finite(autojump_clock: MockClock) -> None:
    judge = huge_judge()
    config = settings(validate_verdict_range=False)
    async with running(config, judge) as engine:
        replies = await gather(engine, [member(0), member(1)])
    assert replies == [GroupFailed("cohort", NON_FINITE)] * 2
    assert len(judge.calls) == 2  # one call per comparison: a verdict, not a parse retry


async def test_huge_scores_in_a_circular_group_of_four(autojump_clock: MockClock) -> None:
    judge = huge_judge()
    config = settings(validate_verdict_range=False, num_rollouts_per_prompt=4)
    async with running(config, judge) as engine:
        replies = await gather(engine, [member(i) for i in range(4)])
    assert replies == [GroupFailed("cohort", NON_FINITE)] * 4
    assert len(judge.calls) == 4


async def test_huge_scores_are_rejected_by_the_default_range_check(
    autojump_clock: MockClock,
) -> None:
    # validate_verdict_range: true (default) refuses the candidate: parse failure → fallback
    judge = huge_judge()
    async with running(settings(default_score=3.0), judge) as engine:
        replies = await gather(engine, [member(0), member(1)])
    assert all(not isinstance(r, GroupFailed) for r in replies), replies


def rubric_verdict(overall: float) -> str:
    """Rubric scores of a normal size beside an overall verdict of ``overall``."""
    return json.dumps(
        {
            "rubric_evaluations": [{"rubric_id": 1, "score_1": 4, "score_2": 2, "ranking": 2}],
            "overall": {"score_1": overall, "score_2": overall, "ranking": 1},
        }
    )


async def test_every_float_of_a_verify_row_is_checked(autojump_clock: MockClock) -> None:
    """Under `score_source: rubric_mean` the reward comes from finite rubric scores while a huge
    overall verdict overflows `reward_overall_score`: the row could not be encoded, so the group
    fails as non-finite (as `/compare` checks every float of its reply), not only on the reward."""
    judge = ScriptedJudge(script=lambda r1, r2, n: Step(text=rubric_verdict(1e308)))
    config = settings(validate_verdict_range=False, score_source="rubric_mean")
    async with running(config, judge) as engine:
        replies = await gather(engine, [member(i, rubric_ids=(1,)) for i in range(2)])
    assert replies == [GroupFailed("cohort", NON_FINITE)] * 2
    assert len(judge.calls) == 2


async def test_a_large_finite_overall_verdict_still_scores(autojump_clock: MockClock) -> None:
    """The same verdicts with an overall score that stays finite give rows (the check is on
    what the row holds, not on the verdict's size)."""
    judge = ScriptedJudge(script=lambda r1, r2, n: Step(text=rubric_verdict(1e300)))
    config = settings(validate_verdict_range=False, score_source="rubric_mean")
    async with running(config, judge) as engine:
        replies = await gather(engine, [member(i, rubric_ids=(1,)) for i in range(2)])
    for reply in replies:
        assert isinstance(reply, Scored)
        floats = [v for v in reply.result.values() if type(v) is float]
        assert all(math.isfinite(v) for v in floats)
        json.dumps(dict(reply.result), allow_nan=False)  # the row can be sent: no ValueError
