"""Exception groups read whole (genrm_trio.domain.exceptions, the one walker of every layer):
`/compare` unwraps a group of one leaf at any depth and nothing else; a failed cohort's log, the
judge's connection failure, `serve`'s error line and the demo's report show every leaf."""

from __future__ import annotations

import io
import logging

import pytest
from judges import ScriptedJudge, Step, compare_input, gather, member, running, settings
from rich.console import Console
from trio.testing import MockClock

from genrm_trio.domain.exceptions import describe, first_leaf, leaves, sole_leaf
from genrm_trio.domain.model import GroupFailed
from genrm_trio.judge.pool import connect_failure


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


# --- the one walker, used by every layer ------------------------------------------------------


def test_first_leaf_searches_every_nested_group() -> None:
    """The first leaf of a kind, even when the first nested group holds none of that kind (the
    CLI's old `_first` returned from that group and failed)."""
    wanted = KeyError("wanted")
    group = ExceptionGroup(
        "outer", [ExceptionGroup("inner", [ValueError("v")]), ExceptionGroup("x", [wanted])]
    )
    assert first_leaf(group, KeyError) is wanted
    assert first_leaf(group, ValueError) is group.exceptions[0].exceptions[0]
    assert first_leaf(group, TypeError) is None
    assert first_leaf(wanted, LookupError) is wanted  # a bare exception is its own leaf


def test_describe_names_every_leaf_on_one_line() -> None:
    group = BaseExceptionGroup(
        "g", [ExceptionGroup("i", [RuntimeError("a"), ValueError("")]), KeyboardInterrupt()]
    )
    assert describe(group) == "RuntimeError: a; ValueError; KeyboardInterrupt"
    assert describe(RuntimeError("only")) == "RuntimeError: only"


def test_a_connection_failure_names_every_address_reason() -> None:
    """judge/pool.py reads trio's nested connect errors with the same walker."""
    cause = ExceptionGroup(
        "connect",
        [ExceptionGroup("v6", [OSError("Network unreachable")]), OSError("Connection refused")],
    )
    error = OSError("all attempts to connect to judge:80 failed")
    error.__cause__ = cause
    assert connect_failure(error) == (
        "all attempts to connect to judge:80 failed: Network unreachable; Connection refused"
    )


def test_serve_reports_every_error_of_its_group(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A listen error nested beside an unexpected one: both are said, one line each."""
    from genrm_trio.app import cli, serve

    async def failing(settings: object, *, sim: bool) -> None:
        raise ExceptionGroup(
            "serve",
            [
                ExceptionGroup("inner", [RuntimeError("x"), ValueError("y")]),
                ExceptionGroup("bind", [serve.ListenError("127.0.0.1", 1, "in use")]),
            ],
        )

    monkeypatch.setattr(serve, "serve", failing)
    assert cli.run_service(lambda: settings()) == 1
    lines = capsys.readouterr().err.splitlines()
    assert "genrm-trio: cannot listen on 127.0.0.1:1: in use" in lines
    assert "genrm-trio: error: RuntimeError: x; ValueError: y" in lines


def test_a_failed_demo_shows_every_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from genrm_trio.app import demo

    async def failing(**kwargs: object) -> None:
        raise ExceptionGroup("demo", [ExceptionGroup("a", [RuntimeError("one")]), OSError("two")])

    monkeypatch.setattr(demo, "run_demo_groups", failing)
    out = io.StringIO()
    console = Console(file=out, width=200, force_terminal=False, color_system=None)
    assert demo.run_demo(console=console) == 1
    assert "demo FAILED: RuntimeError: one; OSError: two" in out.getvalue()
