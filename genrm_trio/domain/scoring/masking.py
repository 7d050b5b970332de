"""Which rollouts a group's failed comparisons mask, and when the whole group fails
(docs/scoring.md section 4, "Masking", D30, D31, D46). Pure.

`pair` (the default, the partial-masking rule): both members of every failed comparison are
masked. `component`: a member is scored iff it lies in the largest connected component of the
graph whose edges are the comparisons with at least one successful pass.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, assert_never, final, get_args

from genrm_trio.config import MaskPolicy
from genrm_trio.domain.scoring.graph import largest_component
from genrm_trio.domain.scoring.pairs import PlannedComparison

__all__ = ["AllMasked", "Masking", "mask_members"]

# the settings' vocabulary is the one source (config/settings.py); this only checks arguments
_POLICIES: Final = frozenset(get_args(MaskPolicy))


@final
@dataclass(frozen=True, slots=True)
class AllMasked:
    """Every member is masked: the group fails as a judge failure (D30)."""

    message: str


@final
@dataclass(frozen=True, slots=True)
class Masking:
    """The scored members (ascending) and each masked member's failure reason."""

    scored: list[int]
    reasons: dict[int, str]


def mask_members(
    policy: MaskPolicy,
    size: int,
    plan: Sequence[PlannedComparison],
    errors: Sequence[str | None],
) -> Masking | AllMasked:
    """Apply ``policy`` (``pair`` or ``component``) to a finished group of ``size`` members.

    ``errors[c]`` is the judge error of ``plan[c]``, None when it succeeded. Index ``size`` is
    the fixed baseline when the plan has one: a vertex of the graph, never masked or scored.
    Raises ValueError for a policy outside `MaskPolicy` (an untyped caller's) or a plan and
    errors of different lengths.
    """
    if policy not in _POLICIES:
        raise ValueError(f"Unsupported mask_policy: {policy!r}. Supported: {sorted(_POLICIES)}")
    if len(errors) != len(plan):
        raise ValueError(f"{len(errors)} outcomes for {len(plan)} planned comparisons")
    failed = [c for c, error in enumerate(errors) if error is not None]
    first_error: dict[int, str] = {}  # each member's first failed comparison (D31)
    for c in failed:  # comparison order: judge-major, then pair order
        planned, message = plan[c], errors[c]
        assert message is not None
        for m in (planned.i, planned.j):
            if m < size:
                first_error.setdefault(m, message)
    counts = f"{len(failed)} of {len(plan)} comparisons failed"
    first_failure = errors[failed[0]] or "" if failed else ""
    all_masked = AllMasked(
        f"GenRM masked every rollout of the group after judge failures ({counts}): {first_failure}"
    )
    match policy:  # exhaustive: mypy fails here until a new policy has its case
        case "pair":
            if len(first_error) == size:
                return all_masked
            reasons = {
                m: f"GenRM rollout_index={m} lost a comparison to a judge failure ({counts}): "
                f"{error}"
                for m, error in sorted(first_error.items())
            }
            return Masking([m for m in range(size) if m not in first_error], reasons)
        case "component":
            return _mask_outside_component(
                size, plan, errors, first_error, (counts, first_failure), all_masked
            )
        case _:
            assert_never(policy)


def _mask_outside_component(
    size: int,
    plan: Sequence[PlannedComparison],
    errors: Sequence[str | None],
    first_error: dict[int, str],
    failures: tuple[str, str],
    all_masked: AllMasked,
) -> Masking | AllMasked:
    """`component`: a member is scored iff it lies in the largest connected component of the
    successful comparisons' graph. ``failures``: how many failed, and the first failure."""
    counts, first_failure = failures
    vertices = max([size, *(max(p.i, p.j) + 1 for p in plan)])
    edges = [(plan[c].i, plan[c].j) for c, error in enumerate(errors) if error is None]
    largest = largest_component(vertices, edges)
    if len(largest) < 2:  # no successful comparison at all: every rollout is masked
        return all_masked
    scored = [v for v in largest if v < size]
    inside = set(scored)
    where = (
        f"is outside the largest connected component of the comparison graph "
        f"({len(scored)} of {size} rollouts are in it; {counts})"
    )
    component_reasons: dict[int, str] = {}
    for m in range(size):
        if m in inside:
            continue
        if m in first_error:
            component_reasons[m] = (
                f"GenRM rollout_index={m} {where} and lost a comparison to a judge failure: "
                f"{first_error[m]}"
            )
        else:
            component_reasons[m] = (
                f"GenRM rollout_index={m} {where}; it lost no comparison, failures elsewhere "
                f"cut it off: {first_failure}"
            )
    return Masking(scored, component_reasons)
