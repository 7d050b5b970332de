"""Random eager-comparison scenarios and their run in virtual time, shared by the eager
property tests (tests/test_engine_eager_properties.py, tests/test_engine_eager_graph_keys.py).

A scenario is a group (size, comparison graph, judge passes, position balance, fixed baseline,
attempts, judge slots; every value of each key, derived from the settings), an arrival order and
times, and a verdict outcome per shown pair (a verdict, a
judge failure, an unparsable reply, or a first attempt answered 503 with or without a
`Retry-After` that may or may not fit the group deadline, then a verdict) with a latency, so
that the 503 comes at any point of collection; `run` plays it with eager starts on or off.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, get_args

import trio
from graph_keys import graphs
from hypothesis import strategies as st
from judges import Reply, ScriptedJudge, Step, assert_no_leaks, http_error, member, ok, verify
from judges import settings as make_settings
from trio.testing import MockClock

from genrm_trio.config import PositionBalance, Settings
from genrm_trio.engine.engine import open_engine
from genrm_trio.judge.base import JudgeHTTPError

Outcome = tuple[str, float, tuple[float, float, float]]


@st.composite
def scenarios(draw: st.DrawFn) -> dict[str, Any]:
    """A random group: size, keys, arrival order and times, and an outcome per shown pair."""
    n = draw(st.integers(2, 5))
    mode = draw(st.sampled_from(get_args(Settings.model_fields["comparison_mode"].annotation)))
    texts = [f"a{i}" for i in range(n)] + (["base"] if mode == "fixed_baseline" else [])
    verdict = st.tuples(
        st.sampled_from([1.0, 2.0, 3.0, 4.0, 5.0]),
        st.sampled_from([1.0, 2.0, 3.0, 4.0, 5.0]),
        st.sampled_from([1.0, 2.0, 3.5, 5.0, 6.0]),
    )
    outcome = st.tuples(
        st.sampled_from(
            # "503 s": Retry-After s (30 fits the 100 s group deadline, 500 does not); a 503,
            # as a 429 holds its replica instead of sleeping a retry (judge/limits.py)
            [
                *("verdict", "verdict", "verdict", "failure", "unparsable"),
                *("503", "503 0.5", "503 30", "503 500"),
            ]
        ),
        st.sampled_from([0.0, 0.05, 0.3, 1.5]),
        verdict,
    )
    shown = [(x, y) for x in texts for y in texts if x != y]
    outcomes = draw(st.fixed_dictionaries({pair: outcome for pair in shown}))
    order = draw(st.permutations(range(n)))
    gaps = draw(st.lists(st.sampled_from([0.0, 0.0, 0.1, 0.4, 2.0]), min_size=n, max_size=n))
    return {
        "n": n,
        "mode": mode,
        "graph": draw(graphs(n, mode)),
        "judges": draw(st.integers(1, 2)),
        "balance": draw(st.sampled_from(get_args(PositionBalance))),
        "retries": draw(st.integers(0, 1)),
        "slots": draw(st.sampled_from([1, 2, 256])),
        "outcomes": outcomes,
        "order": order,
        "gaps": gaps,
    }


def step_of(outcome: Outcome, ordinal: int, retries: int) -> Step:
    kind, delay, (score_1, score_2, ranking) = outcome
    if kind.startswith("503") and ordinal == 0 and retries:
        # The first attempt at this shown pair only (a retry gets the verdict). Without retries
        # it would fail whichever judge pass of the pair came first, which eager starts may
        # order differently, so then the pair gets its verdict at once.
        _, _, after = kind.partition(" ")
        retry_after = float(after) if after else None
        return Step(delay=delay, error=JudgeHTTPError(503, b"slow down", retry_after))
    if kind == "failure":
        return http_error(delay=delay)
    if kind == "unparsable":
        return Step(delay=delay, text="no verdict here")
    return ok(score_1, score_2, ranking, delay=delay)


def run(
    scenario: dict[str, Any], eager: bool, **keys: Any
) -> tuple[dict[int, Reply], Counter[tuple[str, str]]]:
    """Every member's reply and the judge calls per shown pair, for `scenario` run in virtual
    time with `eager_comparisons: eager` and the settings `keys` on top of the scenario's."""
    outcomes: dict[tuple[str, str], Outcome] = scenario["outcomes"]
    # the same outcome for every attempt at a shown pair: a judge cannot tell passes apart
    retries = scenario["retries"]
    judge = ScriptedJudge(script=lambda r1, r2, n: step_of(outcomes[(r1, r2)], n, retries))
    config = make_settings(
        num_rollouts_per_prompt=scenario["n"],
        comparison_mode=scenario["mode"],
        **scenario["graph"],
        num_judges_per_comparison=scenario["judges"],
        position_balance=scenario["balance"],
        genrm_parse_retries=scenario["retries"],
        cohort_collection_timeout_s=100.0,
        cohort_evaluation_timeout_s=100.0,
        judge_request_timeout_s=50.0,
        eager_comparisons=eager,
        judge={"max_concurrency": scenario["slots"]},
        **keys,
    )
    baseline = "base" if scenario["mode"] == "fixed_baseline" else None
    replies: dict[int, Reply] = {}

    async def main() -> None:
        with trio.fail_after(3600):
            async with open_engine(config, judge) as engine:

                async def send(index: int, at: float) -> None:
                    await trio.sleep(at)
                    replies[index] = await verify(engine, member(index, baseline=baseline))

                async with trio.open_nursery() as nursery:
                    at = 0.0
                    for index, gap in zip(scenario["order"], scenario["gaps"], strict=True):
                        at += gap
                        nursery.start_soon(send, index, at)
        assert_no_leaks(engine, judge)

    trio.run(main, clock=MockClock(autojump_threshold=0))
    return replies, Counter(c.shown for c in judge.calls)
