"""Reward quality per judge call: Kendall τ of the rewards against the answers' latent quality,
the share of rollouts scored, and judge calls per group, for every aggregation method and mask
policy (docs/benchmarks.md, "Reward quality"; docs/scoring.md, "Which to choose").

Counts, not timings. The simulated judge's noisy-judge modes (`genrm_trio.testing.judgment`: the
`comparative` and `pointwise` families at their presets, plus pointwise without position bias)
give each answer a latent quality q ~ N(0, 1) and each call a noisy verdict. Each judged
comparison fails with probability p (a uniform drawn per call from its content, compared with
p: a comparison that fails at 5 % fails at 15 % too, so the p levels are nested). Every group of
16 is scored by all four (aggregator_method × mask_policy) variants from the same verdicts and
the same failures, so the four see identical judge calls and their differences are paired.

Scoring calls `engine/evaluation.py`'s `score_cohort` directly: the engine's own masking,
aggregation and row code on an `Evaluation` filled with the verdicts the simulated judge gives
(its `judged_verdict`) and the failures above, without trio, HTTP, the retry loop and the
verdict text round trip, which change no number (A = 1 attempt, so a comparison's call is its
one judge call). `--check-engine N` proves that for N groups per judge configuration: it runs
them through `open_engine` with the in-process `SimJudge` in judgment mode (plus the same
failures) in virtual time and asserts every outcome equals the direct path's, bit for bit.

Grid: family × judge configuration (circular J = 1; circular J = 2 with position_balance
alternate; all_pairs J = 1; all_pairs J = 1 alternate; all_pairs J = 2 alternate) × p ∈ {0, 5 %,
15 %} × {simple_tiebreaker, bradley_terry} × {pair, component}; `--groups` groups per cell.
`--frontier` runs τ against judge calls instead: every family on circular (J = 1, J = 2
alternate), regular d ∈ {3, 4, 6, 8} and all_pairs (J = 1, J = 2 alternate) at N = 16, and on
circular, regular d ∈ {4, 8, 16} and all_pairs at N = 64 (`--groups-64` groups), p ∈ {0, 5 %};
benchmarks/plot_frontier.py draws its JSON.

    python benchmarks/reward_quality.py [--groups 2000] [--seed 0] [--check-engine 3]
                                        [--frontier] [--groups-64 200]
                                        [--only-family comparative] [--only-graph circular-J1]
                                        [--prior 0.1]
                                        [--out benchmarks/results/reward-quality.json]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

import trio
import trio.testing

from genrm_trio import GroupFailed, Masked, Scored, Settings, open_engine
from genrm_trio.config import DEFAULT_BRADLEY_TERRY_PRIOR
from genrm_trio.domain.calibration import (  # one τ and one standard error with calibrate
    kendall_tau_b,
    mean_and_standard_error,
)
from genrm_trio.domain.scoring import (
    CYCLE_RATE,
    NO_ADJUSTMENTS,
    JudgedComparison,
    PlannedComparison,
    aggregate,
    mask_members,
    plan_comparisons,
)
from genrm_trio.domain.verdict import Verdict
from genrm_trio.engine.evaluation import AllMasked, Evaluation, MemberText, score_cohort
from genrm_trio.judge.base import JudgeCall, JudgeHTTPError, JudgeReply
from genrm_trio.testing import SimConfig, SimJudge
from genrm_trio.testing.judgment import (
    JUDGMENT_PRESETS,
    JudgmentModel,
    call_key,
    judged_verdict,
    latent_quality,
)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import WrappedSim, answer, answered, engine_logs_quiet, git_commit, verify_input

SIZE: Final = 16
PROMPT: Final = "Which of the two answers solves the task better?"
HISTORY: Final = ({"role": "user", "content": PROMPT},)
RATES: Final = (0.0, 0.05, 0.15)
METHODS: Final = ("simple_tiebreaker", "bradley_terry")
POLICIES: Final = ("pair", "component")
FAILURE: Final = "GenRM judge sim:0 /v1/responses: JudgeHTTPError: HTTP 500; response=judge down"


@dataclass(frozen=True, slots=True)
class Graph:
    name: str
    strategy: str
    judges: int
    balance: str
    degree: int = 4  # d of `regular` (comparisons_per_rollout)
    size: int = SIZE

    def plan(self) -> list[PlannedComparison]:
        return plan_comparisons(self.size, self.strategy, self.judges, self.balance, self.degree)


GRAPHS: Final = (
    Graph("circular-J1", "circular", 1, "none"),
    Graph("circular-J2-alternate", "circular", 2, "alternate"),
    Graph("regular-d3", "regular", 1, "none", 3),
    Graph("regular-d4", "regular", 1, "none", 4),
    Graph("regular-d6", "regular", 1, "none", 6),
    Graph("regular-d8", "regular", 1, "none", 8),
    Graph("all_pairs-J1", "all_pairs", 1, "none"),
    Graph("all_pairs-J1-alternate", "all_pairs", 1, "alternate"),
    Graph("all_pairs-J2-alternate", "all_pairs", 2, "alternate"),
    Graph("N64-circular-J1", "circular", 1, "none", size=64),
    Graph("N64-regular-d4", "regular", 1, "none", 4, 64),
    Graph("N64-regular-d8", "regular", 1, "none", 8, 64),
    Graph("N64-regular-d16", "regular", 1, "none", 16, 64),
    Graph("N64-all_pairs-J1", "all_pairs", 1, "none", size=64),
)
# `--frontier`: τ against judge calls (docs/benchmarks.md, "The frontier"), every family
FRONTIER: Final = (
    "circular-J1",
    "circular-J2-alternate",
    "regular-d3",
    "regular-d4",
    "regular-d6",
    "regular-d8",
    "all_pairs-J1",
    "all_pairs-J2-alternate",
)
FRONTIER_64: Final = (
    "N64-circular-J1",
    "N64-regular-d4",
    "N64-regular-d8",
    "N64-regular-d16",
    "N64-all_pairs-J1",
)

FAMILIES: Final[dict[str, JudgmentModel]] = {
    "comparative": JUDGMENT_PRESETS["comparative"],
    "pointwise": JUDGMENT_PRESETS["pointwise"],
    # where the verdict is about to matter: a sharper comparative judge (position-swap
    # consistency 79 % instead of 65 %), and pointwise scores without the position bias
    "comparative-sharp": JudgmentModel("comparative", noise=0.55, bias=0.28),
    "pointwise-unbiased": JudgmentModel(
        "pointwise",
        noise=JUDGMENT_PRESETS["pointwise"].noise,
        bias=0.0,
        beta=JUDGMENT_PRESETS["pointwise"].beta,
    ),
}
FULL_GRID: Final = ("comparative", "pointwise")  # the other families run on the cheaper graphs
DEFAULT_GRAPHS: Final = (  # the grid without --frontier or --only-graph
    "circular-J1",
    "circular-J2-alternate",
    "all_pairs-J1",
    "all_pairs-J1-alternate",
    "all_pairs-J2-alternate",
)
FRONTIER_RATES: Final = (0.0, 0.05)
EXTRA_GRAPHS: Final = ("circular-J1", "circular-J2-alternate", "all_pairs-J1")


def settings(graph: Graph, method: str, policy: str) -> Settings:
    return Settings.model_validate(
        {
            "num_rollouts_per_prompt": graph.size,
            "comparison_strategy": graph.strategy,
            "comparisons_per_rollout": graph.degree,
            "num_judges_per_comparison": graph.judges,
            "position_balance": graph.balance,
            "aggregator_method": method,
            "mask_policy": policy,
            "genrm_parse_retries": 0,  # A = 1: p is the failure rate per comparison
            "genrm_parse_retry_sleep_s": 0.0,
            "cohort_collection_timeout_s": 3600.0,
            "cohort_evaluation_timeout_s": 3600.0,
            "judge_request_timeout_s": 600.0,
            "judge": {"max_concurrency": 1_000_000},
            "server": {"max_active_cohorts": 1_000_000},
        }
    )


def failure_draw(seed: int, key: bytes, occurrence: int) -> float:
    """The uniform in [0, 1) that decides whether this call fails (it does when below p)."""
    digest = hashlib.sha256(f"{seed}\0failure\0{occurrence}\0".encode() + key).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


@dataclass
class Judged:
    """One group's judge calls: each planned comparison's verdict and failure draw."""

    verdicts: list[tuple[int, int, int]]
    draws: list[float]


def judge_group(model: JudgmentModel, graph: Graph, seed: int, group: int) -> Judged:
    """What the simulated judge in judgment mode answers for every call of one group."""
    texts = [answer(group, i) for i in range(graph.size)]
    quality = [latent_quality(seed, t) for t in texts]
    seen: dict[bytes, int] = {}
    verdicts: list[tuple[int, int, int]] = []
    draws: list[float] = []
    for planned in graph.plan():
        first, second = planned.shown
        key = call_key(JudgeCall(list(HISTORY), texts[first], texts[second], None))
        occurrence = seen.get(key, 0)
        seen[key] = occurrence + 1
        verdicts.append(
            judged_verdict(model, seed, key, occurrence, quality[first], quality[second])
        )
        draws.append(failure_draw(seed, key, occurrence))
    return Judged(verdicts, draws)


def evaluation_of(graph: Graph, group: int, judged: Judged, rate: float) -> Evaluation:
    plan = graph.plan()
    evaluation = Evaluation(
        plan, [answer(group, i) for i in range(graph.size)], list(HISTORY), None
    )
    for c, (verdict, draw) in enumerate(zip(judged.verdicts, judged.draws, strict=True)):
        if draw < rate:
            evaluation.errors[c] = FAILURE
            continue
        v = Verdict(float(verdict[0]), float(verdict[1]), float(verdict[2]))
        evaluation.results[c] = answered(v)
    return evaluation


def outcomes_direct(
    config: Settings, graph: Graph, group: int, judged: Judged, rate: float
) -> dict[int, Scored | Masked] | AllMasked:
    """The engine's scoring of one group (`score_cohort`, rows included): the cross-check's."""
    texts = {i: MemberText("", answer(group, i)) for i in range(graph.size)}
    return score_cohort(config, evaluation_of(graph, group, judged, rate), graph.size, texts)


@dataclass
class Scoring:
    """One group's rewards under one (method, policy): what `score_cohort` would put in the
    rows' `reward`, from `mask_members` and `aggregate` (the two calls it makes for them)."""

    rewards: dict[int, float] | None  # None: the group failed (every rollout masked)
    cycle_rate: float | None


def fast_scorings(
    graph: Graph, judged: Judged, rate: float, prior: float = DEFAULT_BRADLEY_TERRY_PRIOR
) -> dict[tuple[str, str], Scoring]:
    """Every (method, policy) of one group at failure rate ``rate`` (``prior``: λ of
    bradley_terry)."""
    plan = graph.plan()
    errors: list[str | None] = []
    comparisons: list[JudgedComparison] = []
    for planned, verdict, draw in zip(plan, judged.verdicts, judged.draws, strict=True):
        if draw < rate:
            errors.append(FAILURE)
            continue
        errors.append(None)
        triple = (float(verdict[0]), float(verdict[1]), float(verdict[2]))
        scores = planned.to_member_orientation(triple)
        comparisons.append(JudgedComparison(planned.i, planned.j, planned.k, scores))
    out: dict[tuple[str, str], Scoring] = {}
    for policy in POLICIES:
        masking = mask_members(policy, graph.size, plan, errors)
        for method in METHODS:
            if rate == 0.0 and policy == "component":
                out[(method, policy)] = out[(method, "pair")]  # nothing failed: the same group
                continue
            if isinstance(masking, AllMasked):
                out[(method, policy)] = Scoring(None, None)
                continue
            agg = aggregate(
                comparisons,
                masking.scored,
                {},
                **NO_ADJUSTMENTS,
                method=method,
                bradley_terry_prior=prior,
            )
            out[(method, policy)] = Scoring(agg.final, agg.method_metrics.get(CYCLE_RATE))
    return out


@dataclass
class Cell:
    """One (family, graph, p, method, policy) cell, accumulated over groups."""

    family: str
    graph: str
    rate: float
    method: str
    policy: str
    calls_per_group: int
    size: int
    groups: int = 0
    scored: int = 0
    taus: list[float] = field(default_factory=list)  # one per group with a defined τ
    cycles: list[float] = field(default_factory=list)  # BT's per-group cycle share, where given


def run_cells(
    family: str,
    graph: Graph,
    groups: int,
    seed: int,
    prior: float = DEFAULT_BRADLEY_TERRY_PRIOR,
    rates: Sequence[float] = RATES,
) -> tuple[list[Cell], dict[tuple[float, str], list[float]]]:
    """Every cell of one family and graph; also the paired τ differences BT − ST per (p, policy)
    (per group, where both are defined)."""
    model = FAMILIES[family]
    calls = len(graph.plan())
    cells = {
        (rate, m, pol): Cell(family, graph.name, rate, m, pol, calls, graph.size)
        for rate in rates
        for m in METHODS
        for pol in POLICIES
    }
    diffs: dict[tuple[float, str], list[float]] = {(r, pol): [] for r in rates for pol in POLICIES}
    for group in range(groups):
        judged = judge_group(model, graph, seed, group)
        quality = [latent_quality(seed, answer(group, i)) for i in range(graph.size)]
        for rate in rates:
            scorings = fast_scorings(graph, judged, rate, prior)
            for policy in POLICIES:
                taus: dict[str, float | None] = {}
                for method in METHODS:
                    scoring = scorings[(method, policy)]
                    cell = cells[(rate, method, policy)]
                    cell.groups += 1
                    taus[method] = None
                    if scoring.rewards is None:
                        continue
                    members = sorted(scoring.rewards)
                    cell.scored += len(members)
                    tau = kendall_tau_b(
                        [scoring.rewards[m] for m in members], [quality[m] for m in members]
                    )
                    if tau is not None:
                        cell.taus.append(tau)
                        taus[method] = tau
                    if scoring.cycle_rate is not None:
                        cell.cycles.append(scoring.cycle_rate)
                st, bt = taus["simple_tiebreaker"], taus["bradley_terry"]
                if st is not None and bt is not None:
                    diffs[(rate, policy)].append(bt - st)
    return list(cells.values()), diffs


# --- the engine cross-check -------------------------------------------------------------------


class FailingJudge(WrappedSim):
    """The in-process simulated judge in judgment mode, failing each call whose failure draw
    (the same function of its content as the direct path's) is below ``rate``."""

    def __init__(self, sim: SimJudge, seed: int, rate: float) -> None:
        super().__init__(sim)
        self._seed, self._rate = seed, rate
        self._seen: dict[bytes, int] = {}
        self.calls = 0

    async def attempt(self, call: JudgeCall) -> JudgeReply:
        self.calls += 1
        key = call_key(call)
        occurrence = self._seen.get(key, 0)
        self._seen[key] = occurrence + 1
        reply = await self._sim.attempt(call)  # drawn either way: its occurrence table advances
        if failure_draw(self._seed, key, occurrence) < self._rate:
            raise JudgeHTTPError(500, b"judge down")
        return reply


COMPARED: Final = (
    "reward",
    "reward_score_raw",
    "reward_overall_score",
    "genrm_failed_comparison_rate_per_group",
    "genrm_masked_rollout_rate_per_group",
    "genrm_bradley_terry_log_likelihood_per_observation",
    CYCLE_RATE,
)


def same(direct: dict[int, Scored | Masked] | AllMasked, engine: list[Any]) -> bool:
    """Whether the engine's replies are the direct path's outcomes: the same masked members and
    group failures, and for scored members the same rewards and rates, bit for bit (token
    counts and the quoted judge error text differ by construction)."""
    if isinstance(direct, AllMasked):
        return all(isinstance(o, GroupFailed) for o in engine)
    for m, outcome in direct.items():
        got = engine[m]
        if isinstance(outcome, Masked):
            if not isinstance(got, Masked):
                return False
            continue
        if not isinstance(got, Scored):
            return False
        mine, theirs = dict(outcome.result), dict(got.result)
        if any(mine.get(key) != theirs.get(key) for key in COMPARED):
            return False
    return True


def agrees(direct: dict[int, Scored | Masked] | AllMasked, fast: Scoring) -> bool:
    """Whether the fast path's rewards are `score_cohort`'s, bit for bit."""
    if isinstance(direct, AllMasked):
        return fast.rewards is None
    rewards = {m: o.result["reward"] for m, o in direct.items() if isinstance(o, Scored)}
    cycle = next(iter(o.result.get(CYCLE_RATE) for o in direct.values() if isinstance(o, Scored)))
    return rewards == fast.rewards and cycle == fast.cycle_rate


async def check_engine(
    groups: int,
    seed: int,
    families: Sequence[str] = tuple(FAMILIES),
    graphs: Sequence[Graph] = GRAPHS,
    rate: float = 0.05,
) -> int:
    """Run `groups` groups per family, graph and (method, policy) at failure rate ``rate``
    through the engine and compare with `score_cohort` and the fast path; returns the number
    of groups checked (AssertionError on the first difference)."""
    checked = 0
    for family in families:
        model = FAMILIES[family]
        for graph in graphs:
            for method in METHODS:
                for policy in POLICIES:
                    config = settings(graph, method, policy)
                    sim = SimJudge(SimConfig(seed=seed, judgment=model, record_calls=False))
                    judge = FailingJudge(sim, seed, rate)
                    async with open_engine(config, judge) as engine:
                        for group in range(groups):
                            replies: list[Any] = [None] * graph.size

                            async def one(i: int, g: int = group, out: list[Any] = replies) -> None:
                                out[i] = await engine.verify(verify_input(g, i, PROMPT))

                            async with trio.open_nursery() as nursery:
                                for i in range(graph.size):
                                    nursery.start_soon(one, i)
                            judged = judge_group(model, graph, seed, group)
                            direct = outcomes_direct(config, graph, group, judged, rate)
                            fast = fast_scorings(graph, judged, rate)[(method, policy)]
                            if not same(direct, replies) or not agrees(direct, fast):
                                raise AssertionError(
                                    f"engine, score_cohort and the fast path differ: {family} "
                                    f"{graph.name} {method} {policy} group {group}"
                                )
                            checked += 1
                    calls = len(graph.plan())
                    assert judge.calls == groups * calls, (judge.calls, groups, calls)
    return checked


# --- output -----------------------------------------------------------------------------------


def cell_record(cell: Cell) -> dict[str, Any]:
    tau, tau_se = mean_and_standard_error(cell.taus)
    cycles, _ = mean_and_standard_error(cell.cycles)
    return {
        "family": cell.family,
        "graph": cell.graph,
        "p": cell.rate,
        "method": cell.method,
        "policy": cell.policy,
        "calls_per_group": cell.calls_per_group,
        "size": cell.size,
        "calls_per_rollout": cell.calls_per_group / cell.size,
        "groups": cell.groups,
        "groups_with_tau": len(cell.taus),
        "kendall_tau": tau,
        "kendall_tau_se": tau_se,
        "share_scored": cell.scored / (cell.groups * cell.size) if cell.groups else math.nan,
        "cycle_rate": cycles if cell.cycles else None,
    }


def _tau(record: dict[str, Any]) -> str:
    """τ, with the number of groups it is over when fewer than half the groups have one (the
    rest had fewer than two scored rollouts): such τ are over tiny, unrepresentative sets."""
    if not record["groups_with_tau"]:
        return "—"
    text = f"{record['kendall_tau']:.3f}"
    if record["groups_with_tau"] < record["groups"] / 2:
        text += f" (n {record['groups_with_tau']})"
    return text


def _diff(value: dict[str, Any]) -> str:
    if not value["groups"] or math.isnan(value["se"]):
        return "—"
    return f"{value['mean']:+.3f} ± {value['se']:.3f}"


def tau_table(records: Sequence[dict[str, Any]], diffs: dict[str, Any]) -> str:
    lines = [
        "| family | graph | p | calls / group | τ ST pair | τ BT pair | τ ST component | "
        "τ BT component | BT − ST, pair | BT − ST, component |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    index = {(r["family"], r["graph"], r["p"], r["method"], r["policy"]): r for r in records}
    keys = sorted({(r["family"], r["graph"], r["p"]) for r in records}, key=_order)
    for family, graph, rate in keys:
        cells = [index[(family, graph, rate, m, pol)] for pol in POLICIES for m in METHODS]
        d = [diffs[f"{family}|{graph}|{rate}|{pol}"] for pol in POLICIES]
        lines.append(
            f"| {family} | {graph} | {rate:.0%} | {cells[0]['calls_per_group']} | "
            + " | ".join(_tau(c) for c in cells)
            + " | "
            + " | ".join(_diff(x) for x in d)
            + " |"
        )
    return "\n".join(lines)


def cycle_table(records: Sequence[dict[str, Any]]) -> str:
    """The Bradley–Terry rows' preference-cycle share (p = 0), where the graph has triangles."""
    lines = ["| family | graph | cyclic share of decided triangles |", "|---|---|---|"]
    for r in sorted(records, key=lambda r: _order((r["family"], r["graph"], r["p"]))):
        if (
            r["p"] == 0.0
            and r["method"] == "bradley_terry"
            and r["policy"] == "pair"
            and r["cycle_rate"] is not None
        ):
            lines.append(f"| {r['family']} | {r['graph']} | {r['cycle_rate']:.2%} |")
    return "\n".join(lines)


def scored_table(records: Sequence[dict[str, Any]]) -> str:
    """Share scored depends on the graph, p and the policy only (not on the verdicts)."""
    lines = [
        "| graph | p | calls / group | scored, pair | scored, component |",
        "|---|---|---|---|---|",
    ]
    first = sorted({r["family"] for r in records})[0]
    rows = [r for r in records if r["family"] == first and r["method"] == METHODS[0]]
    index = {(r["graph"], r["p"], r["policy"]): r for r in rows}
    for graph, rate in sorted({(r["graph"], r["p"]) for r in rows}, key=_order_graph):
        pair, comp = index[(graph, rate, "pair")], index[(graph, rate, "component")]
        lines.append(
            f"| {graph} | {rate:.0%} | {pair['calls_per_group']} | {pair['share_scored']:.2%} | "
            f"{comp['share_scored']:.2%} |"
        )
    return "\n".join(lines)


def _order(key: tuple[str, str, float]) -> tuple[int, int, float]:
    family, graph, rate = key
    return (list(FAMILIES).index(family), [g.name for g in GRAPHS].index(graph), rate)


def _order_graph(key: tuple[str, float]) -> tuple[int, float]:
    return ([g.name for g in GRAPHS].index(key[0]), key[1])


def frontier_table(records: Sequence[dict[str, Any]]) -> str:
    """τ against judge calls: per family and graph, both methods at p = 0 (either policy: nothing
    fails) and at p = 5 % under each policy, with the share scored at 5 %."""
    lines = [
        "| family | N | graph | calls / group | calls / rollout | τ ST | τ BT | "
        "p 5 %: τ ST pair | τ BT pair | τ ST component | τ BT component | "
        "scored pair | scored component |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    index = {(r["family"], r["graph"], r["p"], r["method"], r["policy"]): r for r in records}
    for family, graph, _ in sorted(
        {(r["family"], r["graph"], 0.0) for r in records if r["p"] == 0.0}, key=_order
    ):
        clean = [index[(family, graph, 0.0, m, "pair")] for m in METHODS]
        failing = [index.get((family, graph, 0.05, m, pol)) for pol in POLICIES for m in METHODS]
        cells = [_tau(c) for c in clean] + [_tau(c) if c else "—" for c in failing]
        scored = [f"{c['share_scored']:.1%}" if c else "—" for c in (failing[0], failing[2])]
        first = clean[0]
        lines.append(
            f"| {family} | {first['size']} | {graph} | {first['calls_per_group']} | "
            f"{first['calls_per_rollout']:g} | " + " | ".join(cells + scored) + " |"
        )
    return "\n".join(lines)


def frontier_checks(records: Sequence[dict[str, Any]]) -> list[str]:
    """The regular-graph issue's targets on the comparative judge at p = 0."""
    tau = {
        (r["graph"], r["method"]): r["kendall_tau"]
        for r in records
        if r["family"] == "comparative" and r["p"] == 0.0 and r["policy"] == "pair"
    }
    out: list[str] = []
    if ("regular-d8", "bradley_terry") in tau and ("all_pairs-J1", METHODS[0]) in tau:
        bt8, ap = tau[("regular-d8", "bradley_terry")], tau[("all_pairs-J1", METHODS[0])]
        out.append(
            f"regular d=8 BT τ {bt8:.3f} vs all_pairs ST τ {ap:.3f}: {bt8 - ap:+.3f} "
            f"(target >= -0.02: {'met' if bt8 - ap >= -0.02 else 'NOT met'})"
        )
    if ("regular-d4", METHODS[0]) in tau and ("circular-J2-alternate", METHODS[0]) in tau:
        d4 = max(tau[("regular-d4", m)] for m in METHODS)
        c2 = max(tau[("circular-J2-alternate", m)] for m in METHODS)
        out.append(
            f"regular d=4 best τ {d4:.3f} vs circular J=2 alternate best τ {c2:.3f}: "
            f"{d4 - c2:+.3f} (target >= +0.03: {'met' if d4 - c2 >= 0.03 else 'NOT met'})"
        )
    return out


def checks(records: Sequence[dict[str, Any]], diffs: dict[str, Any]) -> list[str]:
    """The issue's targets, each with what the model says (BT − ST as mean ± standard error of
    the paired per-group difference; "significant" means beyond two standard errors)."""
    out: list[str] = []
    for family in FAMILIES:
        mine = {k: v for k, v in diffs.items() if k.startswith(f"{family}|") and v["groups"] > 1}
        if not mine:
            continue
        behind = [k for k, v in mine.items() if v["mean"] < 0]
        significant = [
            f"{k.split('|', 1)[1]} {v['mean']:+.3f} ± {v['se']:.3f}"
            for k, v in mine.items()
            if v["mean"] < -2 * v["se"]
        ]
        ahead = [k for k, v in mine.items() if v["mean"] > 2 * v["se"]]
        out.append(
            f"{family}: BT behind ST in {len(behind)} of {len(mine)} cells, significantly in "
            f"{len(significant)}"
            + (f" ({'; '.join(significant)})" if significant else "")
            + f"; significantly ahead in {len(ahead)}"
        )
    for r in records:
        if (
            r["graph"].startswith("all_pairs")
            and r["p"] == 0.05
            and r["method"] == METHODS[0]
            and r["family"] == "comparative"
        ):
            out.append(
                f"{r['graph']} p=5% {r['policy']}: scores {r['share_scored']:.2%} of rollouts"
                + (" (target >= 99%)" if r["policy"] == "component" else "")
            )
    return out + frontier_checks(records)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--groups", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--check-engine", type=int, default=0, metavar="N")
    parser.add_argument(
        "--prior",
        type=float,
        default=DEFAULT_BRADLEY_TERRY_PRIOR,
        help="bradley_terry_prior of the direct path (the engine check uses the default)",
    )
    parser.add_argument(
        "--frontier",
        action="store_true",
        help="every family on the frontier graphs at N = 16 and 64, p in {0, 5%%}",
    )
    parser.add_argument("--groups-64", type=int, default=200, help="groups of 64 (--frontier)")
    parser.add_argument("--only-family", action="append", choices=list(FAMILIES))
    parser.add_argument("--only-graph", action="append", choices=[g.name for g in GRAPHS])
    parser.add_argument("--out")
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    with engine_logs_quiet():
        return run_benchmark(args, argv)


def run_benchmark(args: argparse.Namespace, argv: Sequence[str] | None) -> int:
    """The benchmark `main` parsed `args` for (`argv` as given, for the record's command)."""
    started = time.monotonic()
    checked = 0
    if args.check_engine:
        clock = trio.testing.MockClock(autojump_threshold=0)
        checked = trio.run(check_engine, args.check_engine, args.seed, clock=clock)
        print(f"engine cross-check: {checked} groups identical to the direct path")
    records: list[dict[str, Any]] = []
    diffs: dict[str, Any] = {}
    for family in args.only_family or list(FAMILIES):
        for graph in GRAPHS:
            if args.only_graph:
                if graph.name not in args.only_graph:
                    continue
            elif args.frontier:
                if graph.name not in FRONTIER + FRONTIER_64:
                    continue
            elif graph.name not in DEFAULT_GRAPHS or (
                family not in FULL_GRID and graph.name not in EXTRA_GRAPHS
            ):
                continue
            groups = args.groups_64 if args.frontier and graph.size == 64 else args.groups
            rates = FRONTIER_RATES if args.frontier else RATES
            cells, paired = run_cells(family, graph, groups, args.seed, args.prior, rates)
            records.extend(cell_record(c) for c in cells)
            for (rate, policy), values in paired.items():
                mean, se = mean_and_standard_error(values)
                diffs[f"{family}|{graph.name}|{rate}|{policy}"] = {
                    "mean": mean,
                    "se": se,
                    "groups": len(values),
                }
    print(tau_table(records, diffs))
    print()
    print(scored_table(records))
    print()
    print(cycle_table(records))
    print()
    if args.frontier:
        print(frontier_table(records))
        print()
    for line in checks(records, diffs):
        print(line)
    elapsed = time.monotonic() - started
    print(f"({elapsed:.0f} s)")
    if args.out:
        record = {
            "benchmark": "reward_quality",
            "commit": git_commit(),
            "command": " ".join(
                ["python", "benchmarks/reward_quality.py", *(argv or sys.argv[1:])]
            ),
            "groups": args.groups,
            "groups_64": args.groups_64 if args.frontier else None,
            "seed": args.seed,
            "bradley_terry_prior": args.prior,
            "engine_groups_checked": checked,
            "families": {name: asdict(model) for name, model in FAMILIES.items()},
            "cells": records,
            "bt_minus_st_tau": diffs,
            "checks": checks(records, diffs),
        }
        with open(args.out, "w", encoding="utf-8") as handle:
            handle.write(json.dumps(record, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
