"""The comparison graphs the property tests draw: every `comparison_strategy` the settings accept
for a group, derived from `ComparisonStrategy` and the settings' own checks, so that a new
strategy is drawn by every property test without an edit (tests/eager_scenarios.py,
tests/test_engine_properties.py, tests/test_readiness.py)."""

from __future__ import annotations

import functools
from typing import Any, get_args

from hypothesis import strategies as st
from pydantic import ValidationError

from genrm_trio.config import DEFAULT_COMPARISONS_PER_ROLLOUT, ComparisonStrategy, Settings
from genrm_trio.domain.scoring import comparison_pairs


@functools.cache
def graph_choices(n: int, mode: str = "rollout_cohort") -> tuple[dict[str, Any], ...]:
    """The settings keys of every distinct graph on `n` members under `mode`: each strategy the
    settings accept, with `comparisons_per_rollout` where it matters (it changes the pairs, or
    the default is refused), one d per distinct set of pairs."""
    choices: list[dict[str, Any]] = []
    for strategy in get_args(ComparisonStrategy):
        by_pairs: dict[tuple[tuple[int, int], ...], int] = {}
        accepted: set[int] = set()
        for d in sorted({DEFAULT_COMPARISONS_PER_ROLLOUT, *range(1, n + 1)}):
            try:
                Settings(
                    num_rollouts_per_prompt=n,
                    comparison_mode=mode,
                    comparison_strategy=strategy,
                    comparisons_per_rollout=d,
                )
            except ValidationError:
                continue
            accepted.add(d)
            by_pairs.setdefault(tuple(comparison_pairs(n, strategy, d)), d)
        if len(by_pairs) == 1 and DEFAULT_COMPARISONS_PER_ROLLOUT in accepted:
            choices.append({"comparison_strategy": strategy})
        else:
            choices += [
                {"comparison_strategy": strategy, "comparisons_per_rollout": d}
                for d in by_pairs.values()
            ]
    return tuple(choices)


def graphs(n: int, mode: str = "rollout_cohort") -> st.SearchStrategy[dict[str, Any]]:
    """One of `graph_choices(n, mode)`."""
    return st.sampled_from(graph_choices(n, mode))


def degree(graph: dict[str, Any]) -> int:
    """The d a graph of `graph_choices` plans with (the default when it does not say)."""
    return int(graph.get("comparisons_per_rollout", DEFAULT_COMPARISONS_PER_ROLLOUT))
