"""The calibration's pure part (genrm_trio/domain/calibration.py; docs/scoring.md, "Choosing a
schedule for your judge"): the input, the measurements, the judge fit, the simulated frontier and
the recommendation."""

from __future__ import annotations

import json
import math
import random

import pytest

from genrm_trio.domain.calibration import (
    CalibrationInputError,
    FrontierPoint,
    GroupJudgments,
    Schedule,
    ShownVerdict,
    consistency,
    first_win_share,
    fit_judge,
    group_from_compare_rows,
    kendall_tau_b,
    measure,
    parse_rollout_groups,
    recommend,
    schedules_for,
    simulate_frontier,
    simulated_groups_for,
)
from genrm_trio.domain.scoring import plan_comparisons
from genrm_trio.testing.judgment import JudgmentModel, judged_verdict


def _judged(model: JudgmentModel, groups: int, size: int, seed: int = 7) -> list[GroupJudgments]:
    """Every pair of ``groups`` groups in both orders, judged by the simulated judge's model."""
    rng = random.Random(seed)
    out = []
    for g in range(groups):
        quality = [rng.gauss(0, 1) for _ in range(size)]
        verdicts = []
        for planned in plan_comparisons(size, "all_pairs", 2, "alternate"):
            a, b = planned.shown
            key = f"{g}:{a}:{b}".encode()
            s1, s2, r = judged_verdict(model, seed, key, 0, quality[a], quality[b])
            verdicts.append(ShownVerdict(a, b, s1, s2, r))
        out.append(GroupJudgments(f"g{g}", size, tuple(verdicts)))
    return out


# --- input ---------------------------------------------------------------------------------------


def _verify_body(group: str, index: int, text: str) -> str:
    return json.dumps(
        {
            "responses_create_params": {"input": [{"role": "user", "content": "Q?"}]},
            "response": {
                "output": [{"type": "message", "content": [{"type": "output_text", "text": text}]}]
            },
            "_ng_group_id": group,
            "_ng_rollout_index": index,
        }
    )


def test_parse_both_shapes() -> None:
    lines = [
        json.dumps({"prompt": "Q?", "completions": ["a", "b", "c"]}),
        "",
        json.dumps(
            {
                "prompt": [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}],
                "completions": ["x", "y", "z"],
                "group_id": "mine",
            }
        ),
        _verify_body("v", 2, "third"),
        _verify_body("v", 0, "first"),
        _verify_body("v", 1, "second"),
    ]
    groups = parse_rollout_groups(lines, 3, "r.jsonl")
    assert [g.key for g in groups] == ["line 1", "mine", "v"]
    assert groups[0].history == ({"role": "user", "content": "Q?"},)
    assert groups[1].history == (
        {"role": "system", "content": "S"},
        {"role": "user", "content": "U"},
    )
    texts = [g.responses[0]["output"][0]["content"][0]["text"] for g in groups]
    assert texts == ["a", "x", "first"]
    assert [r["output"][0]["content"][0]["text"] for r in groups[2].responses] == [
        "first",
        "second",
        "third",
    ]


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        (
            ['{"prompt": "Q", "completions": ["a", "b"]}', '{"prompt": "Q", "completions": ["a"]}'],
            "r.jsonl:2: 1 completions; num_rollouts_per_prompt is 2",
        ),
        (
            [
                '{"prompt": "Q", "completions": ["a", "b"]}',
                "",
                '{"prompt": "Q", "completions": [',
            ],
            "r.jsonl:3: not JSON: ",
        ),
        (["[1, 2]"], "r.jsonl:1: expected a JSON object"),
        (['{"completions": ["a", "b"]}'], "r.jsonl:1: missing key 'prompt'"),
        (
            ['{"prompt": 3, "completions": ["a", "b"]}'],
            "r.jsonl:1: prompt must be a string or a list of messages",
        ),
        (
            ['{"prompt": "Q", "completions": ["a", 2]}'],
            "r.jsonl:1: completions must be a list of strings",
        ),
        (
            ['{"prompt": [{"role": "robot", "content": "x"}], "completions": ["a", "b"]}'],
            "r.jsonl:1: input[0] has unsupported role 'robot'",
        ),
        (['{"hello": 1}'], "r.jsonl:1: expected 'prompt' and 'completions', or a /verify body"),
        ([_verify_body("", 0, "a")], "r.jsonl:1: a /verify body needs its _ng_group_id"),
        (
            [_verify_body("v", 0, "a")],
            "r.jsonl:1: group 'v' has 1 /verify bodies; num_rollouts_per_prompt is 2",
        ),
        (
            [_verify_body("v", 0, "a"), _verify_body("v", 1, "b"), _verify_body("v", 1, "c")],
            "r.jsonl:3: group 'v' has more than num_rollouts_per_prompt (2) bodies",
        ),
        (
            ['{"prompt": "Q", "completions": ["a", "b"], "group_id": "x"}'] * 2,
            "r.jsonl: group 'x' appears more than once",
        ),
    ],
)
def test_bad_input_is_one_line_naming_the_line(lines: list[str], message: str) -> None:
    with pytest.raises(CalibrationInputError) as caught:
        parse_rollout_groups(lines, 2, "r.jsonl")
    text = str(caught.value)
    assert text.startswith(message), text
    assert "\n" not in text


# --- what was judged ----------------------------------------------------------------------------


def test_compare_rows_are_turned_back_to_what_was_shown() -> None:
    rows = [  # member orientation; (0, 1, 0) was shown 1 first under alternate (0 + 1 + 0 odd)
        {
            "response_i": 0,
            "response_j": 1,
            "judge_idx": 0,
            "score_1": 5,
            "score_2": 2,
            "ranking": 2,
        },
        {
            "response_i": 0,
            "response_j": 1,
            "judge_idx": 1,
            "score_1": 4,
            "score_2": 3,
            "ranking": 3,
        },
    ]
    group = group_from_compare_rows("g", 2, rows, "alternate")
    assert group.verdicts == (
        ShownVerdict(1, 0, 2.0, 5.0, 5.0),
        ShownVerdict(0, 1, 4.0, 3.0, 3.0),
    )
    assert group_from_compare_rows("g", 2, rows, "none").verdicts[0] == ShownVerdict(
        0, 1, 5.0, 2.0, 2.0
    )


def test_measure_counts_exactly() -> None:
    # three answers, each pair in both orders; the first shown wins 4 of 6 calls, one tie
    verdicts = (
        ShownVerdict(0, 1, 5, 1, 1),  # 0 wins shown first
        ShownVerdict(1, 0, 4, 2, 2),  # 1 wins shown first: the pair disagrees
        ShownVerdict(1, 2, 4, 2, 3),  # 1 wins
        ShownVerdict(2, 1, 2, 4, 5),  # 1 wins: agrees
        ShownVerdict(2, 0, 4, 3, 3),  # 2 wins
        ShownVerdict(0, 2, 3, 3, 3.5),  # tie: disagrees with a decided winner
    )
    m = measure([GroupJudgments("g", 3, verdicts)])
    assert m.calls == 6
    assert m.first_win_share == pytest.approx((4 + 0.5) / 6)
    assert m.first_win_excess == pytest.approx(4.5 / 6 - 0.5)
    assert m.mean_score_shift == pytest.approx((4 + 2 + 2 - 2 + 1 + 0) / 6)
    assert m.pairs_in_both_orders == 3
    assert m.order_consistency == pytest.approx(1 / 3)
    # mean preferences over both orders: 0 over 1 (2.5 − 1.5), 1 over 2 (0.5 + 1.5), 2 over 0
    # (−0.5 + 0): the one triangle is a cycle
    assert m.cycle_share == 1.0
    transitive = (
        ShownVerdict(0, 1, 4, 2, 2),
        ShownVerdict(1, 2, 4, 2, 2),
        ShownVerdict(0, 2, 4, 2, 2),
    )
    assert measure([GroupJudgments("t", 3, transitive)]).cycle_share == 0.0
    assert measure([GroupJudgments("t", 3, transitive)]).order_consistency is None


# --- the fit ------------------------------------------------------------------------------------


def test_closed_forms_match_monte_carlo() -> None:
    rng = random.Random(3)
    noise, bias = 1.2, 0.5
    firsts = agree = 0
    draws = 60_000
    for _ in range(draws):
        delta = rng.gauss(0, 1) - rng.gauss(0, 1)
        a_first = delta + bias + noise * rng.gauss(0, 1) > 0  # a shown first wins
        b_first = -delta + bias + noise * rng.gauss(0, 1) > 0  # b shown first wins
        firsts += a_first
        agree += a_first != b_first
    assert first_win_share(noise, bias) == pytest.approx(firsts / draws, abs=0.006)
    assert consistency(noise, bias) == pytest.approx(agree / draws, abs=0.006)
    assert consistency(1e-3, 0.0) == pytest.approx(1.0, abs=1e-3)
    assert first_win_share(2.0, 0.0) == 0.5


@pytest.mark.parametrize(("noise", "bias"), [(1.11, 0.57), (1.6, 0.3), (0.55, 0.28)])
def test_fit_recovers_a_comparative_judge(noise: float, bias: float) -> None:
    groups = _judged(JudgmentModel("comparative", noise=noise, bias=bias), 48, 16)
    fit = fit_judge(groups, measure(groups))
    assert fit.score_mode == "ranking"
    assert fit.noise == pytest.approx(noise, abs=0.12)
    assert fit.bias == pytest.approx(bias, abs=0.07)
    assert set(fit.first_rankings) == {1.0, 2.0, 3.0}
    assert set(fit.second_rankings) == {4.0, 5.0, 6.0}
    # the scores of each ranking are the comparative judge's 3 ± level
    assert (1.0, 5.0, 1.0) in fit.scores_of_ranking
    assert (4.0, 3.0, 3.0) in fit.scores_of_ranking


def test_fit_recovers_a_pointwise_judges_score_noise() -> None:
    model = JudgmentModel("pointwise", noise=0.75, bias=0.9, beta=1.57)
    groups = _judged(model, 48, 16)
    fit = fit_judge(groups, measure(groups))
    assert fit.score_mode == "pointwise"
    assert fit.score_noise == pytest.approx(0.75, abs=0.1)
    assert fit.score_values == (1.0, 2.0, 3.0, 4.0, 5.0)
    assert fit.bias > 0.3  # the ranking's first-position preference shows


def test_fit_needs_both_orders() -> None:
    one_order = [GroupJudgments("g", 2, (ShownVerdict(0, 1, 4, 2, 2),))]
    with pytest.raises(ValueError, match="both orders"):
        fit_judge(one_order, measure(one_order))


# --- schedules, the frontier and the recommendation ---------------------------------------------


def test_schedules_and_their_calls() -> None:
    sixteen = schedules_for(16)
    calls = {(s.strategy, s.judges, s.degree): s.calls(16) for s in sixteen}
    assert calls[("circular", 1, 2)] == 16
    assert calls[("circular", 2, 2)] == 32
    assert calls[("all_pairs", 1, 2)] == 120
    assert calls[("all_pairs", 2, 2)] == 240
    assert [d for s, _, d in calls if s == "regular"] == list(range(3, 15))
    assert all(calls[("regular", 1, d)] == 8 * d for d in range(3, 15))
    assert len(sixteen) == 2 * (2 + 12 + 2)
    four = {(s.strategy, s.judges) for s in schedules_for(4)}
    assert four == {("circular", 1), ("circular", 2), ("all_pairs", 1), ("all_pairs", 2)}
    odd = [s.degree for s in schedules_for(7) if s.strategy == "regular"]
    assert odd == [4, 4]  # N·d even: d = 3 and 5 do not exist for 7
    regular = Schedule("regular", 1, "bradley_terry", 6)
    assert regular.config_lines() == [
        "comparison_strategy: regular",
        "comparisons_per_rollout: 6",
        "num_judges_per_comparison: 1",
        "position_balance: alternate",
        "aggregator_method: bradley_terry",
    ]
    # comparisons_per_rollout is regular's key only
    assert Schedule("circular", 2, "simple_tiebreaker").config_lines() == [
        "comparison_strategy: circular",
        "num_judges_per_comparison: 2",
        "position_balance: alternate",
        "aggregator_method: simple_tiebreaker",
    ]


def _point(strategy: str, judges: int, degree: int, calls: int, tau: float) -> FrontierPoint:
    return FrontierPoint(Schedule(strategy, judges, "bradley_terry", degree), calls, tau, 0.01)  # type: ignore[arg-type]


def test_recommend_takes_the_cheapest_within_the_tolerance_of_the_best_at_all_pairs_budget() -> (
    None
):
    points = [
        _point("circular", 1, 2, 16, 0.50),
        _point("regular", 1, 6, 48, 0.71),
        _point("regular", 1, 8, 64, 0.745),
        _point("regular", 1, 10, 80, 0.76),
        _point("all_pairs", 1, 2, 120, 0.764),
        _point("all_pairs", 2, 2, 240, 0.86),  # beyond the budget: not the reference
    ]
    assert recommend(points, 16).calls_per_group == 64  # 0.745 >= 0.764 - 0.02
    assert recommend(points, 16, tolerance=0.005).calls_per_group == 80
    assert recommend(points, 16, tolerance=0.0).calls_per_group == 120
    tie = [*points, FrontierPoint(Schedule("regular", 1, "simple_tiebreaker", 8), 64, 0.75, 0.01)]
    assert recommend(tie, 16).tau == 0.75  # equally cheap: the higher τ


def test_simulated_groups_shrink_as_groups_grow() -> None:
    assert [simulated_groups_for(n) for n in (4, 16, 64, 256)] == [1600, 400, 100, 50]


def test_kendall_tau_b() -> None:
    assert kendall_tau_b([1, 2, 3], [10, 20, 30]) == 1.0
    assert kendall_tau_b([1, 2, 3], [30, 20, 10]) == -1.0
    assert kendall_tau_b([1, 1, 1], [1, 2, 3]) is None
    assert kendall_tau_b([1, 2, 2], [1, 2, 3]) == pytest.approx(2 / math.sqrt(2 * 3))


def test_simulated_frontier_is_seeded_and_more_calls_track_quality_better() -> None:
    groups = _judged(JudgmentModel("comparative", noise=1.11, bias=0.57), 16, 8)
    fit = fit_judge(groups, measure(groups))
    chosen = [
        Schedule("circular", 1, "simple_tiebreaker"),
        Schedule("all_pairs", 1, "simple_tiebreaker"),
        Schedule("all_pairs", 2, "simple_tiebreaker"),
    ]
    first = simulate_frontier(fit, 8, groups=60, seed=1, schedules=chosen)
    again = simulate_frontier(fit, 8, groups=60, seed=1, schedules=chosen)
    assert first == again
    assert [p.calls_per_group for p in first] == [8, 28, 56]
    taus = [p.tau for p in first]
    assert taus[0] < taus[1] < taus[2]
    assert all(0.0 < p.tau_se < 0.05 for p in first)
    other = simulate_frontier(fit, 8, groups=60, seed=2, schedules=chosen)
    assert other != first
