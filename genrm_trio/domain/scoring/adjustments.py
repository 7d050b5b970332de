"""Group adjustments of base scores: top-percentile bonuses, length and style penalties
(docs/scoring.md section 3, D5, D6, D1). Pure.

Floating-point operations follow the reference order (bonuses before length weights before
style weights, each added to the running score) so rewards match NeMo Gym's `genrm_compare` to
the last bit; which method produced the base scores does not matter here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import final

from genrm_trio.domain.scoring.style import style_density

__all__ = ["MemberTexts", "adjust", "density_weights"]


@final
@dataclass(frozen=True, slots=True)
class MemberTexts:
    """What the adjustments need from one member's response (docs/scoring.md section 3)."""

    reasoning_len: int  # characters of the stripped reasoning text
    answer_len: int  # characters of the stripped answer text
    style_density: float  # style_density(answer)

    @classmethod
    def from_texts(cls, reasoning: str, answer: str) -> MemberTexts:
        """From the extracted texts. ``answer`` is the raw extracted output text (empty when the
        response has none), not the ``"None"`` placeholder shown to the judge."""
        return cls(len(reasoning.strip()), len(answer.strip()), style_density(answer))


def density_weights(values: Sequence[float]) -> list[float]:
    """Zero-centred weights, lower value ⇒ higher weight (docs/scoring.md 3 (b); lengths, style).

    ``w = 1 - (v - min) / (max - min)``, then ``w - mean(w)``; all zeros when ``max == min``.
    """
    if not values:
        return []
    hi, lo = max(values), min(values)
    if hi == lo:
        return [0.0] * len(values)
    span = hi - lo
    raw = [1.0 - ((v - lo) / span) for v in values]
    mean = sum(raw) / len(raw)
    return [w - mean for w in raw]


def adjust(
    base: Sequence[float],
    members: Sequence[int],
    texts: Mapping[int, MemberTexts],
    *,
    reasoning_bonus: float,
    answer_bonus: float,
    top_percentile: float,
    group_reasoning_length_penalty_coeff: float,
    group_answer_length_penalty_coeff: float,
    group_style_penalty_coeff: float,
) -> tuple[list[float], list[float]]:
    """``(final scores, total adjustments)`` of ``members`` (the population, in index order) from
    their ``base`` scores; each pass is a no-op for fewer than 2 members.

    ``texts`` must cover the members whenever a pass runs (ValueError otherwise).
    """
    scores = list(base)
    adjustments = [0.0] * len(members)
    length_pass = (
        reasoning_bonus > 0
        or answer_bonus > 0
        or group_reasoning_length_penalty_coeff > 0
        or group_answer_length_penalty_coeff > 0
    )
    style_pass = group_style_penalty_coeff > 0
    if len(members) < 2 or not (length_pass or style_pass):
        return scores, adjustments
    missing = [m for m in members if m not in texts]
    if missing:
        raise ValueError(f"no MemberTexts for population members {missing}")
    if length_pass:
        _length_adjustments(
            scores,
            adjustments,
            [texts[m].reasoning_len for m in members],
            [texts[m].answer_len for m in members],
            reasoning_bonus=reasoning_bonus,
            answer_bonus=answer_bonus,
            top_percentile=top_percentile,
            reasoning_coeff=group_reasoning_length_penalty_coeff,
            answer_coeff=group_answer_length_penalty_coeff,
        )
    if style_pass:
        weights = density_weights([texts[m].style_density for m in members])
        for idx, w in enumerate(weights):
            adj = w * group_style_penalty_coeff
            if adj != 0:
                scores[idx] += adj
                adjustments[idx] += adj
    return scores, adjustments


def _shortest_nonempty(lengths: Sequence[int]) -> int | None:
    """Position of the smallest length > 0, the first on ties; None when all are empty."""
    best: int | None = None
    for idx, length in enumerate(lengths):
        if length > 0 and (best is None or length < lengths[best]):
            best = idx
    return best


def _length_adjustments(
    scores: list[float],
    adjustments: list[float],
    reasoning_lens: Sequence[int],
    answer_lens: Sequence[int],
    *,
    reasoning_bonus: float,
    answer_bonus: float,
    top_percentile: float,
    reasoning_coeff: float,
    answer_coeff: float,
) -> None:
    """docs/scoring.md 3 (a) top-percentile bonuses then (b) group length penalties, in place."""
    t_idx = max(0, int(len(scores) * top_percentile) - 1)
    threshold = sorted(scores, reverse=True)[t_idx]  # once, before any bonus
    for bonus, lengths in ((reasoning_bonus, reasoning_lens), (answer_bonus, answer_lens)):
        if bonus > 0:
            idx = _shortest_nonempty(lengths)
            # the answer check sees the reasoning bonus (reference behaviour)
            if idx is not None and scores[idx] >= threshold:
                scores[idx] += bonus
                adjustments[idx] += bonus
    if reasoning_coeff > 0 or answer_coeff > 0:
        r_weights = density_weights(reasoning_lens)
        a_weights = density_weights(answer_lens)
        for idx in range(len(scores)):
            total = r_weights[idx] * reasoning_coeff + a_weights[idx] * answer_coeff
            if total != 0:
                scores[idx] += total
                adjustments[idx] += total
