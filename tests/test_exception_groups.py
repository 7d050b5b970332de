"""Exception groups read whole (genrm_trio.engine.exceptions): `/compare` unwraps a group of one
leaf at any depth and nothing else; a failed cohort's log shows every leaf."""

from __future__ import annotations

import logging

import pytest
from judges import ScriptedJudge, Step, compare_input, gather, member, running, settings
from trio.testing import MockClock

from genrm_trio.domain.model import GroupFailed
from genrm_trio.engine.exceptions import leaves, sole_leaf


def test_leaves_are_read_depth_first_through_nested_groups() -> None:
    a, b, c = RuntimeError("a"), ValueError("b"), KeyError("c")
    nested = ExceptionGroup("outer", [ExceptionGroup("inner", [a, b]), c])
    assert leaves(nested) == [a, b, c]
    assert leaves(a) == [a]
    assert sole_leaf(nested) is None
    assert sole_leaf(ExceptionGroup("x", [ExceptionGroup("y", [ExceptionGroup("z", [b])])])) is b
    assert sole_leaf(c) is c


async def test_compare_unwraps_a_nested_group_of_one_leaf(autojump_clock: MockClock) -> None:
    deep = ExceptionGroup("judge", [ExceptionGroup("inner", [RuntimeError("only")])])
    judge = ScriptedJudge(pairs={("a0", "a1"): Step(error=deep)})
    async with running(settings(), judge) as engine:
        with pytest.raises(RuntimeError, match="only") as raised:
            await engine.compare(compare_input(["a0", "a1"]))
    assert isinstance(raised.value.__cause__, BaseExceptionGroup)


async def test_compare_keeps_a_group_of_several_leaves_whole(autojump_clock: MockClock) -> None:
    # One top-level exception that holds two leaves: unwrapping by the top-level count alone
    # would have raised the first leaf and lost the second.
    two = ExceptionGroup("judge", [RuntimeError("first"), ValueError("second")])
    judge = ScriptedJudge(pairs={("a0", "a1"): Step(error=two)})
    async with running(settings(), judge) as engine:
        with pytest.raises(BaseExceptionGroup) as raised:
            await engine.compare(compare_input(["a0", "a1"]))
    found = leaves(raised.value)
    assert [type(e) for e in found] == [RuntimeError, ValueError]
    assert [str(e) for e in found] == ["first", "second"]


async def test_a_failed_cohort_logs_every_leaf(
    autojump_clock: MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    two = ExceptionGroup("judge", [RuntimeError("first bug"), ValueError("second bug")])
    judge = ScriptedJudge(pairs={("a0", "a1"): Step(error=two)})
    async with running(settings(), judge) as engine:
        replies = await gather(engine, [member(0), member(1)])
    for reply in replies:
        assert isinstance(reply, GroupFailed) and reply.kind == "cohort"
        assert reply.message == "GenRM cohort evaluation failed: RuntimeError: first bug"
    logged = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert [r.getMessage() for r in logged] == [
        "GenRM cohort evaluation failed for key='group_id::g::group_attempt::0' (1 of 2 errors)",
        "GenRM cohort evaluation failed for key='group_id::g::group_attempt::0' (2 of 2 errors)",
    ]
    assert [str(r.exc_info[1]) for r in logged if r.exc_info] == ["first bug", "second bug"]
