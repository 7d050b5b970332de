"""The simulated judge's verdicts and their length: pure functions of the answer texts.

Each answer gets a quality 1..5 from its sha256 (or from a `[quality=N]` marker in the text), the
scores are the qualities and the ranking follows their difference, so both orientations of a pair
always agree. `LengthModel` (or a `[need=N]` marker) gives the output tokens a verdict needs.
"""

from __future__ import annotations

import hashlib
import math
import re
import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, final

__all__ = [
    "LENGTH_PRESETS",
    "NEED_MARKER",
    "QUALITY_MARKER",
    "LengthModel",
    "answer_quality",
    "forced_need",
    "sim_verdict",
    "sim_verdict_text",
]

#: `[quality=N]` (N in 1..5) anywhere in an answer forces that answer's quality; the first wins.
QUALITY_MARKER: Final = re.compile(r"\[quality=([1-5])\]")

#: `[need=N]` (or `[need=N1/N2/...]`, one value per attempt, the last repeating) in an answer
#: forces the output tokens its pair's verdict needs, with or without a length model.
NEED_MARKER: Final = re.compile(r"\[need=([0-9]+(?:/[0-9]+)*)\]")

FILLER: Final = "Let me weigh both responses against the conversation once more. "


# --- deterministic verdicts -------------------------------------------------------------------


def answer_digest(text: str) -> bytes:
    return hashlib.sha256(text.encode("utf-8", errors="surrogatepass")).digest()


def answer_quality(text: str) -> int:
    """Quality 1..5 of one answer: its `[quality=N]` marker, else derived from its sha256."""
    marker = QUALITY_MARKER.search(text)
    if marker is not None:
        return int(marker.group(1))
    return int.from_bytes(answer_digest(text)[:8], "big") % 5 + 1


def forced_need(response_1: str, response_2: str, attempt: int) -> int | None:
    """The `[need=...]` marker's value for attempt number `attempt` (0-based) of a pair: the
    larger of the two answers' values (so the order shown does not matter), None without one."""
    values: list[int] = []
    for text in (response_1, response_2):
        marker = NEED_MARKER.search(text)
        if marker is not None:
            steps = marker.group(1).split("/")
            values.append(int(steps[min(attempt, len(steps) - 1)]))
    return max(values) if values else None


def normal_from_digest(digest: bytes) -> float:
    """A standard normal from 8 bytes of a digest (inverse CDF of a uniform in (0, 1))."""
    uniform = (int.from_bytes(digest[:8], "big") + 0.5) / 2**64
    return statistics.NormalDist().inv_cdf(uniform)


def sim_verdict(response_1: str, response_2: str) -> tuple[int, int, float]:
    """`(score_1, score_2, ranking)` for a pair; swapping the answers gives `(s2, s1, 7 - r)`.

    Ranking by quality difference d = q1 - q2: d >= 2 → 1, d = 1 → 2, d = -1 → 5, d <= -2 → 6.
    Equal qualities rank 3 or 4 by comparing the answers' digests, and exactly 3.5 for identical
    answers (the only non-integer ranking).
    """
    q1 = answer_quality(response_1)
    q2 = answer_quality(response_2)
    d = q1 - q2
    ranking: float
    if d >= 2:
        ranking = 1
    elif d == 1:
        ranking = 2
    elif d == -1:
        ranking = 5
    elif d <= -2:
        ranking = 6
    else:
        h1, h2 = answer_digest(response_1), answer_digest(response_2)
        ranking = 3 if h1 > h2 else 4 if h1 < h2 else 3.5
    return q1, q2, ranking


_QUALITY_WORDS: Final = {
    1: "is largely incorrect",
    2: "has significant errors",
    3: "is partially correct",
    4: "is mostly correct",
    5: "is correct and complete",
}


def verdict_json(score_1: object, score_2: object, ranking: object) -> str:
    return f'{{"score_1": {score_1}, "score_2": {score_2}, "ranking": {ranking}}}'


def format_ranking(ranking: float) -> str:
    return str(int(ranking)) if float(ranking).is_integer() else str(ranking)


def verdict_prose(q1: int, q2: int, ranking: float) -> str:
    if ranking < 3.5:
        which = "Response 1 is better."
    elif ranking > 3.5:
        which = "Response 2 is better."
    else:
        which = "The responses are equally good."
    return (
        f"Response 1 {_QUALITY_WORDS[q1]} (quality {q1}/5). "
        f"Response 2 {_QUALITY_WORDS[q2]} (quality {q2}/5). {which}"
    )


def verdict_text(q1: int, q2: int, ranking: float) -> str:
    """A judge's full answer for a verdict: one line of reasoning, then a fenced json verdict
    (parsed as docs/scoring.md, "Overall verdict", says)."""
    verdict = verdict_json(q1, q2, format_ranking(ranking))
    return f"{verdict_prose(q1, q2, ranking)}\n\n```json\n{verdict}\n```"


def sim_verdict_text(response_1: str, response_2: str) -> str:
    """The deterministic judge's full answer for a pair (`sim_verdict`, `verdict_text`)."""
    return verdict_text(*sim_verdict(response_1, response_2))


# --- the length model -------------------------------------------------------------------------


@final
@dataclass(frozen=True, slots=True)
class LengthModel:
    """Output tokens an attempt's verdict needs: a log-normal per pair times log-normal noise per
    attempt, clipped to ``[low, high]``.

    ``need = clip(round(median * exp(pair_sigma * z_pair + attempt_sigma * z_attempt)))`` with
    standard normals drawn from sha256 of (seed, pair) and (seed, pair, attempt). The pair is the
    unordered pair of answer texts plus the history and principle, so showing it the other way
    round (``position_balance``) does not change how hard it is; the attempt is how many times the
    simulator has judged that pair before (in either order, across judge passes), so a retry of
    a pair is a fresh sample of the same difficulty, as sampling at temperature 0.6 is. The
    need does not depend on the budget: the budget only cuts a long answer off.

    ``pair_sigma`` spreads difficulty between pairs, ``attempt_sigma`` between samples of one
    pair; the marginal of one attempt is log-normal with sigma ``sqrt(pair_sigma^2 +
    attempt_sigma^2)`` (before clipping). Presets are in `LENGTH_PRESETS`.
    """

    median: float
    pair_sigma: float
    attempt_sigma: float
    low: int = 1
    high: int = 1 << 20

    def __post_init__(self) -> None:
        if not (math.isfinite(self.median) and self.median > 0):
            raise ValueError("median must be a finite number > 0")
        for name in ("pair_sigma", "attempt_sigma"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number >= 0")
        if not 1 <= self.low <= self.high:
            raise ValueError("need 1 <= low <= high")

    def need(self, z_pair: float, z_attempt: float) -> int:
        raw = self.median * math.exp(self.pair_sigma * z_pair + self.attempt_sigma * z_attempt)
        return min(self.high, max(self.low, round(raw)))


#: `validation`: the partial-masking validation run's judge (answers of 531-2,981 tokens, 1,341
#: at the 55th percentile). Log-normal sigma 0.345 overall (the range spans about 5 sigma, as
#: ~100 draws do), median 1,284 so that P(need <= 1,341) = 0.55; split as 0.32 between samples of
#: one pair (a coefficient of variation near 0.3 at temperature 0.6) and 0.13 between pairs. Most
#: of the spread is within a pair because the run's 9 of 64 failures with two attempts are below
#: even independent attempts' 0.45^2 = 20%; a larger pair share would fail more pairs twice.
#: `long_tail`: a judge that reasons for 15,000 tokens at the median with a wide spread (sigma
#: 0.61; 0.50 between samples of one pair), so a 16,384 budget is exhausted by 44% of attempts
#: and 10% need more than 32,768 (NeMo Gym PR #3303 saw 3 of 5 runs exhaust 16,384 and 2 of 4
#: exhaust 24,576 with a hosted GenRM at temperature 0.6).
LENGTH_PRESETS: Final[Mapping[str, LengthModel]] = {
    "validation": LengthModel(1284.0, 0.13, 0.32, low=531, high=2981),
    "long_tail": LengthModel(15000.0, 0.35, 0.50, low=1500, high=131072),
}
