"""Huge finite verdicts through the engine: the non-finite check, not an OverflowError.

With ``validate_verdict_range: false`` a judge may return ``score_1: 1e308``. Aggregation then
overflows to inf (it used to raise ``OverflowError: intermediate overflow in fsum`` first), and
the engine's post-check fails the cohort with the exact message of docs/scoring.md section 7.
"""

from __future__ import annotations

from judges import ScriptedJudge, Step, gather, member, running, settings
from trio.testing import MockClock

from genrm_trio.domain.model import GroupFailed

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
