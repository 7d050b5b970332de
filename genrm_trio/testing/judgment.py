"""The simulated judge's noisy-judge modes: verdicts from latent answer qualities, in two
families, for measuring reward quality (docs/benchmarks.md, "Reward quality"). Pure.

Every answer text has a latent quality q ~ N(0, 1), drawn from sha256 of (seed, text). One call
of the judge then gives:

- `comparative` (a judge that reads both answers, then writes its verdict): one noisy judgment
  of the difference, z = q_first − q_second + bias + noise·ε with ε ~ N(0, 1), drives all three
  numbers. Its strength is level = min(2, ⌊|z| / 0.9⌋) (slightly, clearly, much better); the
  ranking is 3 − level when z ≥ 0 (the first answer better), else 4 + level, and the scores are
  3 ± level, the better answer's up: scores and ranking tell one story.
- `pointwise` (scores that grade each answer on its own): score_x = clip(round(3 + q_x +
  noise·ε_x), 1, 5) with independent ε_x, and the ranking a separate position-biased preference:
  w = beta·(q_first − q_second) + bias + L with L standard logistic, so P(first preferred) =
  σ(beta·(q_first − q_second) + bias), graded like z with level = min(2, ⌊|w| / 1.4⌋).

The steps 0.9 and 1.4 put about a third of the verdicts of random pairs of one group (q ~ N(0, 1)
each, default parameters) at each strength.

The noise of a call is drawn from sha256 of (seed, the call's content, how many times the same
content was judged before), so the J passes of a pair and the retries of a comparison are fresh
samples (a judge at temperature 0.6), and a run reproduces whatever the scheduling order.

`JUDGMENT_PRESETS` holds each family's defaults; docs/benchmarks.md says where they come from
(position-swap consistency 65 % with inconsistencies 30 % towards the first answer and 5 %
towards the second, GPT-4 on MT-Bench: Zheng et al. 2023, Table 2).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, Literal, final, get_args

from genrm_trio.judge.base import JudgeCall
from genrm_trio.testing.verdicts import answer_digest, normal_from_digest

__all__ = [
    "JUDGMENT_FAMILIES",
    "JUDGMENT_PRESETS",
    "JudgmentFamily",
    "JudgmentModel",
    "call_key",
    "judged_verdict",
    "latent_quality",
]

JudgmentFamily = Literal["comparative", "pointwise"]
JUDGMENT_FAMILIES: Final[tuple[str, ...]] = get_args(JudgmentFamily)

COMPARATIVE_STEP: Final = 0.9  # latent-quality units per strength level
POINTWISE_STEP: Final = 1.4  # logit units per strength level


@final
@dataclass(frozen=True, slots=True)
class JudgmentModel:
    """One family's parameters (module docstring): ``noise`` is the judgment's noise sd
    (comparative) or each score's (pointwise), in latent-quality units; ``bias`` favours the
    answer shown first (quality units in comparative, logit units in pointwise); ``beta`` is the
    pointwise preference's sharpness (unused by comparative)."""

    family: JudgmentFamily
    noise: float
    bias: float
    beta: float = 1.0

    def __post_init__(self) -> None:
        if self.family not in JUDGMENT_FAMILIES:
            raise ValueError(
                f"unknown judgment family {self.family!r}; expected one of {JUDGMENT_FAMILIES}"
            )
        for name in ("noise", "beta"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"judgment {name} must be a finite number >= 0")
        if not math.isfinite(self.bias):
            raise ValueError("judgment bias must be finite")


#: Defaults fitted to MT-Bench's GPT-4 position-swap figures (consistent 65 %, first-biased 30 %,
#: second-biased 5 %) over random pairs of one group (q ~ N(0, 1) each): comparative noise 1.11
#: and bias 0.57; pointwise beta 1.57 and bias 0.90. Either judge prefers the better answer of a
#: random pair in 77 % of single calls; the pointwise score noise 0.75 makes its scores alone do
#: the same (ties counted half). docs/benchmarks.md, "Reward quality", has the derivation.
JUDGMENT_PRESETS: Final[Mapping[str, JudgmentModel]] = {
    "comparative": JudgmentModel("comparative", noise=1.11, bias=0.57),
    "pointwise": JudgmentModel("pointwise", noise=0.75, bias=0.90, beta=1.57),
}


def latent_quality(seed: int, text: str) -> float:
    """The latent quality q ~ N(0, 1) of an answer text under ``seed``."""
    return normal_from_digest(
        hashlib.sha256(f"{seed}\0quality\0".encode() + answer_digest(text)).digest()
    )


def call_key(call: JudgeCall) -> bytes:
    """A digest of what the judge is shown: both answers in order, the principle, the history."""
    content = hashlib.sha256()
    for part in (call.response_1, call.response_2, call.principle or ""):
        content.update(answer_digest(part))
    for message in call.history:
        content.update(answer_digest(message.get("role", "")))
        content.update(answer_digest(message.get("content", "")))
    return content.digest()


def _clip(value: int, low: int, high: int) -> int:
    return min(high, max(low, value))


def _level(judgment: float, step: float) -> int:
    """Strength 0, 1 or 2 (slightly, clearly, much better) of a judgment."""
    return min(2, math.floor(abs(judgment) / step))


def _ranking(judgment: float, level: int) -> int:
    return 3 - level if judgment >= 0 else 4 + level


def judged_verdict(
    model: JudgmentModel,
    seed: int,
    key: bytes,
    occurrence: int,
    q_first: float,
    q_second: float,
) -> tuple[int, int, int]:
    """``(score_1, score_2, ranking)`` of one call: the ``occurrence``-th time (0-based) content
    ``key`` (`call_key`) is judged, first answer of latent quality ``q_first``."""
    draw = hashlib.sha256(f"{seed}\0judgment\0{occurrence}\0".encode() + key).digest()
    if model.family == "comparative":
        z = q_first - q_second + model.bias + model.noise * normal_from_digest(draw[:8])
        level = _level(z, COMPARATIVE_STEP)
        up, down = 3 + level, 3 - level
        return (up, down, _ranking(z, level)) if z >= 0 else (down, up, _ranking(z, level))
    score_1 = _clip(round(3 + q_first + model.noise * normal_from_digest(draw[:8])), 1, 5)
    score_2 = _clip(round(3 + q_second + model.noise * normal_from_digest(draw[8:16])), 1, 5)
    uniform = (int.from_bytes(draw[16:24], "big") + 0.5) / 2**64
    logistic = math.log(uniform / (1.0 - uniform))
    w = model.beta * (q_first - q_second) + model.bias + logistic
    return score_1, score_2, _ranking(w, _level(w, POINTWISE_STEP))
