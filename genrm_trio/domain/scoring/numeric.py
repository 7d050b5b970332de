"""Float helpers of the scoring modules that never raise where the sums they guard may overflow.

With ``validate_verdict_range: false`` verdict values near 1e308 are legal; the engine's
finiteness check turns an inf or nan reward into a cohort failure (docs/scoring.md section 7),
so these return inf or nan instead of raising OverflowError or ValueError. Pure.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["log_sigmoid", "safe_fsum", "sigmoid", "square"]


def safe_fsum(values: Sequence[float]) -> float:
    """``math.fsum``, but ±inf or nan instead of an error when a partial sum overflows.

    fsum raises OverflowError on an intermediate overflow and ValueError on ``inf + -inf``;
    plain summation then gives the inf or nan. Every sum fsum can do keeps fsum's exact result.
    """
    try:
        return math.fsum(values)
    except OverflowError:
        return sum(values, 0.0)
    except ValueError:
        return math.nan


def square(x: float) -> float:
    """``x ** 2``, inf instead of OverflowError when it does not fit a double."""
    try:
        return x**2
    except OverflowError:
        return math.inf


def sigmoid(x: float) -> float:
    """The logistic function ``1 / (1 + e^-x)``, evaluated on the side where ``exp`` cannot
    overflow (so it is exact to rounding for every finite x and never raises); nan stays nan."""
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    e = math.exp(x)
    return e / (1.0 + e)


def log_sigmoid(x: float) -> float:
    """``log σ(x) = -log(1 + e^-x)`` without overflow or cancellation: ``-log1p(e^-x)`` for
    x ≥ 0, ``x - log1p(e^x)`` below; nan stays nan."""
    if x >= 0:
        return -math.log1p(math.exp(-x))
    return x - math.log1p(math.exp(x))
