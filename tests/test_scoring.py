"""genrm_trio.domain.scoring: pair plans, tie-breaks, adjustments, style control, metrics.

Covers docs/scoring.md sections 1-5 (pairs, style control, aggregation, masking, metrics), D1,
D7, D32.
"""

from __future__ import annotations

import functools
import hashlib
import math
import operator
from typing import NamedTuple, get_args

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from judges import NO_ADJ

from genrm_trio.config import ComparisonStrategy
from genrm_trio.domain.scoring import (
    Aggregation,
    ComparisonStats,
    JudgedComparison,
    MemberTexts,
    PlannedComparison,
    Triple,
    aggregate,
    comparison_pairs,
    count_style_elements,
    density_weights,
    flip,
    group_metrics,
    percentile,
    plan_comparisons,
    plan_fixed_baseline,
    position_disagreement_rate,
    strip_code_blocks,
    style_density,
)


def cfg(**overrides: float) -> dict[str, float]:
    return {**NO_ADJ, **overrides}


def jc(i: int, j: int, scores: Triple, k: int = 0) -> JudgedComparison:
    return JudgedComparison(i, j, k, scores)


def texts(reasoning: list[int], answer: list[int], density: list[float] | None = None) -> dict:
    dens = density if density is not None else [0.0] * len(reasoning)
    return {
        m: MemberTexts(reasoning_len=r, answer_len=a, style_density=d)
        for m, (r, a, d) in enumerate(zip(reasoning, answer, dens, strict=True))
    }


def equal_scores(n: int, value: float = 3.0) -> list[JudgedComparison]:
    """Tie-free comparisons giving every member of 0..n-1 the base score `value`."""
    return [jc(i, (i + 1) % n, (value, value, 3.5)) for i in range(n)]


def ordered(result: dict[int, float]) -> list[float]:
    return [result[m] for m in sorted(result)]


# ----------------------------------------------------------------------------- pairs


class TestComparisonPairs:
    def test_circular_3(self) -> None:
        assert comparison_pairs(3, "circular") == [(0, 1), (1, 2), (2, 0)]

    def test_circular_4(self) -> None:
        assert comparison_pairs(4, "circular") == [(0, 1), (1, 2), (2, 3), (3, 0)]

    def test_circular_2_is_both_orders(self) -> None:
        assert comparison_pairs(2, "circular") == [(0, 1), (1, 0)]

    def test_all_pairs_3(self) -> None:
        assert comparison_pairs(3, "all_pairs") == [(0, 1), (0, 2), (1, 2)]

    def test_all_pairs_4_lexicographic(self) -> None:
        assert comparison_pairs(4, "all_pairs") == [
            (0, 1),
            (0, 2),
            (0, 3),
            (1, 2),
            (1, 3),
            (2, 3),
        ]

    def test_unsupported_strategy_raises(self) -> None:
        with pytest.raises(ValueError, match="Unsupported comparison_strategy"):
            comparison_pairs(3, "round_robin")

    @pytest.mark.parametrize("strategy", get_args(ComparisonStrategy))
    @pytest.mark.parametrize("n", [1, 0, -1])
    def test_less_than_2_raises(self, strategy: str, n: int) -> None:
        with pytest.raises(ValueError, match="at least 2"):
            comparison_pairs(n, strategy)

    @given(st.integers(2, 40))
    def test_circular_each_member_once_per_side(self, n: int) -> None:
        pairs = comparison_pairs(n, "circular")
        assert len(pairs) == n
        assert sorted(i for i, _ in pairs) == list(range(n))
        assert sorted(j for _, j in pairs) == list(range(n))

    @given(st.integers(2, 30))
    def test_all_pairs_count_and_lower_first(self, n: int) -> None:
        pairs = comparison_pairs(n, "all_pairs")
        assert len(pairs) == n * (n - 1) // 2
        assert all(i < j for i, j in pairs)
        assert pairs == sorted(pairs)


class TestPlanComparisons:
    def test_judge_major_without_balance(self) -> None:
        plan = plan_comparisons(3, "circular", 2, "none")
        assert [(p.i, p.j, p.k) for p in plan] == [
            (0, 1, 0),
            (1, 2, 0),
            (2, 0, 0),
            (0, 1, 1),
            (1, 2, 1),
            (2, 0, 1),
        ]
        assert not any(p.swapped for p in plan)

    def test_alternate_swaps_iff_i_plus_j_plus_k_odd(self) -> None:
        plan = plan_comparisons(4, "all_pairs", 2, "alternate")
        assert len(plan) == 12
        for p in plan:
            assert p.swapped == ((p.i + p.j + p.k) % 2 == 1)
        # every pair is shown in both orientations over the two passes
        for i, j in comparison_pairs(4, "all_pairs"):
            assert {p.shown for p in plan if p.pair == (i, j)} == {(i, j), (j, i)}

    def test_alternate_circular_odd_n(self) -> None:
        plan = plan_comparisons(3, "circular", 1, "alternate")
        assert [(p.pair, p.swapped) for p in plan] == [
            ((0, 1), True),
            ((1, 2), True),
            ((2, 0), False),
        ]

    def test_alternate_circular_even_n_single_pass_flips_everything(self) -> None:
        # expected under circular with even N and J = 1 (docs/scoring.md)
        assert all(p.swapped for p in plan_comparisons(6, "circular", 1, "alternate"))

    def test_pair_and_shown(self) -> None:
        p = PlannedComparison(2, 5, 1, swapped=True)
        assert p.pair == (2, 5)
        assert p.shown == (5, 2)
        assert PlannedComparison(2, 5, 1, swapped=False).shown == (2, 5)

    def test_invalid_arguments(self) -> None:
        with pytest.raises(ValueError, match="num_judges"):
            plan_comparisons(3, "circular", 0, "none")
        with pytest.raises(ValueError, match="position_balance"):
            plan_comparisons(3, "circular", 1, "random")
        with pytest.raises(ValueError, match="comparison_strategy"):
            plan_comparisons(3, "swiss", 1, "none")


class TestFlip:
    def test_flip_values(self) -> None:
        assert flip((4.0, 2.0, 1.0)) == (2.0, 4.0, 6.0)
        assert flip((3.0, 3.0, 3.5)) == (3.0, 3.0, 3.5)

    @given(
        st.floats(1, 5, allow_nan=False),
        st.floats(1, 5, allow_nan=False),
        st.sampled_from([1.0, 1.5, 2.0, 3.0, 3.5, 4.0, 5.0, 6.0]),
    )
    def test_flip_is_an_involution(self, s1: float, s2: float, r: float) -> None:
        assert flip(flip((s1, s2, r))) == (s1, s2, r)

    def test_flip_keeps_named_tuple_type(self) -> None:
        class V(NamedTuple):
            score_1: float
            score_2: float
            ranking: float

        out = flip(V(5.0, 1.0, 2.0))
        assert isinstance(out, V)
        assert out == V(1.0, 5.0, 5.0)

    def test_to_member_orientation(self) -> None:
        raw = (2.0, 4.0, 5.0)  # judge saw j first and preferred the second shown (i)
        assert PlannedComparison(0, 1, 0, swapped=True).to_member_orientation(raw) == (
            4.0,
            2.0,
            2.0,
        )
        assert PlannedComparison(0, 1, 0, swapped=False).to_member_orientation(raw) == raw


class TestFixedBaselinePlan:
    @staticmethod
    def member_first(key: str, m: int, k: int) -> bool:
        order = int(hashlib.sha256(f"{key}:{m}".encode()).hexdigest(), 16)
        return (order + k) % 2 == 0

    def test_orientation_and_metadata_order(self) -> None:
        key = "group_id::g::group_attempt::0:abc"
        plan = plan_fixed_baseline(3, 2, key)
        assert [(p.i, p.j, p.k) for p in plan] == [
            (0, 3, 0),
            (1, 3, 0),
            (2, 3, 0),
            (0, 3, 1),
            (1, 3, 1),
            (2, 3, 1),
        ]
        for p in plan:
            assert p.swapped == (not self.member_first(key, p.i, p.k))
            assert p.pair == (p.i, 3)

    def test_orientation_alternates_per_pass(self) -> None:
        plan = plan_fixed_baseline(5, 4, "key")
        for m in range(5):
            sides = [p.swapped for p in plan if p.i == m]
            assert sides == [sides[0], not sides[0], sides[0], not sides[0]]

    def test_known_parities(self) -> None:
        # int(sha256("key:m"), 16) % 2 for m = 0..5 is [0, 0, 0, 1, 1, 0]
        plan = plan_fixed_baseline(6, 1, "key")
        assert [p.swapped for p in plan] == [False, False, False, True, True, False]

    def test_key_changes_positions(self) -> None:
        a = [p.swapped for p in plan_fixed_baseline(16, 1, "key::group_attempt::0")]
        b = [p.swapped for p in plan_fixed_baseline(16, 1, "key::group_attempt::1")]
        assert a != b

    def test_singleton_runs(self) -> None:
        plan = plan_fixed_baseline(1, 2, "k")
        assert [(p.i, p.j, p.k) for p in plan] == [(0, 1, 0), (0, 1, 1)]

    def test_invalid(self) -> None:
        with pytest.raises(ValueError):
            plan_fixed_baseline(0, 1, "k")
        with pytest.raises(ValueError):
            plan_fixed_baseline(2, 0, "k")

    def test_lone_surrogate_key_is_deterministic(self) -> None:
        key = "group_id::\ud800::group_attempt::0"
        plan = plan_fixed_baseline(4, 2, key)
        assert plan == plan_fixed_baseline(4, 2, key)
        assert [p.swapped for p in plan[4:]] == [not p.swapped for p in plan[:4]]

    def test_baseline_first_verdict_is_flipped_back_and_aggregated(self) -> None:
        # member 0 is shown second at pass 0 here and first at pass 1
        key = next(k for k in (f"k{x}" for x in range(100)) if not self.member_first(k, 0, 0))
        plan = plan_fixed_baseline(1, 2, key)
        assert [p.swapped for p in plan] == [True, False]
        # both passes: the member beats the baseline 4 to 2
        raw = [(2.0, 4.0, 5.0), (4.0, 2.0, 2.0)]
        judged = [
            JudgedComparison(p.i, p.j, p.k, p.to_member_orientation(v))
            for p, v in zip(plan, raw, strict=True)
        ]
        assert [c.scores for c in judged] == [(4.0, 2.0, 2.0), (4.0, 2.0, 2.0)]
        agg = aggregate(judged, [0], texts([5], [5]), **cfg(answer_bonus=1.0))
        assert agg.final == {0: 4.0}  # one member: no adjustment; baseline not reported
        assert agg.adjustments == {0: 0.0}


# ----------------------------------------------------------------------------- style

STYLE_FIXTURE = (
    "# Title\n"
    "## Section\n"
    "1. first\n"
    "2. second\n"
    "- alpha\n"
    "* beta\n"
    "Some **bold** and __strong__ text 🎉✨\n"
)


class TestStyleControl:
    def test_count_style_elements_counts_supported_types(self) -> None:
        counts = count_style_elements(STYLE_FIXTURE)
        assert counts == {
            "headers": 2,
            "ordered_lists": 2,
            "unordered_lists": 2,
            "bold": 2,
            "emoji": 2,
        }
        assert counts["ordered_lists"] + counts["unordered_lists"] == 4

    def test_count_style_elements_excludes_code_blocks(self) -> None:
        text = (
            "Intro **kept**\n"
            "```markdown\n# not a header\n- not a list\n1. nope\n**nope** 🎉\n```\n"
            "after ```inline # x``` end\n"
        )
        assert count_style_elements(text) == {
            "headers": 0,
            "ordered_lists": 0,
            "unordered_lists": 0,
            "bold": 1,
            "emoji": 0,
        }
        assert "not a header" not in strip_code_blocks(text)

    def test_unclosed_fence_is_not_code(self) -> None:
        assert count_style_elements("```\n# still a header")["headers"] == 1

    def test_count_style_elements_ignores_non_matching_edge_cases(self) -> None:
        text = "#######\n####### Seven\nsome # inline\n1.x\n-x\n**unclosed\nbold** end"
        assert sum(count_style_elements(text).values()) == 0

    def test_indented_lists_and_all_header_levels(self) -> None:
        text = "\n".join(f"{'#' * n} h{n}" for n in range(1, 7)) + "\n  10. item\n\t+ item\n"
        counts = count_style_elements(text)
        assert counts["headers"] == 6
        assert counts["ordered_lists"] == 1
        assert counts["unordered_lists"] == 1

    def test_bold_forms(self) -> None:
        assert count_style_elements("**a** __b__\n**c\nd**\n__e_f__\n****")["bold"] == 2
        # spans are found left to right: a closing "**" after a broken span opens a new one
        assert count_style_elements("**c\nd** x **")["bold"] == 1

    def test_emoji_extended_pictographic(self) -> None:
        assert count_style_elements("©®™‼")["emoji"] == 4
        assert count_style_elements("〰〽")["emoji"] == 2
        assert count_style_elements("↔➡⬅↩")["emoji"] == 4
        assert count_style_elements("←↑→↓ #*0 abc")["emoji"] == 0
        # per code point: a ZWJ family is three pictographs (the joiners are not)
        assert count_style_elements("\U0001f468\u200d\U0001f469\u200d\U0001f467")["emoji"] == 3

    def test_cjk_hangul_kana_count_zero(self) -> None:
        # the reference's U+24C2–U+1F251 range counted every one of these (D1)
        for text in ("这是一个中文答案", "한국어 답변입니다", "これは日本語の答えです", "カタカナ"):
            assert count_style_elements(text)["emoji"] == 0
            assert style_density(text) == 0.0

    @given(
        st.text(
            alphabet=st.one_of(
                st.characters(min_codepoint=0x4E00, max_codepoint=0x9FFF),  # CJK
                st.characters(min_codepoint=0xAC00, max_codepoint=0xD7A3),  # Hangul
                st.characters(min_codepoint=0x3040, max_codepoint=0x30FF),  # kana
                # CJK punctuation (U+3030 and U+303D are real emoji, so stop before them)
                st.characters(min_codepoint=0x3000, max_codepoint=0x302F),
                st.sampled_from(" \n，。！？"),
            ),
            max_size=200,
        )
    )
    def test_property_cjk_without_emoji_counts_zero(self, text: str) -> None:
        assert count_style_elements(text)["emoji"] == 0

    @pytest.mark.parametrize("text", ["", "   \n ", "```python\nprint(1)\n```", " ```x``` "])
    def test_compute_style_density_empty_or_code_only(self, text: str) -> None:
        assert style_density(text) == 0.0

    def test_compute_style_density_normal_text(self) -> None:
        text = "# Title\nPlain answer"
        assert style_density(text) == 1 / len(text)

    def test_density_denominator_is_stripped_code_free_text(self) -> None:
        text = "\n# Head\n```\nlots of code here\n```\n  "
        assert style_density(text) == 1 / len("# Head")

    def test_compute_style_density_weights_uniform(self) -> None:
        assert density_weights([0.2, 0.2, 0.2]) == [0.0, 0.0, 0.0]
        assert density_weights([]) == []

    def test_compute_style_density_weights_spread(self) -> None:
        assert density_weights([0.0, 0.5, 1.0]) == [0.5, 0.0, -0.5]

    def test_length_weights_worked_example(self) -> None:
        assert density_weights([10, 20, 30, 40]) == pytest.approx(
            [0.5, 1 / 6, -1 / 6, -0.5], abs=1e-12
        )
        assert round(density_weights([10, 20, 30, 40])[1], 4) == 0.1667

    def test_apply_style_penalties_coeff_zero_returns_zero_adjustments(self) -> None:
        agg = aggregate(equal_scores(2), [0, 1], texts([1, 1], [1, 1], [0.0, 0.5]), **cfg())
        assert agg.final == {0: 3.0, 1: 3.0}
        assert agg.adjustments == {0: 0.0, 1: 0.0}

    def test_apply_style_penalties_single_response_returns_zero_adjustments(self) -> None:
        agg = aggregate(
            [jc(0, 1, (3.0, 3.0, 3.5))],
            [0],
            texts([1, 1], [1, 1], [0.9, 0.0]),
            **cfg(group_style_penalty_coeff=1.0),
        )
        assert agg.final == {0: 3.0}
        assert agg.adjustments == {0: 0.0}

    def test_apply_style_penalties_rewards_lower_density(self) -> None:
        agg = aggregate(
            equal_scores(2),
            [0, 1],
            texts([1, 1], [1, 1], [0.0, 0.3]),
            **cfg(group_style_penalty_coeff=1.0),
        )
        assert ordered(agg.final) == [3.5, 2.5]

    def test_style_penalty_integration(self) -> None:
        plain = "plain answer"
        styled = "# Title\n- item\n**bold**"
        tx = {
            0: MemberTexts.from_texts("", plain),
            1: MemberTexts.from_texts("", styled),
        }
        assert tx[0].style_density == 0.0
        assert tx[1].style_density == 3 / len(styled)
        agg = aggregate(
            [jc(0, 1, (3.0, 3.0, 3.5))], [0, 1], tx, **cfg(group_style_penalty_coeff=1.0)
        )
        assert ordered(agg.final) == [3.5, 2.5]
        assert ordered(agg.base) == [3.0, 3.0]
        assert ordered(agg.adjustments) == [0.5, -0.5]

    def test_member_texts_from_texts_strips(self) -> None:
        t = MemberTexts.from_texts("  think \n", "\n answer  ")
        assert (t.reasoning_len, t.answer_len) == (5, 6)


# ----------------------------------------------------------------------------- aggregation


class TestAggregateScores:
    def test_simple_aggregation_no_ties(self) -> None:
        agg = aggregate([jc(0, 1, (4.0, 2.0, 1.0))], [0, 1], {}, **cfg())
        assert ordered(agg.final) == [4.0, 2.0]
        assert agg.metrics == {
            "mean_individual_score": 3.0,
            "std_individual_score": 1.0,
            "tiebreak_usage_rate": 0.0,
        }

    def test_tiebreaker_applied(self) -> None:
        agg = aggregate([jc(0, 1, (3.0, 3.0, 2.0))], [0, 1], {}, **cfg())
        assert ordered(agg.final) == [4.5, 1.5]
        assert agg.metrics["tiebreak_usage_rate"] == 1.0
        # metrics see the pre-tie-break scores
        assert agg.metrics["mean_individual_score"] == 3.0
        assert agg.metrics["std_individual_score"] == 0.0

    def test_tiebreak_uses_constant_midpoint(self) -> None:
        assert ordered(aggregate([jc(0, 1, (3.0, 3.0, 3.5))], [0, 1], {}, **cfg()).final) == [
            3.0,
            3.0,
        ]
        assert ordered(aggregate([jc(0, 1, (3.0, 3.0, 6.0))], [0, 1], {}, **cfg()).final) == [
            0.5,
            5.5,
        ]

    def test_tiebreak_only_on_exact_equality(self) -> None:
        agg = aggregate([jc(0, 1, (3.0, 3.0000000001, 1.0))], [0, 1], {}, **cfg())
        assert agg.final[0] == 3.0
        assert agg.metrics["tiebreak_usage_rate"] == 0.0

    def test_circular_strategy_integration(self) -> None:
        comps = [
            jc(0, 1, (4.0, 2.0, 1.0)),
            jc(1, 2, (3.0, 5.0, 5.0)),
            jc(2, 0, (3.0, 4.0, 4.0)),
        ]
        agg = aggregate(comps, [0, 1, 2], {}, **cfg())
        assert ordered(agg.final) == [4.0, 2.5, 4.0]
        assert agg.base == agg.final
        assert agg.metrics["tiebreak_usage_rate"] == 0.0
        assert agg.metrics["mean_individual_score"] == pytest.approx(21 / 6)

    def test_multiple_judges_average(self) -> None:
        comps = [jc(0, 1, (5.0, 1.0, 1.0), k=0), jc(0, 1, (3.0, 3.0, 4.0), k=1)]
        agg = aggregate(comps, [0, 1], {}, **cfg())
        assert agg.final == {0: (5.0 + 2.5) / 2, 1: (1.0 + 3.5) / 2}
        assert agg.metrics["tiebreak_usage_rate"] == 0.5

    def test_default_score_without_comparisons(self) -> None:
        agg = aggregate([], [0, 1], {}, **cfg(default_score=2.75))
        assert agg.final == {0: 2.75, 1: 2.75}
        assert agg.metrics == {}

    def test_population_is_reported_in_index_order(self) -> None:
        agg = aggregate([jc(0, 2, (4.0, 2.0, 1.0))], [2, 0], {}, **cfg())
        assert list(agg.final) == [0, 2]

    def test_duplicate_population_member_rejected(self) -> None:
        with pytest.raises(ValueError, match="twice"):
            aggregate([], [0, 0], {}, **cfg())

    @pytest.mark.parametrize("p", [0.0, -0.1, 1.5, math.nan])
    def test_top_percentile_validated(self, p: float) -> None:
        with pytest.raises(ValueError, match="top_percentile"):
            aggregate([], [0, 1], {}, **cfg(top_percentile=p))

    def test_missing_texts_rejected_when_a_pass_runs(self) -> None:
        with pytest.raises(ValueError, match="MemberTexts"):
            aggregate(equal_scores(2), [0, 1], {0: MemberTexts(1, 1, 0.0)}, **cfg(answer_bonus=1))
        # no pass → texts not needed
        assert aggregate(equal_scores(2), [0, 1], {}, **cfg()).final == {0: 3.0, 1: 3.0}

    def test_huge_finite_scores_give_inf_not_overflow_error(self) -> None:
        # validate_verdict_range: false lets 1e308 through; fsum would raise OverflowError
        # ("intermediate overflow in fsum") before the engine's non-finite check.
        comps = [jc(0, 1, (1e308, 1e308, 1.0)), jc(1, 0, (1e308, 1e308, 1.0))]
        agg = aggregate(comps, [0, 1], {}, **cfg())
        assert agg.final == {0: math.inf, 1: math.inf}
        assert agg.metrics["mean_individual_score"] == math.inf
        assert agg.metrics["std_individual_score"] == math.inf
        assert agg.metrics["tiebreak_usage_rate"] == 1.0

    def test_huge_scores_of_both_signs_do_not_raise(self) -> None:
        comps = [jc(0, 1, (1e308, -1e308, 1.0)), jc(1, 0, (1e308, -1e308, 6.0))]
        agg = aggregate(comps, [0, 1], {}, **cfg())
        assert agg.final == {0: 0.0, 1: 0.0}
        assert agg.metrics["mean_individual_score"] == 0.0
        assert agg.metrics["std_individual_score"] == math.inf  # the squares overflow

    def test_fsum_precision_kept_when_nothing_overflows(self) -> None:
        # fsum's exact result, not plain summation's (which loses a 1.0 here)
        comps = [jc(0, 1, (1e16, 1.0, 1.0)), jc(2, 3, (-1e16, 1.0, 1.0))]
        agg = aggregate(comps, range(4), {}, **cfg())
        assert agg.metrics["mean_individual_score"] == 0.5
        # left-to-right addition (Python 3.12's sum() is compensated, so not sum() itself)
        assert functools.reduce(operator.add, [1e16, 1.0, -1e16, 1.0]) / 4 == 0.25


class TestLengthAdjustments:
    def test_group_answer_length_penalty_worked_example(self) -> None:
        agg = aggregate(
            equal_scores(4),
            range(4),
            texts([0, 0, 0, 0], [10, 20, 30, 40]),
            **cfg(group_answer_length_penalty_coeff=1.0),
        )
        assert ordered(agg.adjustments) == pytest.approx([0.5, 1 / 6, -1 / 6, -0.5], abs=1e-12)
        assert ordered(agg.final) == pytest.approx([3.5, 3 + 1 / 6, 3 - 1 / 6, 2.5], abs=1e-12)
        assert ordered(agg.base) == [3.0] * 4

    def test_reasoning_and_answer_coefficients_combine(self) -> None:
        agg = aggregate(
            equal_scores(2),
            [0, 1],
            texts([10, 20], [40, 30]),
            **cfg(
                group_reasoning_length_penalty_coeff=0.3,
                group_answer_length_penalty_coeff=0.1,
            ),
        )
        assert ordered(agg.adjustments) == pytest.approx([0.15 - 0.05, -0.15 + 0.05])

    def test_empty_reasoning_counts_as_shortest_in_penalty(self) -> None:
        agg = aggregate(
            equal_scores(2),
            [0, 1],
            texts([0, 10], [5, 5]),
            **cfg(group_reasoning_length_penalty_coeff=1.0),
        )
        assert ordered(agg.adjustments) == [0.5, -0.5]

    def test_no_length_pass_when_all_keys_zero(self) -> None:
        agg = aggregate(equal_scores(3), range(3), texts([1, 50, 900], [3, 70, 1000]), **cfg())
        assert ordered(agg.adjustments) == [0.0, 0.0, 0.0]

    def test_top_percentile_n16_p02_third_best_gets_bonus(self) -> None:
        # t_idx = max(0, int(16 * 0.2) - 1) = 2 → 3rd best
        scores = [float(s) for s in range(16, 0, -1)]  # member m has base 16 - m
        comps = [jc(m, 16, (scores[m], 1.0, 1.0)) for m in range(16)]
        pop = list(range(16))

        def bonus_to(shortest: int) -> dict[int, float]:
            lens = [100] * 16
            lens[shortest] = 10
            agg = aggregate(comps, pop, texts(lens, lens), **cfg(answer_bonus=0.25))
            return {m: a for m, a in agg.adjustments.items() if a}

        assert bonus_to(2) == {2: 0.25}  # 3rd best: in the band
        assert bonus_to(3) == {}  # 4th best: out
        assert bonus_to(0) == {0: 0.25}

    def test_top_percentile_n2_best_only(self) -> None:
        comps = [jc(0, 1, (4.0, 2.0, 1.0))]
        short_second = aggregate(comps, [0, 1], texts([9, 9], [9, 3]), **cfg(answer_bonus=1.0))
        assert ordered(short_second.adjustments) == [0.0, 0.0]
        short_first = aggregate(comps, [0, 1], texts([9, 9], [3, 9]), **cfg(answer_bonus=1.0))
        assert ordered(short_first.final) == [5.0, 2.0]

    def test_bonus_goes_to_globally_shortest_only(self) -> None:
        # member 2 is shortest but out of the band; member 1 (in band, next shortest) gets nothing
        comps = [jc(0, 1, (5.0, 4.0, 2.0)), jc(2, 3, (1.0, 1.0, 3.5))]
        agg = aggregate(comps, range(4), texts([9] * 4, [50, 20, 10, 60]), **cfg(answer_bonus=1.0))
        assert ordered(agg.adjustments) == [0.0, 0.0, 0.0, 0.0]

    def test_shortest_ignores_empty_and_first_wins_ties(self) -> None:
        agg = aggregate(
            equal_scores(4), range(4), texts([0, 5, 5, 9], [1, 1, 1, 1]), **cfg(reasoning_bonus=1)
        )
        assert ordered(agg.adjustments) == [0.0, 1.0, 0.0, 0.0]

    def test_no_nonempty_reasoning_no_bonus(self) -> None:
        agg = aggregate(
            equal_scores(3), range(3), texts([0, 0, 0], [1, 2, 3]), **cfg(reasoning_bonus=1)
        )
        assert ordered(agg.adjustments) == [0.0, 0.0, 0.0]

    def test_both_bonuses_stack(self) -> None:
        agg = aggregate(
            equal_scores(3),
            range(3),
            texts([4, 8, 9], [2, 8, 9]),
            **cfg(reasoning_bonus=0.5, answer_bonus=0.25),
        )
        assert ordered(agg.adjustments) == [0.75, 0.0, 0.0]
        assert ordered(agg.final) == [3.75, 3.0, 3.0]

    def test_threshold_computed_once_before_bonuses(self) -> None:
        # n=4, p=0.5 → t_idx 1, threshold = 3.0 (members 1 and 2 tie at 3.0).
        # The reasoning bonus lifts member 1 to 5.0; a recomputed threshold (4.0) would then
        # exclude member 2 from the answer bonus. It must not.
        comps = [
            jc(0, 4, (4.0, 1.0, 1.0)),
            jc(1, 4, (3.0, 1.0, 1.0)),
            jc(2, 4, (3.0, 1.0, 1.0)),
            jc(3, 4, (1.0, 1.0, 3.5)),
        ]
        agg = aggregate(
            comps,
            range(4),
            texts([9, 1, 9, 9], [9, 9, 1, 9]),
            **cfg(top_percentile=0.5, reasoning_bonus=2.0, answer_bonus=0.5),
        )
        assert ordered(agg.adjustments) == [0.0, 2.0, 0.5, 0.0]
        assert 4 not in agg.final

    def test_bonuses_then_penalties_then_style_accumulate(self) -> None:
        agg = aggregate(
            equal_scores(2),
            [0, 1],
            texts([10, 20], [10, 20], [0.0, 0.1]),
            **cfg(
                top_percentile=1.0,
                answer_bonus=1.0,
                group_answer_length_penalty_coeff=0.2,
                group_style_penalty_coeff=0.4,
            ),
        )
        assert ordered(agg.adjustments) == pytest.approx([1.0 + 0.1 + 0.2, -0.1 - 0.2])
        for m in (0, 1):
            assert agg.final[m] == pytest.approx(agg.base[m] + agg.adjustments[m])


# ----------------------------------------------------------------------------- masking


MASK_LENGTHS = [1000, 1, 10, 20]  # masked members 0 and 1 are extreme


class TestMaskedSubset:
    def circular_without(self, n: int, failed: set[tuple[int, int]]) -> list[JudgedComparison]:
        out = []
        for i, j in comparison_pairs(n, "circular"):
            if (i, j) not in failed:
                out.append(jc(i, j, (4.0 if i % 2 else 2.0, 3.0, 3.0)))
        return out

    def test_n4_one_failure_adjusts_over_scored_members_only(self) -> None:
        comps = self.circular_without(4, {(0, 1)})
        agg = aggregate(
            comps,
            [2, 3],
            texts(MASK_LENGTHS, MASK_LENGTHS),
            **cfg(group_answer_length_penalty_coeff=1.0),
        )
        assert set(agg.final) == {2, 3}
        # member 2: (1,2) as response_2 → 3.0, (2,3) as response_1 → 2.0
        # member 3: (2,3) as response_2 → 3.0, (3,0) as response_1 → 4.0
        assert agg.base == {2: 2.5, 3: 3.5}
        # weights over lengths {10, 20} only: the masked 1 and 1000 do not stretch the span
        assert agg.adjustments == {2: 0.5, 3: -0.5}
        # and the masked members' texts do not matter at all
        other = dict(texts(MASK_LENGTHS, MASK_LENGTHS))
        other[0] = MemberTexts(5, 5, 0.9)
        other[1] = MemberTexts(50_000, 50_000, 0.0)
        again = aggregate(comps, [2, 3], other, **cfg(group_answer_length_penalty_coeff=1.0))
        assert again == agg

    def test_n4_two_failures_single_scored_member_gets_zero_weights(self) -> None:
        comps = self.circular_without(4, {(0, 1), (1, 2)})
        agg = aggregate(
            comps,
            [3],
            texts(MASK_LENGTHS, MASK_LENGTHS, [0.0, 0.9, 0.1, 0.5]),
            **cfg(
                answer_bonus=1.0,
                group_answer_length_penalty_coeff=1.0,
                group_style_penalty_coeff=1.0,
            ),
        )
        assert agg.base == {3: 3.5}
        assert agg.adjustments == {3: 0.0}
        assert agg.final == {3: 3.5}

    def test_all_pairs_scored_members_average_three_comparisons(self) -> None:
        comps = [
            jc(i, j, (float(i + 1), float(j + 1), 3.0))
            for i, j in comparison_pairs(4, "all_pairs")
            if (i, j) != (0, 1)
        ]
        agg = aggregate(comps, [2, 3], {}, **cfg())
        # every comparison gives each member its own index + 1
        assert agg.base == {2: 3.0, 3: 4.0}

    def test_neighbours_of_masked_members_keep_both_comparisons(self) -> None:
        # 16 circular, (5, 6) fails. Position-dependent judge: response_1 always 5, response_2
        # always 1, so a member scored from one comparison only would get 5 or 1.
        comps = [
            jc(i, j, (5.0, 1.0, 1.0))
            for i, j in comparison_pairs(16, "circular")
            if (i, j) != (5, 6)
        ]
        scored = [m for m in range(16) if m not in (5, 6)]
        agg = aggregate(comps, scored, {}, **cfg())
        assert set(agg.final) == set(scored)
        assert all(v == 3.0 for v in agg.final.values())

    def test_comparisons_with_outside_members_count(self) -> None:
        # member 0 compared with a masked member 1 and the (never reported) index 2
        comps = [jc(0, 1, (5.0, 1.0, 1.0)), jc(2, 0, (4.0, 2.0, 2.0))]
        agg = aggregate(comps, [0], {}, **cfg())
        assert agg.final == {0: 3.5}


# ----------------------------------------------------------------------------- properties


@st.composite
def scenarios(draw: st.DrawFn) -> tuple:
    n = draw(st.integers(2, 7))
    pairs = [(i, j) for i in range(n) for j in range(n) if i != j]
    score = st.sampled_from([1.0, 2.0, 3.0, 3.5, 4.0, 5.0])
    rank = st.sampled_from([1.0, 2.0, 3.0, 3.5, 4.0, 5.0, 6.0])
    comps = draw(
        st.lists(
            st.builds(
                lambda p, s1, s2, r, k: jc(p[0], p[1], (s1, s2, r), k),
                st.sampled_from(pairs),
                score,
                score,
                rank,
                st.integers(0, 2),
            ),
            max_size=20,
        )
    )
    population = sorted(draw(st.sets(st.integers(0, n - 1))))
    # unique lengths so "first on ties" never depends on labels
    r_lens = draw(st.lists(st.integers(0, 5000), min_size=n, max_size=n, unique=True))
    a_lens = draw(st.lists(st.integers(0, 5000), min_size=n, max_size=n, unique=True))
    dens = draw(st.lists(st.floats(0, 1), min_size=n, max_size=n))
    tx = texts(r_lens, a_lens, dens)
    coeff = st.sampled_from([0.0, 0.05, 0.3, 1.0])
    kwargs = {
        "default_score": draw(st.sampled_from([3.0, 0.0])),
        "reasoning_bonus": draw(coeff),
        "answer_bonus": draw(coeff),
        "top_percentile": draw(st.sampled_from([0.01, 0.2, 0.5, 1.0])),
        "group_reasoning_length_penalty_coeff": draw(coeff),
        "group_answer_length_penalty_coeff": draw(coeff),
        "group_style_penalty_coeff": draw(coeff),
    }
    return n, comps, population, tx, kwargs


class TestProperties:
    @settings(max_examples=300)
    @given(scenarios(), st.data())
    def test_relabelling_members_permutes_results(self, scenario: tuple, data: st.DataObject):
        n, comps, population, tx, kwargs = scenario
        perm = data.draw(st.permutations(range(n)))
        comps_p = [JudgedComparison(perm[c.i], perm[c.j], c.k, c.scores) for c in comps]
        pop_p = [perm[m] for m in population]
        tx_p = {perm[m]: t for m, t in tx.items()}
        a = aggregate(comps, population, tx, **kwargs)
        b = aggregate(comps_p, pop_p, tx_p, **kwargs)
        assert set(b.final) == set(pop_p)
        for m in population:
            assert b.base[perm[m]] == a.base[m]
            assert b.final[perm[m]] == pytest.approx(a.final[m], abs=1e-9)
            assert b.adjustments[perm[m]] == pytest.approx(a.adjustments[m], abs=1e-9)
        assert b.metrics == a.metrics

    @settings(max_examples=300)
    @given(scenarios())
    def test_group_length_and_style_adjustments_sum_to_zero(self, scenario: tuple) -> None:
        _, comps, population, tx, kwargs = scenario
        kwargs = {
            **kwargs,
            "reasoning_bonus": 0.0,
            "answer_bonus": 0.0,
            "group_reasoning_length_penalty_coeff": 0.7,
            "group_answer_length_penalty_coeff": 0.2,
        }
        agg = aggregate(comps, population, tx, **kwargs)
        assert set(agg.adjustments) == set(population)
        assert math.fsum(agg.adjustments.values()) == pytest.approx(0.0, abs=1e-9)
        if len(population) >= 2 and len({tx[m].answer_len for m in population}) > 1:
            assert any(agg.adjustments.values())

    @given(scenarios())
    def test_result_is_an_aggregation_over_population(self, scenario: tuple) -> None:
        _, comps, population, tx, kwargs = scenario
        agg = aggregate(comps, population, tx, **kwargs)
        assert isinstance(agg, Aggregation)
        assert list(agg.final) == list(agg.base) == list(agg.adjustments) == population
        if comps:
            assert set(agg.metrics) == {
                "mean_individual_score",
                "std_individual_score",
                "tiebreak_usage_rate",
            }
            assert 0.0 <= agg.metrics["tiebreak_usage_rate"] <= 1.0
        else:
            assert agg.metrics == {}


# ----------------------------------------------------------------------------- metrics


class TestPercentile:
    def test_spec_examples(self) -> None:
        assert percentile([1, 2, 3, 4], 0.5) == 2.5
        assert percentile([1, 2, 3, 4], 0.95) == pytest.approx(3.85, abs=1e-12)

    def test_unsorted_single_and_bounds(self) -> None:
        assert percentile([4, 1, 3, 2], 0.5) == 2.5
        assert percentile([7], 0.95) == 7.0
        assert percentile([3, 1], 0.0) == 1.0
        assert percentile([3, 1], 1.0) == 3.0

    def test_invalid(self) -> None:
        with pytest.raises(ValueError):
            percentile([], 0.5)
        with pytest.raises(ValueError):
            percentile([1.0], 1.5)


def cs(
    *,
    failed: bool = False,
    parse: bool = False,
    rubric: bool = False,
    tokens: tuple[int, int] | None = None,
    hit: bool = False,
) -> ComparisonStats:
    return ComparisonStats(
        failed=failed,
        overall_parse_failed=parse,
        rubric_parse_failed=rubric,
        input_tokens=tokens[0] if tokens else None,
        output_tokens=tokens[1] if tokens else None,
        budget_hit=hit,
    )


GROUP_KEYS = {
    "genrm_parse_failure_rate_per_group",
    "genrm_rubric_parse_failure_rate_per_group",
    "genrm_input_tokens_per_comparison_mean",
    "genrm_input_tokens_per_comparison_p50",
    "genrm_input_tokens_per_comparison_p95",
    "genrm_output_tokens_per_comparison_mean",
    "genrm_output_tokens_per_comparison_p50",
    "genrm_output_tokens_per_comparison_p95",
    "genrm_output_tokens_total_per_group",
    "genrm_max_output_tokens_hit_rate_per_group",
    "genrm_failed_comparison_rate_per_group",
    "genrm_masked_rollout_rate_per_group",
}


class TestGroupMetrics:
    def test_clean_group(self) -> None:
        stats = [cs(tokens=(100, 10)), cs(tokens=(200, 20)), cs(tokens=(300, 30)), cs()]
        out = group_metrics(stats, rubric_mode=False, masked=0, members=4)
        assert set(out) == GROUP_KEYS
        assert out["genrm_parse_failure_rate_per_group"] == 0.0
        assert out["genrm_rubric_parse_failure_rate_per_group"] == 0.0
        assert out["genrm_input_tokens_per_comparison_mean"] == 200.0
        assert out["genrm_input_tokens_per_comparison_p50"] == 200.0
        assert out["genrm_input_tokens_per_comparison_p95"] == pytest.approx(290.0)
        assert out["genrm_output_tokens_per_comparison_mean"] == 20.0
        assert out["genrm_output_tokens_per_comparison_p95"] == pytest.approx(29.0)
        assert out["genrm_output_tokens_total_per_group"] == 60.0
        assert out["genrm_max_output_tokens_hit_rate_per_group"] == 0.0
        assert out["genrm_failed_comparison_rate_per_group"] == 0.0
        assert out["genrm_masked_rollout_rate_per_group"] == 0.0

    def test_parse_rates_over_successful_comparisons_only(self) -> None:
        stats = [
            cs(parse=True, rubric=True),
            cs(),
            cs(rubric=True),
            cs(failed=True, parse=True, rubric=True),
        ]
        out = group_metrics(stats, rubric_mode=True, masked=2, members=4)
        assert out["genrm_parse_failure_rate_per_group"] == pytest.approx(1 / 3)
        assert out["genrm_rubric_parse_failure_rate_per_group"] == pytest.approx(2 / 3)
        plain = group_metrics(stats, rubric_mode=False, masked=2, members=4)
        assert plain["genrm_rubric_parse_failure_rate_per_group"] == 0.0

    def test_token_metrics_include_failed_comparisons_with_usage(self) -> None:
        stats = [
            cs(tokens=(10, 1)),
            cs(failed=True, tokens=(30, 1341), hit=True),
            cs(failed=True),  # no usage: left out
            cs(tokens=(20, 2)),
        ]
        out = group_metrics(stats, rubric_mode=False, masked=2, members=4)
        assert out["genrm_input_tokens_per_comparison_mean"] == 20.0
        assert out["genrm_output_tokens_total_per_group"] == 1344.0
        assert out["genrm_output_tokens_per_comparison_p50"] == 2.0
        assert out["genrm_max_output_tokens_hit_rate_per_group"] == pytest.approx(1 / 3)
        assert out["genrm_failed_comparison_rate_per_group"] == 0.5
        assert out["genrm_masked_rollout_rate_per_group"] == 0.5

    def test_no_usage_gives_null_token_metrics(self) -> None:
        out = group_metrics([cs(), cs(hit=True)], rubric_mode=False, masked=0, members=2)
        token_keys = {k for k in GROUP_KEYS if "tokens" in k}
        assert len(token_keys) == 8
        assert all(out[k] is None for k in token_keys)

    def test_every_comparison_failed_denominators(self) -> None:
        out = group_metrics(
            [cs(failed=True, parse=True)] * 3, rubric_mode=True, masked=3, members=3
        )
        assert out["genrm_parse_failure_rate_per_group"] == 0.0
        assert out["genrm_rubric_parse_failure_rate_per_group"] == 0.0
        assert out["genrm_failed_comparison_rate_per_group"] == 1.0
        assert out["genrm_masked_rollout_rate_per_group"] == 1.0

    def test_empty(self) -> None:
        out = group_metrics([], rubric_mode=False, masked=0, members=0)
        assert out["genrm_failed_comparison_rate_per_group"] == 0.0
        assert out["genrm_masked_rollout_rate_per_group"] == 0.0

    @pytest.mark.parametrize(
        ("failed_pairs", "masked", "rates"),
        [
            ({(0, 1)}, 2, (0.25, 0.5)),  # docs/scoring.md section 4, first example
            ({(0, 1), (1, 2)}, 3, (0.5, 0.75)),  # docs/scoring.md section 4, second example
        ],
    )
    def test_worked_example_rates(
        self, failed_pairs: set[tuple[int, int]], masked: int, rates: tuple[float, float]
    ) -> None:
        stats = [cs(failed=p in failed_pairs) for p in comparison_pairs(4, "circular")]
        out = group_metrics(stats, rubric_mode=False, masked=masked, members=4)
        got = (
            out["genrm_failed_comparison_rate_per_group"],
            out["genrm_masked_rollout_rate_per_group"],
        )
        assert got == rates

    def test_pr_task_4_rates(self) -> None:
        # 16 circular, (15, 0) failed → rollouts 15 and 0 masked: 0.0625 / 0.125
        stats = [cs(failed=p == (15, 0)) for p in comparison_pairs(16, "circular")]
        out = group_metrics(stats, rubric_mode=False, masked=2, members=16)
        assert out["genrm_failed_comparison_rate_per_group"] == 0.0625
        assert out["genrm_masked_rollout_rate_per_group"] == 0.125


class TestPositionDisagreement:
    def test_agreeing_orientations(self) -> None:
        items = [
            (jc(0, 1, (4.0, 2.0, 2.0), k=0), False),
            (jc(0, 1, (4.0, 2.0, 2.0), k=1), True),
        ]
        assert position_disagreement_rate(items) == 0.0

    def test_disagreeing_orientations(self) -> None:
        items = [
            (jc(0, 1, (4.0, 2.0, 2.0), k=0), False),
            (jc(0, 1, (2.0, 4.0, 5.0), k=1), True),
        ]
        assert position_disagreement_rate(items) == 1.0

    def test_reversed_member_orientation_is_normalised(self) -> None:
        # circular N=2, no swapping: (0,1) shows 0 first, (1,0) shows 1 first. Ranking 2 in
        # both means "prefer response_1" — member 0 in the first, member 1 in the second.
        biased = [(jc(0, 1, (4.0, 2.0, 2.0)), False), (jc(1, 0, (4.0, 2.0, 2.0)), False)]
        assert position_disagreement_rate(biased) == 1.0
        consistent = [(jc(0, 1, (4.0, 2.0, 2.0)), False), (jc(1, 0, (2.0, 4.0, 5.0)), False)]
        assert position_disagreement_rate(consistent) == 0.0

    def test_none_when_no_pair_judged_both_ways(self) -> None:
        assert position_disagreement_rate([]) is None
        items = [(jc(0, 1, (4.0, 2.0, 2.0), k=k), False) for k in range(3)]
        assert position_disagreement_rate(items) is None

    def test_ties_agree_only_with_ties(self) -> None:
        tie_tie = [(jc(0, 1, (3.0, 3.0, 3.5)), False), (jc(0, 1, (3.0, 3.0, 3.5), k=1), True)]
        assert position_disagreement_rate(tie_tie) == 0.0
        tie_pref = [(jc(0, 1, (3.0, 3.0, 3.5)), False), (jc(0, 1, (3.0, 3.0, 3.0), k=1), True)]
        assert position_disagreement_rate(tie_pref) == 1.0

    def test_mean_ranking_per_orientation(self) -> None:
        items = [
            (jc(0, 1, (1.0, 1.0, 2.0), k=0), False),
            (jc(0, 1, (1.0, 1.0, 6.0), k=2), False),  # mean 4.0 → prefers member 1
            (jc(0, 1, (1.0, 1.0, 5.0), k=1), True),  # prefers member 1
        ]
        assert position_disagreement_rate(items) == 0.0

    def test_huge_rankings_do_not_raise(self) -> None:
        items = [
            (jc(0, 1, (2.0, 1.0, 1e308), k=0), False),
            (jc(0, 1, (2.0, 1.0, 1e308), k=2), False),  # mean overflows to inf: prefers 1
            (jc(0, 1, (2.0, 1.0, 5.0), k=1), True),  # prefers member 1
        ]
        assert position_disagreement_rate(items) == 0.0

    def test_rate_over_pairs_judged_both_ways(self) -> None:
        items = [
            (jc(0, 1, (4.0, 2.0, 2.0), k=0), False),
            (jc(0, 1, (4.0, 2.0, 2.0), k=1), True),  # pair {0,1}: agree
            (jc(1, 2, (4.0, 2.0, 2.0), k=0), False),
            (jc(1, 2, (2.0, 4.0, 5.0), k=1), True),  # pair {1,2}: disagree
            (jc(0, 2, (4.0, 2.0, 1.0), k=0), False),  # pair {0,2}: one way only
        ]
        assert position_disagreement_rate(items) == 0.5

    @staticmethod
    def run_plan(judge: object) -> list[tuple[JudgedComparison, bool]]:
        assert callable(judge)
        plan = plan_comparisons(3, "all_pairs", 2, "alternate")
        return [
            (JudgedComparison(p.i, p.j, p.k, p.to_member_orientation(judge(*p.shown))), p.swapped)
            for p in plan
        ]

    def test_alternate_plan_with_position_biased_judge(self) -> None:
        # always prefers whatever is shown first
        judged = self.run_plan(lambda first, second: (5.0, 1.0, 1.0))
        assert position_disagreement_rate(judged) == 1.0
        # flipped back, the swapped comparisons favour j
        for c, swapped in judged:
            assert c.scores == ((1.0, 5.0, 6.0) if swapped else (5.0, 1.0, 1.0))
        agg = aggregate([c for c, _ in judged], range(3), {}, **cfg())
        assert ordered(agg.final) == [3.0, 3.0, 3.0]  # balance cancels the bias

    def test_alternate_plan_with_consistent_judge(self) -> None:
        # always prefers the lower member index, whatever the position
        def judge(first: int, second: int) -> Triple:
            return (5.0, 1.0, 1.0) if first < second else (1.0, 5.0, 6.0)

        judged = self.run_plan(judge)
        assert position_disagreement_rate(judged) == 0.0
        agg = aggregate([c for c, _ in judged], range(3), {}, **cfg())
        assert ordered(agg.final) == [5.0, 3.0, 1.0]
