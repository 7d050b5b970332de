"""A long judge reply is parsed in a worker thread, a short one on the loop (issue #40 item 3;
docs/reliability.md, "Security"): the loop runs meanwhile, the verdict is the inline one, and a
group's deadline ends the comparison on time while its parse is still running."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any

import pytest
import trio
import trio.lowlevel
import trio.testing
from comparator_rig import RUBRIC, Rig, reply
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scripted import Script

import genrm_trio.judge.attempts as attempts
import genrm_trio.judge.comparison as comparison
from genrm_trio.domain.verdict import Verdict, parse_overall
from genrm_trio.judge.base import ComparisonResult
from genrm_trio.judge.comparison import READ_OFF_LOOP_CHARS
from genrm_trio.judge.prompt_check import NO_VERDICT_REPLIES, PromptCheck

BOUND = 1000
VERDICT = '{"score_1": 4, "score_2": 2, "ranking": 1}'
# brace-dense text, the costliest to parse, ending in a verdict
LONG = "{}" * (READ_OFF_LOOP_CHARS // 2) + VERDICT
MAIN_THREAD = threading.get_ident()


def spying(monkeypatch: pytest.MonkeyPatch, before: Callable[[], None] = lambda: None) -> list[int]:
    """Replace the comparison's `parse_overall` with one that records the thread it runs in and
    calls `before` first; returns the recorded thread ids."""
    threads: list[int] = []

    def parse(text: str, **options: Any) -> Verdict:
        threads.append(threading.get_ident())
        before()
        return parse_overall(text, **options)

    monkeypatch.setattr(comparison, "parse_overall", parse)
    return threads


@pytest.mark.parametrize(
    ("chars", "off_loop"), [(READ_OFF_LOOP_CHARS, False), (READ_OFF_LOOP_CHARS + 1, True)]
)
async def test_only_a_reply_longer_than_the_threshold_leaves_the_loop(
    monkeypatch: pytest.MonkeyPatch, chars: int, off_loop: bool
) -> None:
    # No virtual clock here nor below: it would jump while the loop waits for the thread.
    text = " " * (chars - len(VERDICT)) + VERDICT
    assert len(text) == chars
    threads = spying(monkeypatch)
    rig = Rig(Script(reply(text)), genrm_parse_retries=0)
    with trio.fail_after(BOUND):
        result = await rig.compare()
    assert result.selected == Verdict(4, 2, 1)
    assert len(threads) == 1
    assert (threads[0] != MAIN_THREAD) is off_loop


async def test_the_loop_runs_while_a_long_reply_is_parsed(monkeypatch: pytest.MonkeyPatch) -> None:
    started = trio.Event()
    ticked = threading.Event()  # set by a task on the loop while the parse waits for it

    def wait_for_the_loop() -> None:
        # Parsed on the loop, this would raise (no trio thread) or block the ticker.
        trio.from_thread.run_sync(started.set)
        if not ticked.wait(10):
            pytest.fail("the loop was stalled")

    threads = spying(monkeypatch, wait_for_the_loop)
    rig = Rig(Script(reply(LONG)), genrm_parse_retries=0)
    ticks_while_parsing = 0

    async def ticker() -> None:
        nonlocal ticks_while_parsing
        await started.wait()
        for _ in range(5):  # the parse has started and is waiting: the loop still runs
            await trio.lowlevel.checkpoint()
            ticks_while_parsing += 1
        ticked.set()

    with trio.fail_after(BOUND):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(ticker)
            result = await rig.compare()
    assert ticks_while_parsing == 5
    assert threads != [] and threads[0] != MAIN_THREAD
    assert result.selected == parse_overall(
        LONG, default_score=3.0, default_ranking=3.5, validate_range=True
    )
    assert (result.selected, result.attempts) == (Verdict(4, 2, 1), 1)
    rig.assert_idle()


async def test_a_deadline_during_a_long_parse_ends_the_comparison_on_time(
    monkeypatch: pytest.MonkeyPatch, mock_clock: trio.testing.MockClock
) -> None:
    # A manual virtual clock: it moves only when the test says, once the parse is running.
    started = trio.Event()
    release = threading.Event()
    finished: list[bool] = []

    def held() -> None:
        trio.from_thread.run_sync(started.set)
        release.wait(10)
        finished.append(True)

    threads = spying(monkeypatch, held)
    rig = Rig(Script(reply(LONG), reply(LONG)), genrm_parse_retries=0)
    start = trio.current_time()
    async with trio.open_nursery() as nursery:

        async def group_deadline_passes() -> None:
            await started.wait()
            mock_clock.jump(30)

        nursery.start_soon(group_deadline_passes)
        with trio.move_on_at(start + 30) as group_deadline:
            await rig.compare()
    # cancelled at the deadline exactly, the parse still running in its abandoned thread
    assert group_deadline.cancelled_caught
    assert trio.current_time() == start + 30
    assert (len(threads), finished) == (1, [])
    rig.assert_idle()
    # The next long reply waits for the abandoned parse's limiter, then is parsed as usual.
    release.set()
    with trio.fail_after(BOUND):
        result = await rig.compare()
    assert finished == [True, True]
    assert (result.selected, rig.script.calls) == (Verdict(4, 2, 1), 2)


# --- the thread path gives the inline path's result ----------------------------------------------

_PIECES = st.sampled_from(
    [
        "{",
        "}",
        '"',
        "\\",
        " ",
        "prose ",
        "```json\n",
        "\n```",
        '"score_1": 5',
        '"score_2": 2,',
        '"ranking": 6',
        '"rubric_id": 1,',
        '"rubric_evaluations": [',
        "]",
        VERDICT,
        RUBRIC,
        '{"score_1": "NaN"}',
        '{"overall": {"score_1": 1, "ranking": 3}}',
    ]
)


def _compare(text: str, *, rubric: bool, status: str) -> ComparisonResult | str:
    """One comparison of a judge answering `text` (one attempt), or its error's text."""

    async def run() -> ComparisonResult | str:
        overrides: dict[str, Any] = {"genrm_parse_retries": 0}
        if rubric:
            overrides["score_source"] = "rubric_mean"
        extra: dict[str, Any] = {}
        if status == "incomplete":
            extra["incomplete_details"] = {"reason": "max_output_tokens"}
        rig = Rig(Script(reply(text, status=status, **extra)), **overrides)
        try:
            return await rig.compare(expected_rubric_ids=[1, 2] if rubric else None)
        except Exception as error:  # the failure is part of what must match
            return str(error)

    return trio.run(run)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    pieces=st.lists(_PIECES, max_size=30),
    rubric=st.booleans(),
    status=st.sampled_from(["completed", "incomplete"]),
)
def test_the_thread_path_equals_the_inline_path(
    monkeypatch: pytest.MonkeyPatch, pieces: list[str], rubric: bool, status: str
) -> None:
    text = "".join(pieces)
    threads = spying(monkeypatch)
    inline = _compare(text, rubric=rubric, status=status)
    assert set(threads) <= {MAIN_THREAD}
    threads.clear()
    with monkeypatch.context() as patch:
        patch.setattr(attempts, "READ_OFF_LOOP_CHARS", -1)  # every reply off the loop
        off_loop = _compare(text, rubric=rubric, status=status)
    assert MAIN_THREAD not in threads
    assert off_loop == inline


# --- the prompt check, which runs on the loop, never parses a long reply -----------------------


@pytest.mark.parametrize(
    ("text", "verdict"),
    [
        ("{" * (READ_OFF_LOOP_CHARS + 1), False),
        ("{" * READ_OFF_LOOP_CHARS + '"ranking"', True),  # a key named: the prompt was read
    ],
)
def test_the_prompt_check_reads_a_long_reply_for_its_keys_only(
    monkeypatch: pytest.MonkeyPatch, text: str, verdict: bool
) -> None:
    import genrm_trio.judge.prompt_check as prompt_check

    def never(text: str, **options: Any) -> Verdict:
        raise AssertionError("a long reply was parsed on the loop")

    monkeypatch.setattr(prompt_check, "parse_overall", never)
    check = PromptCheck()
    for _ in range(NO_VERDICT_REPLIES):
        check.observe_text(text)
    assert (check.finding is None) is verdict
    assert not check.watching  # a verdict or a finding: either ends the watch


def test_the_prompt_check_parses_a_short_reply() -> None:
    check = PromptCheck()
    assert check.observe_text(" ranking " * 10) is None  # named, but no verdict: no evidence
    assert check.watching
    assert check.observe_text(json.dumps({"ranking": 2})) is None
    assert not check.watching
