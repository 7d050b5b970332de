"""The `regular` comparison strategy's graph, the strategy dispatch and the settings that choose
them (docs/scoring.md, "Pairs" and "The regular graph"; docs/configuration.md)."""

from __future__ import annotations

import itertools
import math
from typing import get_args

import pytest

from genrm_trio.config import ComparisonStrategy, ConfigError, settings_from_mapping
from genrm_trio.domain.scoring import (
    algebraic_connectivity,
    circulant_offsets,
    comparison_pairs,
    components,
    fitting_degree,
    plan_comparisons,
)
from genrm_trio.domain.scoring.regular import check_degree, regular_pairs

# Every strategy's pair count for one pass at N = 16 (d = 4 for regular). A new strategy fails
# `test_every_strategy_has_a_pinned_pair_count` until it has a row here.
PAIR_COUNTS: dict[str, int] = {"circular": 16, "all_pairs": 120, "regular": 32}


def test_every_strategy_has_a_pinned_pair_count() -> None:
    assert set(PAIR_COUNTS) == set(get_args(ComparisonStrategy))


@pytest.mark.parametrize("strategy", sorted(PAIR_COUNTS))
def test_pair_count_of_each_strategy(strategy: str) -> None:
    assert len(comparison_pairs(16, strategy, 4)) == PAIR_COUNTS[strategy]
    assert len(plan_comparisons(16, strategy, 3, "alternate", 4)) == 3 * PAIR_COUNTS[strategy]


def test_an_unknown_strategy_is_refused_not_turned_into_another() -> None:
    with pytest.raises(ValueError, match="Unsupported comparison_strategy: 'Regular'"):
        comparison_pairs(16, "Regular")


def test_regular_pair_counts_follow_d() -> None:
    for n, d in [(16, 3), (16, 6), (16, 8), (64, 4), (64, 8), (64, 16)]:
        assert len(comparison_pairs(n, "regular", d)) == n * d // 2


CASES = [(n, d) for n in range(3, 21) for d in range(2, n) if n * d % 2 == 0] + [
    (64, 4),
    (64, 8),
    (64, 16),
    (64, 33 - 1),
    (128, 8),
    (256, 16),
]


@pytest.mark.parametrize(("n", "d"), CASES)
def test_the_graph_is_simple_regular_connected_and_balanced(n: int, d: int) -> None:
    pairs = regular_pairs(n, d)
    edges = {frozenset(p) for p in pairs}
    assert all(i != j for i, j in pairs)  # no self-comparison
    assert len(edges) == len(pairs) == n * d // 2  # no pair twice, in either order
    degree = [0] * n
    first = [0] * n
    for i, j in pairs:
        degree[i] += 1
        degree[j] += 1
        first[i] += 1
    assert degree == [d] * n
    assert all(d // 2 <= f <= (d + 1) // 2 for f in first)  # shown first before position_balance
    assert components(n, pairs) == [list(range(n))]


@pytest.mark.parametrize(("n", "d"), [(16, 4), (16, 7 + 1), (64, 8), (64, 16), (30, 12)])
def test_the_graph_is_the_same_for_the_same_n_and_d(n: int, d: int) -> None:
    first = regular_pairs(n, d)
    circulant_offsets.cache_clear()
    assert regular_pairs(n, d) == first


@pytest.mark.parametrize("n", range(3, 20))
def test_d2_is_exactly_circulars_pairs(n: int) -> None:
    assert comparison_pairs(n, "regular", 2) == comparison_pairs(n, "circular")


@pytest.mark.parametrize("n", range(3, 20))
def test_d_n_minus_1_is_all_pairs_set(n: int) -> None:
    if n * (n - 1) % 2:
        pytest.fail("N·(N−1) is always even")
    regular = {frozenset(p) for p in comparison_pairs(n, "regular", n - 1)}
    assert regular == {frozenset(p) for p in comparison_pairs(n, "all_pairs")}


def test_pinned_graphs() -> None:
    """The offsets that docs/scoring.md and the benchmark quote."""
    assert circulant_offsets(16, 3) == (1, 8)
    assert circulant_offsets(16, 4) == (1, 4)
    assert circulant_offsets(16, 6) == (1, 3, 5)
    assert circulant_offsets(16, 8) == (1, 3, 5, 7)
    assert circulant_offsets(64, 8) == (1, 6, 23, 27)
    assert regular_pairs(16, 3)[-8:] == [(i, i + 8) for i in range(8)]  # odd d: N/2 last


def _laplacian_times(n: int, offsets: tuple[int, ...], v: list[float]) -> list[float]:
    neighbours = [set() for _ in range(n)]  # type: list[set[int]]
    for s in offsets:
        for i in range(n):
            neighbours[i].add((i + s) % n)
            neighbours[(i + s) % n].add(i)
    return [len(neighbours[i]) * v[i] - sum(v[j] for j in neighbours[i]) for i in range(n)]


@pytest.mark.parametrize(
    ("n", "offsets"), [(16, (1, 4)), (16, (1, 8)), (15, (2, 5, 7)), (12, (6,))]
)
def test_the_closed_form_eigenvalues_are_the_laplacians(n: int, offsets: tuple[int, ...]) -> None:
    """μ_k = Σ_s (2 − 2cos(2πks/N)) (+ 1 − (−1)^k for N/2) with eigenvector cos(2πkj/N): the
    eigenvalue `algebraic_connectivity` minimises is the Laplacian's, checked by L·v = μ·v."""
    lowest = math.inf
    for k in range(1, n // 2 + 1):
        v = [math.cos(2 * math.pi * k * j / n) for j in range(n)]
        mu = sum(
            (1 - (-1) ** k) if 2 * s == n else 2 - 2 * math.cos(2 * math.pi * k * s / n)
            for s in offsets
        )
        assert _laplacian_times(n, offsets, v) == pytest.approx([mu * x for x in v], abs=1e-9)
        lowest = min(lowest, mu)
    assert algebraic_connectivity(n, offsets) == pytest.approx(lowest)


@pytest.mark.parametrize(("n", "d"), [(n, d) for n in range(5, 17) for d in range(3, n - 1)])
def test_the_chosen_offsets_maximise_algebraic_connectivity(n: int, d: int) -> None:
    """Against every set of offsets, not only those holding 1 (small N: all searched)."""
    if n * d % 2:
        return
    tail = (n // 2,) if d % 2 else ()
    best = max(
        algebraic_connectivity(n, (*rest, *tail))
        for rest in itertools.combinations(range(1, (n + 1) // 2), d // 2)
    )
    assert algebraic_connectivity(n, circulant_offsets(n, d)) == pytest.approx(best, abs=1e-9)


def test_spread_offsets_beat_near_neighbours() -> None:
    """Why the offsets are spread: a ring of i±1, i±2, i±3, i±4 connects slowest."""
    assert algebraic_connectivity(64, (1, 2, 3, 4)) < 0.29
    assert algebraic_connectivity(64, circulant_offsets(64, 8)) > 4.45


@pytest.mark.parametrize(("n", "d"), [(16, 1), (16, 16), (16, 0), (15, 3), (3, 3)])
def test_impossible_degrees_raise(n: int, d: int) -> None:
    with pytest.raises(ValueError, match="d="):
        check_degree(n, d)
    with pytest.raises(ValueError):
        comparison_pairs(n, "regular", d)


@pytest.mark.parametrize(
    ("n", "d", "fit"),
    [(16, 4, 4), (2, 4, 1), (3, 4, 2), (5, 4, 4), (5, 3, 2), (7, 8, 6), (8, 8, 7), (9, 5, 4)],
)
def test_fitting_degree_for_compare_batches(n: int, d: int, fit: int) -> None:
    assert fitting_degree(n, d) == fit
    pairs = comparison_pairs(n, "regular", fit)
    assert components(n, pairs) == [list(range(n))]


# --- settings --------------------------------------------------------------------------------


def load(data: dict[str, object]) -> object:
    return settings_from_mapping(data, file="x.yaml")


def error(data: dict[str, object]) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        settings_from_mapping(data, file="x.yaml")
    return info.value


def test_regular_settings_default_d_is_4() -> None:
    s = settings_from_mapping({"comparison_strategy": "regular", "num_rollouts_per_prompt": 16})
    assert s.comparisons_per_rollout == 4
    assert s.startup_warnings()[-1].startswith("masked rows")


@pytest.mark.parametrize(
    ("n", "d", "message"),
    [
        (16, 1, "1 with num_rollouts_per_prompt: 16: "
         "comparison_strategy: regular needs 2 <= d <= N - 1 = 15"),
        (16, 16, "16 with num_rollouts_per_prompt: 16: "
         "comparison_strategy: regular needs 2 <= d <= N - 1 = 15"),
        (2, 2, "2 with num_rollouts_per_prompt: 2: "
         "comparison_strategy: regular needs 2 <= d <= N - 1 = 1"),
        (15, 3, "3 with num_rollouts_per_prompt: 15: "
         "comparison_strategy: regular needs N·d even (an odd d needs an even N)"),
    ],
)  # fmt: skip
def test_regular_degree_errors_name_both_keys(n: int, d: int, message: str) -> None:
    err = error(
        {
            "comparison_strategy": "regular",
            "num_rollouts_per_prompt": n,
            "comparisons_per_rollout": d,
        }
    )
    assert err.key == "comparisons_per_rollout"
    assert err.message == message
    # the line a user sees names the key once, then the value and N
    assert str(err).endswith(f"comparisons_per_rollout: {message}")
    assert str(err).count("comparisons_per_rollout") == 1
    assert "\n" not in str(err)


def test_regular_is_refused_with_fixed_baseline() -> None:
    err = error({"comparison_strategy": "regular", "comparison_mode": "fixed_baseline"})
    assert err.key == "comparison_strategy"
    assert "comparison_mode: fixed_baseline" in err.message


@pytest.mark.parametrize("value", [4.0, "4", True])
def test_comparisons_per_rollout_is_an_int(value: object) -> None:
    assert error({"comparisons_per_rollout": value}).key == "comparisons_per_rollout"


def test_regular_with_one_rollout_checks_nothing() -> None:
    s = settings_from_mapping({"comparison_strategy": "regular", "comparisons_per_rollout": 8})
    assert s.comparisons_per_rollout == 8


@pytest.mark.parametrize("strategy", [s for s in get_args(ComparisonStrategy) if s != "regular"])
def test_d_under_other_strategies_is_a_warning(strategy: str) -> None:
    s = settings_from_mapping(
        {
            "comparison_strategy": strategy,
            "num_rollouts_per_prompt": 16,
            "comparisons_per_rollout": 8,
        }
    )
    assert (
        f"comparisons_per_rollout (8) is ignored under comparison_strategy: {strategy} "
        "(circular: 2 a pass, all_pairs: N - 1, fixed_baseline: 1); it sets d of "
        "comparison_strategy: regular: remove the key, or set comparison_strategy: regular"
    ) in s.startup_warnings()
    unset = settings_from_mapping({"comparison_strategy": strategy, "num_rollouts_per_prompt": 16})
    assert not any("comparisons_per_rollout" in line for line in unset.startup_warnings())
