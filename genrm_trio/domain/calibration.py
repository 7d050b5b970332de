"""Calibrating the judge (docs/scoring.md, "Choosing a schedule for your judge"; docs/operations.md,
"Calibrating the judge"): what `genrm-trio calibrate` measures from every pair of a few groups
judged in both orders, the judge model fitted to it, the frontier simulated under that model and
the recommendation. Pure: no I/O, no trio; the random draws are seeded.

The judge model (one per run, over every group):

- **Ranking.** A call showing answer a first and b second sees z = q_a − q_b + bias + noise·ε,
  with q ~ N(0, 1) the answers' latent quality within their group and ε ~ N(0, 1): the first
  answer wins when z > 0. `bias` and `noise` are the two numbers that make the model's share of
  first-position wins and its order consistency (how often a pair's two orders agree) equal the
  measured ones; both have closed forms (`first_win_share`, `consistency`), so the fit is two
  root findings, not a search. The ranking's strength (1, 2 or 3 for the first answer, 4, 5 or 6
  for the second, or whatever values the judge writes) is the measured rankings of that side at
  z's quantile among the calls on that side: stronger verdicts where |z| is larger.
- **Scores.** Either they follow the ranking (a comparative judge: at least 90 % of the calls
  write the scores most often written with their ranking), and the model writes those; or each
  score grades its own answer (a pointwise judge): score = the measured scores' quantile of
  u = q + score_noise·η, with score_noise the one that gives the measured intraclass correlation
  of an answer's scores across its comparisons.

Every schedule is then simulated on the same simulated groups and draws (its differences from the
others are paired) and scored by the engine's own `aggregate`; τ is Kendall's τ-b of the rewards
against q. The recommendation is the cheapest schedule within `TOLERANCE` of the best τ.
"""

from __future__ import annotations

import json
import math
import random
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any, Final, Literal, assert_never, final, get_args

from genrm_trio.config import AggregatorMethod, ComparisonStrategy, PositionBalance
from genrm_trio.domain.scoring import (
    NO_ADJUSTMENTS,
    RANKING_MIDPOINT,
    JudgedComparison,
    PlannedComparison,
    aggregate,
    plan_comparisons,
    preference_cycle_rate,
)
from genrm_trio.domain.scoring.pairs import flip, shown_swapped
from genrm_trio.domain.text import HistoryError, normalize_history

__all__ = [
    "AGGREGATORS",
    "TOLERANCE",
    "CalibrationInputError",
    "FrontierPoint",
    "GroupJudgments",
    "JudgeFit",
    "Measurement",
    "RolloutGroup",
    "Schedule",
    "ShownVerdict",
    "consistency",
    "first_win_share",
    "fit_judge",
    "group_from_compare_rows",
    "kendall_tau_b",
    "mean_and_standard_error",
    "measure",
    "parse_rollout_groups",
    "recommend",
    "schedules_for",
    "simulate_frontier",
    "simulated_groups_for",
]

TOLERANCE: Final = 0.02
"""How far below the best estimated τ the recommendation may be (docs/scoring.md)."""
AGGREGATORS: Final[tuple[AggregatorMethod, ...]] = get_args(AggregatorMethod)
TIED_SCORES_SHARE: Final = 0.9  # share of calls whose scores follow their ranking: comparative
SIMULATED_GROUPS: Final = 400  # at 16 rollouts; `simulated_groups_for` scales it
POSITION_BALANCE: Final[PositionBalance] = "alternate"  # every schedule's (docs/scoring.md)


def simulated_groups_for(size: int) -> int:
    """The default number of simulated groups: 400 at 16 rollouts, fewer for larger groups (a
    group's τ is over N(N − 1)/2 pairs, so its spread shrinks as N grows), at least 50."""
    return max(50, SIMULATED_GROUPS * 16 // max(size, 1))


MAX_COMPLETION_CHARS: Final = 1_000_000  # one answer; the judge sees it whole
MAX_LINE_CHARS: Final = 64_000_000

_NORMAL: Final = NormalDist()
_GRID: Final = 400  # quadrature points over the latent quality difference
_LOWEST_NOISE: Final = 1e-3
_HIGHEST_NOISE: Final = 50.0

ScoreMode = Literal["ranking", "pointwise"]


class CalibrationInputError(ValueError):
    """A rollouts file that cannot be calibrated on: one line saying where and why."""


# --- input ---------------------------------------------------------------------------------------


@final
@dataclass(frozen=True, slots=True)
class RolloutGroup:
    """One group to judge: its key (the group id, or the line number), the prompt as judge
    history, and the completions as Responses objects (what `/compare` takes)."""

    key: str
    history: tuple[Mapping[str, str], ...]
    responses: tuple[Mapping[str, Any], ...]


def _response_object(text: str) -> dict[str, Any]:
    return {
        "output": [{"type": "message", "content": [{"type": "output_text", "text": text}]}],
    }


def _history(prompt: object, where: str) -> tuple[Mapping[str, str], ...]:
    if not isinstance(prompt, str | list):
        raise CalibrationInputError(f"{where}: prompt must be a string or a list of messages")
    try:
        return tuple(normalize_history(prompt))
    except HistoryError as exc:
        raise CalibrationInputError(f"{where}: {exc}") from None


def parse_rollout_groups(
    lines: Iterable[str], size: int, source: str = "input"
) -> list[RolloutGroup]:
    """The groups of a rollouts file (docs/operations.md, "Calibrating the judge"): each line is
    `{"prompt": str | messages, "completions": [str, …]}` with ``size`` completions, or a `/verify`
    body with `_ng_group_id` (its group's bodies, ``size`` of them, make one group, in
    `_ng_rollout_index` order when given). CalibrationInputError names the line for bad input."""
    groups: list[RolloutGroup] = []
    verify: dict[str, list[tuple[int, int, Mapping[str, Any]]]] = {}
    verify_history: dict[str, tuple[Mapping[str, str], ...]] = {}
    verify_line: dict[str, int] = {}
    for number, line in enumerate(lines, 1):
        where = f"{source}:{number}"
        if not line.strip():
            continue
        if len(line) > MAX_LINE_CHARS:
            raise CalibrationInputError(f"{where}: line longer than {MAX_LINE_CHARS} characters")
        try:
            value = json.loads(line)
        except ValueError as exc:
            raise CalibrationInputError(f"{where}: not JSON: {exc}") from None
        if not isinstance(value, dict):
            raise CalibrationInputError(f"{where}: expected a JSON object")
        if "completions" in value:
            completions = value["completions"]
            if not isinstance(completions, list) or not all(
                isinstance(c, str) for c in completions
            ):
                raise CalibrationInputError(f"{where}: completions must be a list of strings")
            if len(completions) != size:
                raise CalibrationInputError(
                    f"{where}: {len(completions)} completions; num_rollouts_per_prompt is {size}"
                )
            if any(len(c) > MAX_COMPLETION_CHARS for c in completions):
                raise CalibrationInputError(
                    f"{where}: a completion is longer than {MAX_COMPLETION_CHARS} characters"
                )
            if "prompt" not in value:
                raise CalibrationInputError(f"{where}: missing key 'prompt'")
            history = _history(value["prompt"], where)
            key = str(value.get("group_id", f"line {number}"))
            groups.append(
                RolloutGroup(key, history, tuple(_response_object(c) for c in completions))
            )
            continue
        params = value.get("responses_create_params")
        response = value.get("response")
        group_id = value.get("_ng_group_id", value.get("group_id"))
        if not isinstance(params, dict) or not isinstance(response, dict):
            raise CalibrationInputError(
                f"{where}: expected 'prompt' and 'completions', or a /verify body "
                "('responses_create_params' and 'response' objects)"
            )
        if not isinstance(group_id, str) or not group_id:
            raise CalibrationInputError(f"{where}: a /verify body needs its _ng_group_id")
        index = value.get("_ng_rollout_index", value.get("rollout_index"))
        members = verify.setdefault(group_id, [])
        if group_id not in verify_history:
            verify_history[group_id] = _history(params.get("input"), where)
            verify_line[group_id] = number
        order = index if isinstance(index, int) else len(members)
        members.append((order, number, response))
        if len(members) > size:
            raise CalibrationInputError(
                f"{where}: group {group_id!r} has more than num_rollouts_per_prompt ({size}) bodies"
            )
    for group_id, members in verify.items():
        if len(members) != size:
            raise CalibrationInputError(
                f"{source}:{verify_line[group_id]}: group {group_id!r} has {len(members)} /verify "
                f"bodies; num_rollouts_per_prompt is {size}"
            )
        responses = tuple(r for _, _, r in sorted(members, key=lambda m: (m[0], m[1])))
        groups.append(RolloutGroup(group_id, verify_history[group_id], responses))
    keys = Counter(g.key for g in groups)
    repeated = [k for k, count in keys.items() if count > 1]
    if repeated:
        raise CalibrationInputError(f"{source}: group {repeated[0]!r} appears more than once")
    return groups


# --- what was judged ----------------------------------------------------------------------------


@final
@dataclass(frozen=True, slots=True)
class ShownVerdict:
    """One judge call as shown: member ``first`` was response_1, and the verdict as written."""

    first: int
    second: int
    score_first: float
    score_second: float
    ranking: float


@final
@dataclass(frozen=True, slots=True)
class GroupJudgments:
    """Every call of one measured group."""

    key: str
    size: int
    verdicts: tuple[ShownVerdict, ...]

    def member_comparisons(self) -> list[JudgedComparison]:
        """The calls in member orientation (lower index first), as the aggregators see them."""
        out: list[JudgedComparison] = []
        for k, v in enumerate(self.verdicts):
            triple = (v.score_first, v.score_second, v.ranking)
            if v.first < v.second:
                out.append(JudgedComparison(v.first, v.second, k, triple))
            else:
                out.append(JudgedComparison(v.second, v.first, k, flip(triple)))
        return out


def group_from_compare_rows(
    key: str, size: int, rows: Sequence[Mapping[str, Any]], position_balance: PositionBalance
) -> GroupJudgments:
    """A `/compare` reply's `comparison_results` (member orientation) as shown to the judge:
    under ``position_balance`` alternate the comparison (i, j, k) was shown j first iff
    i + j + k is odd (docs/scoring.md, "Judge passes and position balance")."""
    verdicts: list[ShownVerdict] = []
    for row in rows:
        i, j, k = int(row["response_i"]), int(row["response_j"]), int(row["judge_idx"])
        triple = (float(row["score_1"]), float(row["score_2"]), float(row["ranking"]))
        if shown_swapped(position_balance, i, j, k):
            s1, s2, r = flip(triple)
            verdicts.append(ShownVerdict(j, i, s1, s2, r))
        else:
            verdicts.append(ShownVerdict(i, j, *triple))
    return GroupJudgments(key, size, tuple(verdicts))


# --- measurements -------------------------------------------------------------------------------


@final
@dataclass(frozen=True, slots=True)
class Measurement:
    """What the judgments say by themselves (docs/operations.md, "What it measures")."""

    calls: int
    first_win_share: float  # ties (ranking 3.5) count half
    mean_score_shift: float  # mean of score_first − score_second
    order_consistency: float | None  # pairs judged in both orders whose two winners agree
    pairs_in_both_orders: int
    cycle_share: float | None  # mean over groups of the cyclic share of decided triangles

    @property
    def first_win_excess(self) -> float:
        return self.first_win_share - 0.5


def _winner(first: int, second: int, ranking: float) -> int | None:
    if ranking < RANKING_MIDPOINT:
        return first
    if ranking > RANKING_MIDPOINT:
        return second
    return None


def measure(groups: Sequence[GroupJudgments]) -> Measurement:
    """Position bias, order consistency and the cycle share of the measured groups."""
    calls = wins = ties = 0
    shift = 0.0
    agree = both = 0
    cycles: list[float] = []
    for group in groups:
        shown: dict[tuple[int, int], list[int | None]] = {}
        for v in group.verdicts:
            calls += 1
            if v.ranking < RANKING_MIDPOINT:
                wins += 1
            elif v.ranking == RANKING_MIDPOINT:
                ties += 1
            shift += v.score_first - v.score_second
            shown.setdefault((v.first, v.second), []).append(_winner(v.first, v.second, v.ranking))
        for (a, b), forward in shown.items():
            if a > b:
                continue  # each pair once, from its lower member shown first
            for x in forward:
                for y in shown.get((b, a), ()):
                    both += 1
                    agree += x == y
        rate = preference_cycle_rate(group.member_comparisons(), range(group.size))
        if rate is not None:
            cycles.append(rate)
    return Measurement(
        calls=calls,
        first_win_share=(wins + ties / 2) / calls if calls else math.nan,
        mean_score_shift=shift / calls if calls else math.nan,
        order_consistency=agree / both if both else None,
        pairs_in_both_orders=both,
        cycle_share=math.fsum(cycles) / len(cycles) if cycles else None,
    )


# --- the judge model ----------------------------------------------------------------------------


def _cdf(x: float) -> float:
    return 0.5 * math.erfc(-x / math.sqrt(2.0))


def first_win_share(noise: float, bias: float) -> float:
    """The model's share of calls the first-shown answer wins: Φ(bias / √(2 + noise²))."""
    return _cdf(bias / math.sqrt(2.0 + noise * noise))


def consistency(noise: float, bias: float) -> float:
    """The model's chance that a pair's two orders name the same winner: with Δ = q_a − q_b ~
    N(0, 2), a wins shown first with Φ((Δ + bias)/noise) and shown second with
    Φ((Δ − bias)/noise), independently given Δ."""
    spread = 8.0 * math.sqrt(2.0)
    step = 2 * spread / _GRID
    total = 0.0
    for n in range(_GRID):
        # midpoints: Δ = 0, where a near-noiseless judge's two orders switch, is never one
        delta = -spread + (n + 0.5) * step
        weight = math.exp(-delta * delta / 4.0) / math.sqrt(4.0 * math.pi) * step
        first = _cdf((delta + bias) / noise)
        second = _cdf((delta - bias) / noise)
        total += weight * (first * second + (1.0 - first) * (1.0 - second))
    return total


def _bisect(
    f: Callable[[float], float], low: float, high: float, decreasing: bool, target: float
) -> float:
    """x in [low, high] where the monotone f meets target (an end when it never does)."""
    for _ in range(80):
        middle = math.sqrt(low * high)  # noise spans orders of magnitude
        above = f(middle) > target
        if above == decreasing:
            low = middle
        else:
            high = middle
    return math.sqrt(low * high)


@final
@dataclass(frozen=True, slots=True)
class JudgeFit:
    """The fitted judge (module docstring). Rankings of each side are sorted weakest first."""

    noise: float
    bias: float
    first_rankings: tuple[float, ...]  # rankings below 3.5 (and ties), weakest first
    second_rankings: tuple[float, ...]  # rankings above 3.5 (and ties), weakest first
    score_mode: ScoreMode
    scores_of_ranking: tuple[tuple[float, float, float], ...]  # (ranking, s1, s2), ranking mode
    score_values: tuple[float, ...]  # distinct scores, ascending (pointwise mode)
    score_cumulative: tuple[float, ...]  # share of scores ≤ each value (pointwise mode)
    score_noise: float  # pointwise mode

    def as_json(self) -> dict[str, Any]:
        return {
            "noise": self.noise,
            "bias": self.bias,
            "score_mode": self.score_mode,
            "score_noise": self.score_noise if self.score_mode == "pointwise" else None,
        }


def _intraclass_correlation(samples: Sequence[Sequence[float]]) -> float:
    """One-way ANOVA ICC(1) of the scores grouped by answer."""
    groups = [s for s in samples if len(s) >= 2]
    if len(groups) < 2:
        return 1.0
    values = [x for g in groups for x in g]
    grand = math.fsum(values) / len(values)
    between = math.fsum(len(g) * (math.fsum(g) / len(g) - grand) ** 2 for g in groups)
    within = math.fsum((x - math.fsum(g) / len(g)) ** 2 for g in groups for x in g)
    ms_between = between / (len(groups) - 1)
    ms_within = within / (len(values) - len(groups))
    per_group = len(values) / len(groups)
    denominator = ms_between + (per_group - 1) * ms_within
    if denominator <= 0:
        return 1.0
    return max(0.0, min(1.0, (ms_between - ms_within) / denominator))


def _score_cutpoints(cumulative: Sequence[float], score_noise: float) -> list[float]:
    scale = math.sqrt(1.0 + score_noise * score_noise)
    return [scale * _NORMAL.inv_cdf(min(max(c, 1e-12), 1 - 1e-12)) for c in cumulative[:-1]]


def _model_icc(values: Sequence[float], cumulative: Sequence[float], score_noise: float) -> float:
    """The ICC that rounding u = q + score_noise·η to the measured score quantiles gives."""
    cuts = _score_cutpoints(cumulative, score_noise)
    means: list[float] = []
    variances: list[float] = []
    weights: list[float] = []
    for n in range(81):
        q = -5.0 + n * 0.125
        weights.append(math.exp(-q * q / 2))
        below = [_cdf((c - q) / score_noise) for c in cuts] + [1.0]
        probabilities = [below[0]] + [below[k] - below[k - 1] for k in range(1, len(below))]
        mean = math.fsum(p * v for p, v in zip(probabilities, values, strict=True))
        second = math.fsum(p * v * v for p, v in zip(probabilities, values, strict=True))
        means.append(mean)
        variances.append(max(0.0, second - mean * mean))
    total = math.fsum(weights)
    grand = math.fsum(w * m for w, m in zip(weights, means, strict=True)) / total
    between = math.fsum(w * (m - grand) ** 2 for w, m in zip(weights, means, strict=True)) / total
    within = math.fsum(w * v for w, v in zip(weights, variances, strict=True)) / total
    return between / (between + within) if between + within > 0 else 1.0


def fit_judge(groups: Sequence[GroupJudgments], measurement: Measurement) -> JudgeFit:
    """The judge model (module docstring) that reproduces ``measurement`` and the verdicts'
    strengths and scores."""
    share = min(max(measurement.first_win_share, 1e-6), 1 - 1e-6)
    z = _NORMAL.inv_cdf(share)
    agreement = measurement.order_consistency
    if agreement is None:
        raise ValueError("no pair was judged in both orders: order consistency is unknown")

    def bias_of(noise: float) -> float:
        return z * math.sqrt(2.0 + noise * noise)

    noise = _bisect(
        lambda s: consistency(s, bias_of(s)),
        _LOWEST_NOISE,
        _HIGHEST_NOISE,
        decreasing=True,
        target=agreement,
    )
    verdicts = [v for g in groups for v in g.verdicts]
    first = sorted((v.ranking for v in verdicts if v.ranking <= RANKING_MIDPOINT), reverse=True)
    second = sorted(v.ranking for v in verdicts if v.ranking >= RANKING_MIDPOINT)
    by_ranking: dict[float, Counter[tuple[float, float]]] = {}
    for v in verdicts:
        by_ranking.setdefault(v.ranking, Counter())[(v.score_first, v.score_second)] += 1
    modal = {r: c.most_common(1)[0] for r, c in by_ranking.items()}
    tied = sum(count for _, count in modal.values()) / len(verdicts) if verdicts else 1.0
    scores = sorted(s for v in verdicts for s in (v.score_first, v.score_second))
    values = tuple(sorted(set(scores)))
    counts = Counter(scores)
    running = 0
    cumulative: list[float] = []
    for value in values:
        running += counts[value]
        cumulative.append(running / len(scores))
    mode: ScoreMode = "ranking" if tied >= TIED_SCORES_SHARE else "pointwise"
    score_noise = 0.0
    if mode == "pointwise":
        per_answer: dict[tuple[int, int], list[float]] = {}
        for g_index, g in enumerate(groups):
            for v in g.verdicts:
                per_answer.setdefault((g_index, v.first), []).append(v.score_first)
                per_answer.setdefault((g_index, v.second), []).append(v.score_second)
        icc = _intraclass_correlation(list(per_answer.values()))
        score_noise = _bisect(
            lambda s: _model_icc(values, cumulative, s),
            _LOWEST_NOISE,
            _HIGHEST_NOISE,
            decreasing=True,
            target=icc,
        )
    return JudgeFit(
        noise=noise,
        bias=bias_of(noise),
        first_rankings=tuple(first) or (3.0,),
        second_rankings=tuple(second) or (4.0,),
        score_mode=mode,
        scores_of_ranking=tuple((r, s[0][0], s[0][1]) for r, s in sorted(modal.items())),
        score_values=values,
        score_cumulative=tuple(cumulative),
        score_noise=score_noise,
    )


# --- simulated schedules ------------------------------------------------------------------------


@final
@dataclass(frozen=True, slots=True)
class Schedule:
    """A way to score a group: the config keys a recommendation pastes (docs/configuration.md)."""

    strategy: ComparisonStrategy
    judges: int
    aggregator: AggregatorMethod
    degree: int = 2  # comparisons_per_rollout (regular only)

    def calls(self, size: int) -> int:
        return len(self.plan(size))

    def plan(self, size: int) -> list[PlannedComparison]:
        return plan_comparisons(size, self.strategy, self.judges, POSITION_BALANCE, self.degree)

    @property
    def name(self) -> str:
        match self.strategy:
            case "regular":
                graph = f"regular d={self.degree}"
            case "circular" | "all_pairs":
                graph = self.strategy
            case _:
                assert_never(self.strategy)
        return f"{graph} J={self.judges} {self.aggregator}"

    @property
    def comparisons_per_rollout(self) -> int | None:
        """The key of `regular` only; None for the strategies without it."""
        match self.strategy:
            case "regular":
                return self.degree
            case "circular" | "all_pairs":
                return None
            case _:
                assert_never(self.strategy)

    def config_lines(self) -> list[str]:
        """The keys of `as_json` as config lines, the strategies' unused key left out."""
        return [f"{key}: {value}" for key, value in self.as_json().items() if value is not None]

    def as_json(self) -> dict[str, Any]:
        return {
            "comparison_strategy": self.strategy,
            "comparisons_per_rollout": self.comparisons_per_rollout,
            "num_judges_per_comparison": self.judges,
            "position_balance": POSITION_BALANCE,
            "aggregator_method": self.aggregator,
        }


def _degrees(size: int) -> list[int]:
    """d = 3 … N − 2; beyond 24 rollouts a coarser ladder (each step at most a third more calls),
    so that simulating every schedule stays within seconds."""
    if size <= 24:
        return list(range(3, size - 1))
    ladder = {3, 4, 5, 6, 7, 8}
    d = 8
    while d < size - 1:
        d = max(d + 1, math.ceil(d * 4 / 3))
        ladder.add(d)
    return sorted(x for x in ladder if x <= size - 2)


def schedules_for(size: int) -> list[Schedule]:
    """Every schedule the project has for groups of ``size`` (docs/scoring.md, "Pairs"):
    circular J = 1 and 2, regular d = 3 … N − 2 (`_degrees`; d = 2 is circular, N − 1 all_pairs;
    N·d even),
    all_pairs J = 1 and 2, each with both aggregators, all with `position_balance: alternate`."""
    graphs: list[tuple[ComparisonStrategy, int, int]] = [
        ("circular", 1, 2),
        ("circular", 2, 2),
    ]
    graphs += [("regular", 1, d) for d in _degrees(size) if size * d % 2 == 0]
    graphs += [("all_pairs", 1, 2), ("all_pairs", 2, 2)]
    if size < 3:
        graphs = [("all_pairs", 1, 2), ("all_pairs", 2, 2)]
    return [Schedule(s, j, a, d) for s, j, d in graphs for a in AGGREGATORS]


@final
@dataclass(frozen=True, slots=True)
class FrontierPoint:
    schedule: Schedule
    calls_per_group: int
    tau: float
    tau_se: float

    def as_json(self) -> dict[str, Any]:
        return {
            **self.schedule.as_json(),
            "name": self.schedule.name,
            "calls_per_group": self.calls_per_group,
            "kendall_tau": self.tau,
            "kendall_tau_se": self.tau_se,
        }


def kendall_tau_b(x: Sequence[float], y: Sequence[float]) -> float | None:
    """Kendall's τ-b (ties in either ranking handled); None when either side is constant."""
    concordant = discordant = ties_x = ties_y = 0
    n = len(x)
    for a in range(n):
        for b in range(a + 1, n):
            dx, dy = x[a] - x[b], y[a] - y[b]
            if dx == 0 and dy == 0:
                continue
            if dx == 0:
                ties_x += 1
            elif dy == 0:
                ties_y += 1
            elif (dx > 0) == (dy > 0):
                concordant += 1
            else:
                discordant += 1
    pairs_x = concordant + discordant + ties_y
    pairs_y = concordant + discordant + ties_x
    if pairs_x == 0 or pairs_y == 0:
        return None
    return (concordant - discordant) / math.sqrt(pairs_x * pairs_y)


def mean_and_standard_error(values: Sequence[float]) -> tuple[float, float]:
    """The mean of ``values`` and its standard error (nan where there are too few values)."""
    n = len(values)
    if n == 0:
        return math.nan, math.nan
    mean = math.fsum(values) / n
    if n == 1:
        return mean, math.nan
    variance = math.fsum((v - mean) ** 2 for v in values) / (n - 1)
    return mean, math.sqrt(variance / n)


@final
class _Simulator:
    """Verdicts of the fitted judge for one simulated group (its draws shared by all schedules:
    the same pair shown the same way in the same pass gets the same verdict)."""

    def __init__(self, fit: JudgeFit, size: int, rng: random.Random) -> None:
        self.fit = fit
        self.quality = [rng.gauss(0.0, 1.0) for _ in range(size)]
        draws = 2 * size * size
        self._ranking_noise = [rng.gauss(0.0, 1.0) for _ in range(draws)]
        self._score_noise = [rng.gauss(0.0, 1.0) for _ in range(2 * draws)]
        self._size = size
        self._spread = math.sqrt(2.0 + fit.noise * fit.noise)
        self._zero = _cdf(-fit.bias / self._spread)  # P(z < 0)
        self._scores = {r: (s1, s2) for r, s1, s2 in fit.scores_of_ranking}
        self._cuts = (
            _score_cutpoints(fit.score_cumulative, fit.score_noise)
            if fit.score_mode == "pointwise"
            else []
        )

    def _pointwise(self, quality: float, noise: float) -> float:
        u = quality + self.fit.score_noise * noise
        for value, cut in zip(self.fit.score_values, self._cuts, strict=False):
            if u <= cut:
                return value
        return self.fit.score_values[-1]

    def verdict(self, first: int, second: int, k: int) -> tuple[float, float, float]:
        fit = self.fit
        draw = (k * self._size + first) * self._size + second
        z = (
            self.quality[first]
            - self.quality[second]
            + fit.bias
            + fit.noise * self._ranking_noise[draw]
        )
        below = _cdf((z - fit.bias) / self._spread)  # z's quantile in its marginal
        if z > 0:
            side = fit.first_rankings
            u = (below - self._zero) / (1.0 - self._zero) if self._zero < 1.0 else 0.5
        else:
            side = fit.second_rankings
            u = 1.0 - below / self._zero if self._zero > 0.0 else 0.5
        ranking = side[min(len(side) - 1, max(0, int(u * len(side))))]
        match fit.score_mode:
            case "ranking":
                s1, s2 = self._scores[ranking]
            case "pointwise":
                s1 = self._pointwise(self.quality[first], self._score_noise[2 * draw])
                s2 = self._pointwise(self.quality[second], self._score_noise[2 * draw + 1])
            case _:
                assert_never(fit.score_mode)
        return (s1, s2, ranking)


def simulate_frontier(
    fit: JudgeFit,
    size: int,
    *,
    groups: int = SIMULATED_GROUPS,
    seed: int = 0,
    prior: float = 0.1,
    schedules: Sequence[Schedule] | None = None,
) -> list[FrontierPoint]:
    """Each schedule's mean Kendall τ (and its standard error) of the rewards against the latent
    quality over ``groups`` groups of ``size`` simulated under ``fit``, calls per group beside it.
    ``prior``: bradley_terry_prior."""
    chosen = list(schedules) if schedules is not None else schedules_for(size)
    plans = {s: s.plan(size) for s in chosen}
    taus: dict[Schedule, list[float]] = {s: [] for s in chosen}
    for group in range(groups):
        simulator = _Simulator(fit, size, random.Random(f"calibrate:{seed}:{group}"))
        population = range(size)
        for schedule in chosen:
            comparisons = []
            for planned in plans[schedule]:
                first, second = planned.shown
                shown = simulator.verdict(first, second, planned.k)
                scores = planned.to_member_orientation(shown)
                comparisons.append(JudgedComparison(planned.i, planned.j, planned.k, scores))
            result = aggregate(
                comparisons,
                population,
                {},
                **NO_ADJUSTMENTS,
                method=schedule.aggregator,
                bradley_terry_prior=prior,
            )
            tau = kendall_tau_b([result.final[m] for m in population], simulator.quality)
            if tau is not None:
                taus[schedule].append(tau)
    return [
        FrontierPoint(schedule, len(plans[schedule]), *mean_and_standard_error(taus[schedule]))
        for schedule in chosen
    ]


def recommend(
    points: Sequence[FrontierPoint], size: int, tolerance: float = TOLERANCE
) -> FrontierPoint:
    """The cheapest schedule whose τ is within ``tolerance`` of the best τ at up to all_pairs'
    budget, one call per pair (docs/scoring.md, "Choosing a schedule for your judge"); the higher
    τ among equally cheap ones."""
    budget = size * (size - 1) // 2
    scored = [p for p in points if not math.isnan(p.tau)]
    affordable = [p for p in scored if p.calls_per_group <= budget]
    if not affordable:
        raise ValueError("no schedule has a τ")
    best = max(p.tau for p in affordable)
    good = [p for p in scored if p.tau >= best - tolerance]
    return min(good, key=lambda p: (p.calls_per_group, -p.tau))
