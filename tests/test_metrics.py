"""The metrics the dashboard and alert rules need (docs/operations.md, "Metrics to watch"):
group latency, rollouts of terminal cohorts, the cohorts' age, label values exported from the
start, and the process series. Engine behaviour in virtual time, with exact values."""

from __future__ import annotations

import re
import sys
import typing
from pathlib import Path

import pytest
import trio
from fake_replicas import replica_stats
from judges import (
    ScriptedJudge,
    Step,
    gather,
    http_error,
    member,
    ok,
    running,
    settings,
    verify,
)
from prometheus_client.parser import text_string_to_metric_families
from trio.testing import MockClock

from genrm_trio.domain.model import GroupFailed, Masked, Scored
from genrm_trio.domain.records import TerminalRecord
from genrm_trio.engine import machine
from genrm_trio.engine.engine import Engine
from genrm_trio.judge.apis import JudgePromptError
from genrm_trio.judge.base import (
    JudgeAttemptError,
    JudgeBadJSON,
    JudgeHTTPError,
    JudgeStalled,
    JudgeTimeout,
    JudgeTransportError,
    ReplyStatus,
)
from genrm_trio.judge.comparison import outcome_of
from genrm_trio.judge.context import JudgeContextOverflow
from genrm_trio.metrics import (
    ACTIVE_STATE_LABELS,
    DEADLINE_LABELS,
    JUDGE_OUTCOME_LABELS,
    MASKED_CAUSE_LABELS,
    PREFERRED_POSITION_LABELS,
    RETRY_CAUSE_LABELS,
    TERMINAL_STATE_LABELS,
    Metrics,
)

LATENCY = "genrm_trio_group_latency_seconds"
ROLLOUTS = "genrm_trio_cohort_rollouts_total"


def value(engine: Engine, name: str, **labels: str) -> float:
    found = engine.metrics.registry.get_sample_value(name, labels)
    assert found is not None, (name, labels)
    return found


def samples(metrics: Metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


# --- group latency: first member in -> rewards published -------------------------------------


async def test_group_latency_runs_from_the_first_member_to_the_published_rewards(
    autojump_clock: MockClock,
) -> None:
    """Member 0 at t=0, member 1 at t=3, judge calls of 2 s: the rewards go out at t=5."""
    config = settings(
        cohort_collection_timeout_s=10.0,
        cohort_evaluation_timeout_s=10.0,
        judge_request_timeout_s=5.0,
    )
    judge = ScriptedJudge(latency=2.0)
    async with running(config, judge) as engine:
        t0 = trio.current_time()
        replies = await gather(engine, [member(0), member(1)], stagger=3.0)
        assert trio.current_time() - t0 == 5.0
        assert all(isinstance(r, Scored) for r in replies)
        assert value(engine, f"{LATENCY}_count") == 1
        assert value(engine, f"{LATENCY}_sum") == 5.0
        assert value(engine, f"{LATENCY}_bucket", le="2.5") == 0
        assert value(engine, f"{LATENCY}_bucket", le="5.0") == 1
        assert value(engine, f"{ROLLOUTS}", state="scored") == 2


async def test_a_partially_masked_group_counts_its_latency_and_its_rollouts(
    autojump_clock: MockClock,
) -> None:
    """N=4 circular, pair (0, 1) fails: members 0 and 1 masked, 2 and 3 scored, all at t=0.5."""
    config = settings(num_rollouts_per_prompt=4, judge_request_timeout_s=1.0)
    judge = ScriptedJudge(pairs={("a0", "a1"): http_error(delay=0.5)}, latency=0.5)
    async with running(config, judge) as engine:
        replies = await gather(engine, [member(i) for i in range(4)])
        assert [type(r) for r in replies] == [Masked, Masked, Scored, Scored]
        assert value(engine, f"{LATENCY}_sum") == 0.5
        assert value(engine, f"{ROLLOUTS}", state="partially_masked") == 4
        assert value(engine, f"{ROLLOUTS}", state="scored") == 0
        assert value(engine, "genrm_trio_masked_rollouts_total", cause="alone") == 2
        assert value(engine, "genrm_trio_masked_rollouts_total", cause="whole_group") == 0


async def test_a_failed_group_counts_its_present_rollouts_and_no_latency(
    autojump_clock: MockClock,
) -> None:
    """One member of two, collection deadline 1 s: failed with one rollout, never published."""
    async with running(settings(), ScriptedJudge()) as engine:
        reply = await verify(engine, member(0))
        assert isinstance(reply, GroupFailed)
        assert value(engine, f"{ROLLOUTS}", state="failed") == 1
        assert value(engine, f"{LATENCY}_count") == 0
        assert value(engine, "genrm_trio_cohorts_terminal_total", state="failed") == 1


async def test_a_cohort_view_shows_its_age(autojump_clock: MockClock) -> None:
    config = settings(cohort_collection_timeout_s=10.0)
    async with running(config, ScriptedJudge()) as engine, trio.open_nursery() as nursery:
        nursery.start_soon(verify, engine, member(0))
        await trio.sleep(0.4)
        [view] = engine.active_cohorts()
        assert view.age_s == pytest.approx(0.4)
        assert view.deadline_s_left == pytest.approx(9.6)
        await trio.sleep(2.0)
        [view] = engine.active_cohorts()
        assert view.age_s == pytest.approx(2.4)
        nursery.start_soon(verify, engine, member(1))


# --- the judge on live traffic: position bias, order disagreement, cycles -----------------------

VERDICTS = "genrm_trio_judge_verdicts_total"
DISAGREEMENT = "genrm_trio_group_position_disagreement_rate"
CYCLES = "genrm_trio_group_preference_cycle_rate"
BOTH_ORDERS = {
    "num_rollouts_per_prompt": 4,
    "comparison_strategy": "all_pairs",
    "num_judges_per_comparison": 2,
    "position_balance": "alternate",
    "aggregator_method": "bradley_terry",
}


async def test_a_consistent_judge_shows_no_position_bias_disagreement_or_cycle(
    autojump_clock: MockClock,
) -> None:
    """Qualities 1..4, the ranking following their difference: each pair's better answer wins
    in both orders, first in one and second in the other (12 calls: 6 and 6)."""
    async with running(settings(**BOTH_ORDERS), ScriptedJudge()) as engine:
        replies = await gather(engine, [member(i) for i in range(4)])
        assert all(isinstance(r, Scored) for r in replies)
        assert value(engine, VERDICTS, preferred="first") == 6
        assert value(engine, VERDICTS, preferred="second") == 6
        assert value(engine, VERDICTS, preferred="tie") == 0
        assert value(engine, f"{DISAGREEMENT}_count") == 1
        assert value(engine, f"{DISAGREEMENT}_sum") == 0.0
        assert value(engine, f"{CYCLES}_count") == 1
        assert value(engine, f"{CYCLES}_sum") == 0.0


async def test_a_judge_that_always_prefers_the_first_answer(autojump_clock: MockClock) -> None:
    """Every call prefers the answer shown first: 12 of 12 first, every pair's two orders
    disagree (rate 1.0), and no pair has a decided preference, so no triangle is observed."""
    judge = ScriptedJudge(script=lambda r1, r2, n: ok(4, 2, 2))
    async with running(settings(**BOTH_ORDERS), judge) as engine:
        await gather(engine, [member(i) for i in range(4)])
        assert value(engine, VERDICTS, preferred="first") == 12
        assert value(engine, VERDICTS, preferred="second") == 0
        assert value(engine, f"{DISAGREEMENT}_count") == 1
        assert value(engine, f"{DISAGREEMENT}_sum") == 1.0
        assert value(engine, f"{CYCLES}_count") == 0


async def test_one_order_per_pair_counts_positions_only(autojump_clock: MockClock) -> None:
    """circular, J = 1, simple_tiebreaker: no pair is seen in both orders and the method reports
    no cycles; ties (3.5) and unparsed fallbacks are told apart."""
    script = {("a0", "a1"): ok(3, 3, 3.5), ("a1", "a2"): Step(text="no verdict here")}
    config = settings(num_rollouts_per_prompt=4, genrm_parse_retries=0)
    async with running(config, ScriptedJudge(pairs=script)) as engine:
        await gather(engine, [member(i) for i in range(4)])
        # (0,1) tie; (1,2) unparsed: left out; (2,3) a3 better: second; (3,0) a3 better: first
        assert value(engine, VERDICTS, preferred="tie") == 1
        assert value(engine, VERDICTS, preferred="first") == 1
        assert value(engine, VERDICTS, preferred="second") == 1
        assert value(engine, f"{DISAGREEMENT}_count") == 0
        assert value(engine, f"{CYCLES}_count") == 0


# --- what a fresh registry exports ------------------------------------------------------------


def test_every_closed_label_value_is_exported_at_zero_from_the_start() -> None:
    """So that `a + b` and `a / b` over them have a series before the first event."""
    exported = samples(Metrics())
    for state in TERMINAL_STATE_LABELS:
        assert exported[("genrm_trio_cohorts_terminal_total", (("state", state),))] == 0
        assert exported[(ROLLOUTS, (("state", state),))] == 0
    for state in ACTIVE_STATE_LABELS:
        assert exported[("genrm_trio_active_cohorts", (("state", state),))] == 0
    for deadline in DEADLINE_LABELS:
        key = ("genrm_trio_deadline_failures_total", (("deadline", deadline),))
        assert exported[key] == 0
    for outcome in JUDGE_OUTCOME_LABELS:
        assert exported[("genrm_trio_judge_calls_total", (("outcome", outcome),))] == 0
    for cause in RETRY_CAUSE_LABELS:
        assert exported[("genrm_trio_judge_retries_total", (("cause", cause),))] == 0
    for cause in MASKED_CAUSE_LABELS:
        assert exported[("genrm_trio_masked_rollouts_total", (("cause", cause),))] == 0
    for position in PREFERRED_POSITION_LABELS:
        assert exported[(VERDICTS, (("preferred", position),))] == 0
    assert exported[(f"{LATENCY}_count", ())] == 0
    assert exported[(f"{LATENCY}_bucket", (("le", "+Inf"),))] == 0


def _subclasses(cls: type[BaseException]) -> set[type[BaseException]]:
    """Every class of the package derived from `cls`, however deep (a test's own subclass is
    not one of the package's kinds)."""
    found: set[type[BaseException]] = set()
    for sub in cls.__subclasses__():
        if sub.__module__.startswith("genrm_trio."):
            found |= {sub} | _subclasses(sub)
    return found


def test_the_label_values_are_the_engines_own() -> None:
    assert set(ACTIVE_STATE_LABELS) == set(machine.ACTIVE_STATES)
    state = typing.get_type_hints(TerminalRecord.state.fget)["return"]  # type: ignore[attr-defined]
    assert set(TERMINAL_STATE_LABELS) == set(typing.get_args(state))
    errors = [
        JudgeHTTPError(500, b""),
        JudgeTimeout(1.0),
        JudgeBadJSON("not json"),
        JudgeTransportError("ConnectError", "refused"),
        JudgeStalled("judge replica a:8000 finished none of its calls in flight for 5s"),
        JudgeContextOverflow("the judge's context window is too small for this comparison"),
        JudgePromptError("judge.prompt_template: UndefinedError: 'x' is undefined"),
    ]
    # one example of every kind of failed attempt: a new kind fails here until it has one
    assert {type(error) for error in errors} == _subclasses(JudgeAttemptError)
    outcomes = {status.value for status in ReplyStatus} | {outcome_of(e)[0] for e in errors}
    assert outcomes == set(JUDGE_OUTCOME_LABELS)
    # retried: the retryable ones, and in a fleet those retried on another replica (a timeout)
    retried = {outcome_of(e)[1] for e in errors if e.retryable or e.retry_elsewhere}
    assert retried | {"unusable", "parse", "budget"} == set(RETRY_CAUSE_LABELS)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="process series read /proc")
def test_the_process_series_are_exported() -> None:
    names = {name for name, _ in samples(Metrics())}
    for name in (
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
        "process_open_fds",
        "process_max_fds",
        "process_start_time_seconds",
    ):
        assert name in names


# --- the documented list (docs/http-api.md, "GET /metrics") is the registry's -----------------

_DOCUMENTED = re.compile(r"`(genrm_trio_[a-z_]+)(?:\{([a-z_, ]+)\})?`")


def _documented_series() -> dict[str, frozenset[str]]:
    """Every `genrm_trio_*` series docs/http-api.md lists under "GET /metrics", with its labels:
    the `{...}` written after it, and `replica` for the paragraph of per-replica series."""
    text = (Path(__file__).parent.parent / "docs" / "http-api.md").read_text(encoding="utf-8")
    section = text.split("## `GET /metrics`", 1)[1].split("\n## ", 1)[0]
    found: dict[str, frozenset[str]] = {}
    for paragraph in section.split("\n\n"):
        implied = {"replica"} if "with a `replica` label" in paragraph else set()
        for name, labels in _DOCUMENTED.findall(paragraph):
            written = {label.strip() for label in labels.split(",")} if labels else set()
            found[name] = frozenset(written | implied)
    return found


def _exported_series() -> dict[str, frozenset[str]]:
    """Every `genrm_trio_*` series a `Metrics` registry exports (a fleet's included), named as
    scraped (a counter with `_total`), with its label names (a histogram's `le` aside)."""
    metrics = Metrics()
    metrics.watch_replicas(lambda: [replica_stats("10.0.0.2:8000")])
    found: dict[str, frozenset[str]] = {}
    for family in metrics.registry.collect():
        if not family.name.startswith("genrm_trio_"):
            continue  # process_*: the standard series, documented as such
        name = family.name + ("_total" if family.type == "counter" else "")
        labels = {key for sample in family.samples for key in sample.labels} - {"le"}
        found[name] = frozenset(labels)
    return found


def test_the_documented_metrics_are_the_exported_ones() -> None:
    """A series added to `Metrics` fails here until docs/http-api.md lists it (and a listed one
    that is gone, or whose labels differ, fails too)."""
    documented, exported = _documented_series(), _exported_series()
    assert len(exported) >= 20  # the registry was read, per-replica series included
    assert documented == exported
