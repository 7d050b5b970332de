"""Rewards from the comparison graph (docs/scoring.md "Bradley–Terry", "Masking by connectivity",
"Graph metrics"; D45, D46): the Bradley–Terry optimum against independent computations, relabelling,
the component rule on scripted graphs with exact masked sets and reasons, the cycle share, and the
tables that must stay in step with the settings' vocabularies."""

from __future__ import annotations

import math
import random
import re
from itertools import combinations
from typing import get_args

import pytest
from graph_keys import degree, graph_choices
from hypothesis import given, settings
from hypothesis import strategies as st
from judges import NO_ADJ

from genrm_trio.config import (
    DEFAULT_COMPARISONS_PER_ROLLOUT,
    AggregatorMethod,
    ComparisonStrategy,
    MaskPolicy,
    PositionBalance,
)
from genrm_trio.domain.scoring import (
    BT_LOG_LIKELIHOOD,
    CYCLE_RATE,
    AllMasked,
    JudgedComparison,
    Masking,
    MemberTexts,
    PairObservations,
    PlannedComparison,
    ScoringInput,
    aggregate,
    aggregator,
    bradley_terry_scores,
    components,
    density_weights,
    fit_bradley_terry,
    largest_component,
    mask_members,
    plan_comparisons,
    plan_fixed_baseline,
    preference_cycle_rate,
    tiebreak_scores,
)


def jc(
    i: int, j: int, ranking: float, k: int = 0, s1: float = 3.0, s2: float = 3.0
) -> JudgedComparison:
    return JudgedComparison(i, j, k, (s1, s2, ranking))


def bt(comparisons: list[JudgedComparison], population: list[int], prior: float = 0.1) -> dict:
    agg = aggregate(comparisons, population, {}, **NO_ADJ, method="bradley_terry",
                    bradley_terry_prior=prior)  # fmt: skip
    return agg.base


def logit(p: float) -> float:
    return math.log(p / (1.0 - p))


def sigma(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def objective(theta: dict[int, float], comparisons: list[JudgedComparison], prior: float) -> float:
    """F(θ) written from the issue's formula, one term per observation (no aggregation by pair)."""
    total = 0.0
    for c in comparisons:
        y = (6.0 - c.scores[2]) / 5.0
        d = theta[c.i] - theta[c.j]
        total += y * math.log(sigma(d)) + (1.0 - y) * math.log(sigma(-d))
    return total - prior / 2.0 * sum(t * t for t in theta.values())


def gradient(theta: dict[int, float], comparisons: list[JudgedComparison], prior: float) -> dict:
    """∂F/∂θ_m, one term per observation: the optimality conditions are all of these = 0."""
    grad = {m: -prior * t for m, t in theta.items()}
    for c in comparisons:
        y = (6.0 - c.scores[2]) / 5.0
        g = y - sigma(theta[c.i] - theta[c.j])
        grad[c.i] += g
        grad[c.j] -= g
    return grad


def theta_from_base(base: dict[int, float]) -> dict[int, float]:
    """θ_m − θ̄ from a base score 1 + 4σ(θ_m − θ̄)."""
    return {m: logit((b - 1.0) / 4.0) for m, b in base.items()}


def random_graph(
    rng: random.Random,
    n: int,
    strategy: str,
    judges: int,
    keep: float,
    d: int = DEFAULT_COMPARISONS_PER_ROLLOUT,
) -> list:
    plan = plan_comparisons(n, strategy, judges, rng.choice(get_args(PositionBalance)), d)
    rankings = [1.0, 2.0, 3.0, 3.5, 4.0, 5.0, 6.0]
    return [
        jc(p.i, p.j, rng.choice(rankings), p.k, rng.choice([1.0, 3.0, 5.0]), 3.0)
        for p in plan
        if rng.random() < keep
    ]


# ----------------------------------------------------------------------------- Bradley–Terry


class TestBradleyTerryOptimum:
    @pytest.mark.parametrize("seed", range(40))
    def test_the_optimality_conditions_hold_at_the_rewards(self, seed: int) -> None:
        """With every vertex scored, Σθ = 0 at the optimum (the pairwise terms of Σ_m ∂F/∂θ_m
        cancel, leaving −λΣθ), so θ_m = logit((base_m − 1)/4) exactly; every ∂F/∂θ_m is then 0."""
        rng = random.Random(seed)
        n = rng.randint(2, 12)
        graph = rng.choice(graph_choices(n))  # every graph the settings accept on n rollouts
        comparisons = random_graph(rng, n, graph["comparison_strategy"], 2, 0.8, degree(graph))
        prior = rng.choice([0.1, 0.02, 1.0])
        theta = theta_from_base(bt(comparisons, list(range(n)), prior))
        grad = gradient(theta, comparisons, prior)
        assert max(abs(g) for g in grad.values()) <= 1e-8  # 1e-9 at θ, plus the logit round trip
        # and it is a maximum: no perturbation does better
        best = objective(theta, comparisons, prior)
        for _ in range(20):
            moved = {m: t + rng.gauss(0, 0.01) for m, t in theta.items()}
            assert objective(moved, comparisons, prior) < best

    @pytest.mark.parametrize("seed", range(40))
    def test_the_fit_itself_meets_the_tolerance(self, seed: int) -> None:
        rng = random.Random(1000 + seed)
        n = rng.randint(2, 30)
        pairs = []
        for a, b in combinations(range(n), 2):
            if rng.random() < 0.3:
                count = rng.randint(1, 4)
                pairs.append(
                    PairObservations(a, b, count, count * rng.choice([0.0, 0.2, 0.6, 1.0]))
                )
        prior = rng.choice([0.1, 1e-3, 5.0])
        fit = fit_bradley_terry(n, pairs, prior)
        grad = [-prior * t for t in fit.theta]
        for p in pairs:
            g = p.wins_a - p.count * sigma(fit.theta[p.a] - fit.theta[p.b])
            grad[p.a] += g
            grad[p.b] -= g
        assert max(map(abs, grad)) <= 1e-9
        assert fit.observations == sum(p.count for p in pairs)
        assert fit.newton_steps <= 30

    @pytest.mark.parametrize(("ys", "prior"), [([1.0], 0.1), ([0.8, 0.6], 0.1), ([0.0] * 5, 0.5)])
    def test_two_members_against_bisection(self, ys: list[float], prior: float) -> None:
        """Two members, n observations with mean ȳ: θ = (t, −t) with n(ȳ − σ(2t)) = λt, solved here
        by bisection (a different method on a one-dimensional equation)."""
        comparisons = [jc(0, 1, 6.0 - 5.0 * y) for y in ys]
        n, mean_y = len(ys), sum(ys) / len(ys)
        lo, hi = -50.0, 50.0
        for _ in range(200):
            t = (lo + hi) / 2
            if n * (mean_y - sigma(2 * t)) - prior * t > 0:
                lo = t
            else:
                hi = t
        base = bt(comparisons, [0, 1], prior)
        assert base[0] == pytest.approx(1 + 4 * sigma(t), abs=1e-12)  # θ_0 − θ̄ = t
        assert base[1] == pytest.approx(1 + 4 * sigma(-t), abs=1e-12)

    def test_worked_example(self) -> None:
        """docs/scoring.md, "Bradley–Terry": σ(3t) = 0.8 − 0.1t, solved here by bisection."""
        lo, hi = 0.0, 2.0
        for _ in range(200):
            t = (lo + hi) / 2
            lo, hi = (lo, t) if sigma(3 * t) > 0.8 - 0.1 * t else (t, hi)
        comparisons = [jc(0, 1, 2.0), jc(1, 2, 5.0), jc(2, 0, 3.5)]
        agg = aggregate(comparisons, [0, 1, 2], {}, **NO_ADJ, method="bradley_terry")
        assert agg.base[0] == agg.base[2] == pytest.approx(1 + 4 * sigma(t), abs=1e-12)
        assert agg.base[1] == pytest.approx(1 + 4 * sigma(-2 * t), abs=1e-12)
        assert round(t, 4) == 0.3867
        assert (round(agg.base[0], 4), round(agg.base[1], 4)) == (3.3819, 2.2630)
        assert round(agg.method_metrics[BT_LOG_LIKELIHOOD], 4) == -0.5675

    def test_observation_is_six_minus_ranking_over_five_from_the_first_shown(self) -> None:
        """A verdict of the swapped orientation is the same observation: (i, j, r) and
        (j, i, 7 − r) give the same fit."""
        straight = bt([jc(0, 1, 2.0), jc(1, 2, 5.0)], [0, 1, 2])
        flipped = bt([jc(1, 0, 5.0), jc(2, 1, 2.0)], [0, 1, 2])
        for m in range(3):
            assert flipped[m] == pytest.approx(straight[m], abs=1e-12)
        assert straight[0] > straight[1] and straight[2] > straight[1]

    def test_scores_ignore_the_scores_and_use_the_ranking(self) -> None:
        a = bt([jc(0, 1, 2.0, s1=5.0, s2=1.0)], [0, 1])
        b = bt([jc(0, 1, 2.0, s1=1.0, s2=5.0)], [0, 1])
        assert a == b

    def test_a_fallback_verdict_is_an_even_observation(self) -> None:
        """(default_score, default_score, 3.5): y = 0.5, no pull either way."""
        assert bt([jc(0, 1, 3.5)], [0, 1]) == {0: 3.0, 1: 3.0}

    def test_average_member_scores_three_and_the_scale_is_one_to_five(self) -> None:
        base = bt([jc(0, 1, 1.0)] * 40, [0, 1], prior=1e-4)
        assert base[0] + base[1] == pytest.approx(6.0, abs=1e-12)  # σ(x) + σ(−x) = 1
        assert 4.95 < base[0] < 5.0 and 1.0 < base[1] < 1.05

    def test_masked_members_take_part_but_are_not_reported(self) -> None:
        """Circular 0-1-2-3-0 with 3 masked: its comparisons still measure 0 and 2; θ̄ is over
        the scored members."""
        comparisons = [jc(0, 1, 2.0), jc(1, 2, 4.0), jc(2, 3, 1.0), jc(3, 0, 6.0)]
        full = bt(comparisons, [0, 1, 2, 3])
        scored = bt(comparisons, [0, 1, 2])
        assert set(scored) == {0, 1, 2}
        theta_full = theta_from_base(full)  # Σθ = 0 over all four here
        mean = sum(theta_full[m] for m in (0, 1, 2)) / 3
        for m in (0, 1, 2):
            assert scored[m] == pytest.approx(1 + 4 * sigma(theta_full[m] - mean), abs=1e-9)

    def test_fixed_baseline_vertex_anchors_members(self) -> None:
        """Baseline index 2: both members only meet it; the better member against the baseline
        scores higher, and the two are centred on 3 (θ̄ over members, not the baseline)."""
        plan = plan_fixed_baseline(2, 2, "g::0")
        verdicts = {0: 1.0, 1: 4.0}  # member-oriented rankings vs the baseline
        comparisons = [jc(p.i, p.j, verdicts[p.i], p.k) for p in plan]
        base = bt(comparisons, [0, 1])
        assert base[0] > 3.0 > base[1]
        assert base[0] + base[1] == pytest.approx(6.0, abs=1e-12)

    def test_singleton_population_scores_three(self) -> None:
        assert bt([jc(0, 1, 1.0)], [0]) == {0: 3.0}

    def test_prior_must_be_positive(self) -> None:
        with pytest.raises(ValueError, match="bradley_terry_prior"):
            fit_bradley_terry(2, [PairObservations(0, 1, 1, 1.0)], 0.0)

    @pytest.mark.parametrize("ranking", [-1e300, 1e300])
    def test_overflowing_unvalidated_rankings_give_nan_never_an_error(self, ranking: float) -> None:
        base = bt([jc(0, 1, ranking)], [0, 1])
        assert all(math.isnan(v) for v in base.values())

    def test_unvalidated_ranking_outside_the_range_still_has_one_maximiser(self) -> None:
        """y = (6 − (−4))/5 = 2: the objective stays strictly concave (each observation's second
        derivative is −σ(d)σ(−d) whatever y is), so the fit exists and meets the conditions."""
        comparisons = [jc(0, 1, -4.0), jc(1, 2, 3.0)]
        theta = theta_from_base(bt(comparisons, [0, 1, 2]))
        assert max(abs(g) for g in gradient(theta, comparisons, 0.1).values()) <= 1e-8

    def test_a_large_circular_group_is_cheap(self) -> None:
        """The envelope Cholesky keeps circular graphs O(N) per step (N = 512 here)."""
        rng = random.Random(7)
        comparisons = random_graph(rng, 512, "circular", 2, 1.0)
        theta = theta_from_base(bt(comparisons, list(range(512))))
        assert max(abs(g) for g in gradient(theta, comparisons, 0.1).values()) <= 1e-8

    def test_log_likelihood_per_observation(self) -> None:
        comparisons = [jc(0, 1, 2.0), jc(1, 2, 5.0), jc(0, 2, 1.0), jc(0, 1, 3.0)]
        agg = aggregate(comparisons, [0, 1, 2], {}, **NO_ADJ, method="bradley_terry")
        theta = theta_from_base(agg.base)
        expected = objective(theta, comparisons, 0.1) + 0.05 * sum(t * t for t in theta.values())
        assert agg.method_metrics[BT_LOG_LIKELIHOOD] == pytest.approx(expected / 4, abs=1e-9)
        assert agg.method_metrics[CYCLE_RATE] == 0.0  # 0 > 1, 2 > 1, 0 > 2: transitive


@st.composite
def graphs(draw: st.DrawFn) -> tuple[int, list[JudgedComparison], list[int]]:
    n = draw(st.integers(2, 8))
    pairs = [(i, j) for i in range(n) for j in range(n) if i != j]
    comparison = st.builds(
        lambda p, r, k: jc(p[0], p[1], r, k),
        st.sampled_from(pairs),
        st.sampled_from([1.0, 2.0, 3.0, 3.5, 4.0, 5.0, 6.0]),
        st.integers(0, 2),
    )
    comparisons = draw(st.lists(comparison, max_size=24))
    population = sorted(draw(st.sets(st.integers(0, n - 1), min_size=1)))
    return n, comparisons, population


class TestRelabelling:
    @settings(max_examples=200, deadline=None)
    @given(graphs(), st.data())
    def test_relabelling_members_permutes_the_rewards(
        self, graph: tuple, data: st.DataObject
    ) -> None:
        n, comparisons, population = graph
        perm = data.draw(st.permutations(range(n)))
        moved = [JudgedComparison(perm[c.i], perm[c.j], c.k, c.scores) for c in comparisons]
        tx = {m: MemberTexts(10 * m, 7 * m + 1, 0.0) for m in range(n)}
        tx_p = {perm[m]: t for m, t in tx.items()}
        coeffs = {**NO_ADJ, "group_answer_length_penalty_coeff": 0.3}
        a = aggregate(comparisons, population, tx, **coeffs, method="bradley_terry")
        b = aggregate(moved, [perm[m] for m in population], tx_p, **coeffs, method="bradley_terry")
        for m in population:
            assert b.base[perm[m]] == pytest.approx(a.base[m], abs=1e-9)
            assert b.final[perm[m]] == pytest.approx(a.final[m], abs=1e-9)
        assert b.method_metrics.keys() == a.method_metrics.keys()
        for key, value in a.method_metrics.items():
            assert b.method_metrics[key] == pytest.approx(value, abs=1e-9)

    @settings(max_examples=200, deadline=None)
    @given(graphs())
    def test_bradley_terry_scores_stay_on_the_judges_scale(self, graph: tuple) -> None:
        _, comparisons, population = graph
        base = bt(comparisons, population)
        assert all(1.0 < v < 5.0 for v in base.values())
        if len(population) > 1:  # centred: σ(θ − θ̄) averages near, not exactly, 0.5
            assert min(base.values()) <= 3.0 + 1e-12 <= max(base.values()) + 2e-12


class TestAdjustmentsOnEitherBase:
    def test_the_same_adjustments_apply_to_bradley_terry_base_scores(self) -> None:
        comparisons = [jc(0, 1, 2.0), jc(1, 2, 2.0), jc(2, 0, 5.0)]
        tx = {0: MemberTexts(0, 10, 0.0), 1: MemberTexts(0, 20, 0.5), 2: MemberTexts(0, 40, 0.1)}
        coeffs = {**NO_ADJ, "group_answer_length_penalty_coeff": 0.5,
                  "group_style_penalty_coeff": 0.25}  # fmt: skip
        agg = aggregate(comparisons, [0, 1, 2], tx, **coeffs, method="bradley_terry")
        length = density_weights([10, 20, 40])
        style = density_weights([0.0, 0.5, 0.1])
        for m in range(3):
            expected = agg.base[m] + length[m] * 0.5 + style[m] * 0.25
            assert agg.final[m] == pytest.approx(expected, abs=1e-12)
            assert agg.adjustments[m] == pytest.approx(length[m] * 0.5 + style[m] * 0.25, abs=1e-12)

    def test_simple_tiebreaker_is_the_default_method_and_reports_no_method_metrics(self) -> None:
        comparisons = [jc(0, 1, 2.0, s1=4.0, s2=2.0), jc(1, 0, 3.0)]
        default = aggregate(comparisons, [0, 1], {}, **NO_ADJ)
        named = aggregate(comparisons, [0, 1], {}, **NO_ADJ, method="simple_tiebreaker")
        assert default == named
        assert default.base == {0: (4.0 + 2.5) / 2, 1: (2.0 + 3.5) / 2}
        assert default.method_metrics == {}

    def test_d10_metrics_are_the_same_whatever_the_method(self) -> None:
        comparisons = [jc(0, 1, 2.0, s1=4.0, s2=2.0), jc(1, 0, 3.0)]
        a = aggregate(comparisons, [0, 1], {}, **NO_ADJ)
        b = aggregate(comparisons, [0, 1], {}, **NO_ADJ, method="bradley_terry")
        assert (
            a.metrics
            == b.metrics
            == {
                "mean_individual_score": 3.0,
                "std_individual_score": pytest.approx(math.sqrt(0.5)),
                "tiebreak_usage_rate": 0.5,
            }
        )

    def test_unknown_method(self) -> None:
        with pytest.raises(ValueError, match="Unsupported aggregator_method: 'mean'"):
            aggregate([], [0], {}, **NO_ADJ, method="mean")


# ----------------------------------------------------------------------------- components


def errors_for(plan: list[PlannedComparison], failing: set[tuple[int, int, int]]) -> list:
    """The judge error of each planned comparison: `E(i,j,k)` for those in `failing`."""
    return [f"E{(p.i, p.j, p.k)}" if (p.i, p.j, p.k) in failing else None for p in plan]


class TestComponents:
    def test_components_and_the_tie_rule(self) -> None:
        assert components(5, [(3, 4), (0, 2)]) == [[0, 2], [1], [3, 4]]
        assert largest_component(5, [(3, 4), (0, 2)]) == [0, 2]  # size tie: the smallest index
        assert largest_component(5, [(3, 4), (4, 1), (0, 2)]) == [1, 3, 4]
        assert largest_component(3, []) == [0]
        assert largest_component(0, []) == []

    def test_all_pairs_one_failure_masks_nobody(self) -> None:
        """Pair masks 0 and 1; component keeps all four (0-1 is reached through 2 and 3)."""
        plan = plan_comparisons(4, "all_pairs", 1)
        errors = errors_for(plan, {(0, 1, 0)})
        pair = mask_members("pair", 4, plan, errors)
        assert isinstance(pair, Masking) and pair.scored == [2, 3] and set(pair.reasons) == {0, 1}
        assert mask_members("component", 4, plan, errors) == Masking([0, 1, 2, 3], {})

    def test_all_pairs_isolated_member_is_masked_alone(self) -> None:
        plan = plan_comparisons(4, "all_pairs", 1)
        errors = errors_for(plan, {(0, 3, 0), (1, 3, 0), (2, 3, 0)})
        result = mask_members("component", 4, plan, errors)
        assert isinstance(result, Masking) and result.scored == [0, 1, 2]
        assert result.reasons == {
            3: "GenRM rollout_index=3 is outside the largest connected component of the comparison "
            "graph (3 of 4 rollouts are in it; 3 of 6 comparisons failed) and lost a comparison "
            "to a judge failure: E(0, 3, 0)"
        }

    def test_circular_cut_twice_keeps_the_larger_arc(self) -> None:
        """Circular N = 8, (0,1) and (3,4) fail: arcs {1,2,3} and {4,5,6,7,0}. Member 2 lost
        nothing but is cut off; pair would mask only 0, 1, 3, 4."""
        plan = plan_comparisons(8, "circular", 1)
        errors = errors_for(plan, {(0, 1, 0), (3, 4, 0)})
        result = mask_members("component", 8, plan, errors)
        assert isinstance(result, Masking) and result.scored == [0, 4, 5, 6, 7]
        where = (
            "is outside the largest connected component of the comparison graph (5 of 8 "
            "rollouts are in it; 2 of 8 comparisons failed)"
        )
        assert result.reasons == {
            1: f"GenRM rollout_index=1 {where} and lost a comparison to a judge failure: "
            "E(0, 1, 0)",
            2: f"GenRM rollout_index=2 {where}; it lost no comparison, failures elsewhere cut it "
            "off: E(0, 1, 0)",
            3: f"GenRM rollout_index=3 {where} and lost a comparison to a judge failure: "
            "E(3, 4, 0)",
        }
        pair = mask_members("pair", 8, plan, errors)
        assert isinstance(pair, Masking) and pair.scored == [2, 5, 6, 7]

    def test_circular_equal_arcs_keep_the_one_with_the_smallest_index(self) -> None:
        plan = plan_comparisons(4, "circular", 1)
        errors = errors_for(plan, {(0, 1, 0), (2, 3, 0)})
        result = mask_members("component", 4, plan, errors)
        assert isinstance(result, Masking) and result.scored == [0, 3]
        assert set(result.reasons) == {1, 2}

    def test_one_failed_pass_of_two_keeps_the_edge(self) -> None:
        plan = plan_comparisons(4, "circular", 2, "alternate")
        errors = errors_for(plan, {(0, 1, 0), (2, 3, 1)})
        assert mask_members("component", 4, plan, errors) == Masking([0, 1, 2, 3], {})
        assert mask_members("pair", 4, plan, errors) == AllMasked(
            "GenRM masked every rollout of the group after judge failures (2 of 8 comparisons "
            "failed): E(0, 1, 0)"
        )

    def test_every_comparison_failed_fails_the_group(self) -> None:
        plan = plan_comparisons(3, "circular", 1)
        errors = errors_for(plan, {(p.i, p.j, p.k) for p in plan})
        expected = AllMasked(
            "GenRM masked every rollout of the group after judge failures (3 of 3 comparisons "
            "failed): E(0, 1, 0)"
        )
        assert mask_members("component", 3, plan, errors) == expected
        assert mask_members("pair", 3, plan, errors) == expected

    def test_a_single_success_is_a_component_of_two(self) -> None:
        plan = plan_comparisons(3, "circular", 1)
        errors = errors_for(plan, {(0, 1, 0), (2, 0, 0)})  # only (1, 2) succeeded
        result = mask_members("component", 3, plan, errors)
        assert (
            isinstance(result, Masking) and result.scored == [1, 2] and set(result.reasons) == {0}
        )

    def test_fixed_baseline_is_a_vertex_never_scored(self) -> None:
        """N = 3, J = 2: member 1 failed both passes (isolated), member 0 one of two (scored
        from the other under component, masked under pair)."""
        plan = plan_fixed_baseline(3, 2, "g::0")
        errors = errors_for(plan, {(1, 3, 0), (1, 3, 1), (0, 3, 1)})
        result = mask_members("component", 3, plan, errors)
        assert isinstance(result, Masking) and result.scored == [0, 2]
        assert set(result.reasons) == {1}
        pair = mask_members("pair", 3, plan, errors)
        assert isinstance(pair, Masking) and pair.scored == [2]

    def test_fixed_baseline_singleton(self) -> None:
        plan = plan_fixed_baseline(1, 1, "g::0")
        assert mask_members("component", 1, plan, [None]) == Masking([0], {})
        failed = mask_members("component", 1, plan, ["boom"])
        assert isinstance(failed, AllMasked) and failed.message.endswith(
            "(1 of 1 comparisons failed): boom"
        )

    def test_pair_policy_reasons_are_the_partial_masking_texts(self) -> None:
        plan = plan_comparisons(4, "circular", 1)
        errors = errors_for(plan, {(0, 1, 0)})
        assert mask_members("pair", 4, plan, errors) == Masking(
            [2, 3],
            {
                0: "GenRM rollout_index=0 lost a comparison to a judge failure (1 of 4 "
                "comparisons failed): E(0, 1, 0)",
                1: "GenRM rollout_index=1 lost a comparison to a judge failure (1 of 4 "
                "comparisons failed): E(0, 1, 0)",
            },
        )

    def test_bad_arguments(self) -> None:
        plan = plan_comparisons(2, "circular", 1)
        with pytest.raises(ValueError, match="Unsupported mask_policy"):
            mask_members("graph", 2, plan, [None, None])
        with pytest.raises(ValueError, match="1 outcomes for 2"):
            mask_members("pair", 2, plan, [None])

    @settings(max_examples=300, deadline=None)
    @given(st.integers(2, 9), st.integers(1, 2), st.data())
    def test_component_scores_one_connected_set(
        self, n: int, judges: int, data: st.DataObject
    ) -> None:
        """Component's scored set is connected by successful comparisons and no other
        component is larger; it never fails a group that pair scores."""
        # every graph the settings accept on n rollouts
        graph = data.draw(st.sampled_from(graph_choices(n)))
        plan = plan_comparisons(n, graph["comparison_strategy"], judges, "alternate", degree(graph))
        failing = data.draw(st.sets(st.sampled_from([(p.i, p.j, p.k) for p in plan])))
        errors = errors_for(plan, failing)
        comp = mask_members("component", n, plan, errors)
        pair = mask_members("pair", n, plan, errors)
        if isinstance(pair, Masking):
            assert isinstance(comp, Masking)
        if isinstance(comp, Masking):
            edges = [(p.i, p.j) for p, e in zip(plan, errors, strict=True) if e is None]
            inside = [(a, b) for a, b in edges if a in comp.scored and b in comp.scored]
            assert largest_component(n, inside) == comp.scored
            assert all(len(c) <= len(comp.scored) for c in components(n, edges))
            assert set(comp.reasons) == set(range(n)) - set(comp.scored)
            assert len(comp.scored) >= 2


# ----------------------------------------------------------------------------- cycles


class TestPreferenceCycles:
    def test_a_cycle_and_a_chain(self) -> None:
        cyclic = [jc(0, 1, 2.0), jc(1, 2, 2.0), jc(2, 0, 2.0)]  # 0>1, 1>2, 2>0
        assert preference_cycle_rate(cyclic, [0, 1, 2]) == 1.0
        chain = [jc(0, 1, 2.0), jc(1, 2, 2.0), jc(0, 2, 2.0)]
        assert preference_cycle_rate(chain, [0, 1, 2]) == 0.0
        reverse = [jc(1, 0, 2.0), jc(2, 1, 2.0), jc(0, 2, 2.0)]  # 1>0, 2>1, 0>2
        assert preference_cycle_rate(reverse, [0, 1, 2]) == 1.0

    def test_undecided_pairs_and_masked_members_do_not_count(self) -> None:
        # the pair (0, 2) is judged both ways and cancels: mean y = 0.5
        balanced = [jc(0, 1, 2.0), jc(1, 2, 2.0), jc(2, 0, 2.0), jc(0, 2, 2.0)]
        assert preference_cycle_rate(balanced, [0, 1, 2]) is None
        cyclic = [jc(0, 1, 2.0), jc(1, 2, 2.0), jc(2, 0, 2.0), jc(0, 3, 1.0), jc(3, 1, 1.0)]
        # with 3 scored: triangles 012 (cyclic), 013 (0>1, 0>3, 3>1: transitive)
        assert preference_cycle_rate(cyclic, [0, 1, 2, 3]) == 0.5
        assert preference_cycle_rate(cyclic, [0, 1, 3]) == 0.0
        assert preference_cycle_rate(cyclic, [0, 1]) is None

    def test_mean_over_passes_and_orientations(self) -> None:
        # (0,1): r=2 and, shown the other way, 7-5=2 → 0 preferred; (1,2): 4 then 1 → mean 2.5 → 1
        comparisons = [jc(0, 1, 2.0), jc(1, 0, 5.0), jc(1, 2, 4.0), jc(1, 2, 1.0), jc(2, 0, 1.0)]
        assert preference_cycle_rate(comparisons, [0, 1, 2]) == 1.0

    def test_circular_graphs_have_no_triangles(self) -> None:
        plan = plan_comparisons(6, "circular", 2)
        assert preference_cycle_rate([jc(p.i, p.j, 1.0, p.k) for p in plan], range(6)) is None  # type: ignore[arg-type]
        agg = aggregate([jc(p.i, p.j, 1.0, p.k) for p in plan], list(range(6)), {}, **NO_ADJ,
                        method="bradley_terry")  # fmt: skip
        assert CYCLE_RATE not in agg.method_metrics and BT_LOG_LIKELIHOOD in agg.method_metrics

    def test_three_member_circle_is_a_triangle(self) -> None:
        plan = plan_comparisons(3, "circular", 1)  # (0,1) (1,2) (2,0)
        comparisons = [jc(p.i, p.j, 1.0, p.k) for p in plan]  # each first one wins: a cycle
        agg = aggregate(comparisons, [0, 1, 2], {}, **NO_ADJ, method="bradley_terry")
        assert agg.method_metrics[CYCLE_RATE] == 1.0
        assert agg.base == {0: pytest.approx(3.0), 1: pytest.approx(3.0), 2: pytest.approx(3.0)}


# ----------------------------------------------------------------------------- one source


class TestVocabularies:
    def test_each_method_of_the_settings_vocabulary_has_its_own_scorer(self) -> None:
        # mypy --strict fails on `aggregator`'s match until a new method has its case; at run
        # time every method of the vocabulary maps to a scorer of its own
        methods = get_args(AggregatorMethod)
        assert len({aggregator(m) for m in methods}) == len(methods) == 2
        assert aggregator("simple_tiebreaker") is tiebreak_scores
        assert aggregator("bradley_terry") is bradley_terry_scores

    def test_pair_plans_check_against_the_settings_vocabularies(self) -> None:
        # a value outside the vocabulary is refused, and the error lists exactly the vocabulary
        strategies = sorted(get_args(ComparisonStrategy))
        with pytest.raises(ValueError, match=re.escape(f"Supported: {strategies}")):
            plan_comparisons(3, "bogus", 1)  # type: ignore[arg-type]
        balances = sorted(get_args(PositionBalance))
        with pytest.raises(ValueError, match=re.escape(f"Supported: {balances}")):
            plan_comparisons(3, "circular", 1, "bogus")  # type: ignore[arg-type]
        for strategy in get_args(ComparisonStrategy):
            for balance in get_args(PositionBalance):
                assert plan_comparisons(5, strategy, 1, balance)  # d = 4 fits N = 5

    def test_every_mask_policy_is_a_rule(self) -> None:
        plan = plan_comparisons(3, "circular", 1)
        for policy in get_args(MaskPolicy):
            assert mask_members(policy, 3, plan, [None] * 3) == Masking([0, 1, 2], {})

    def test_scoring_input_is_what_a_method_sees(self) -> None:
        given = ScoringInput([jc(0, 1, 1.0)], [0, 1], 3.0, 0.1)
        assert bradley_terry_scores(given).scores[0] > 3.0
