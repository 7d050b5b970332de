"""The penalised Bradley–Terry fit of a comparison graph (docs/scoring.md, "Bradley–Terry").

Pure. Given, for each judged pair of vertices {a, b}, the number of observations and the sum of
their outcomes y ∈ [0, 1] from a's side (y = 1: a clearly better), θ maximises

    F(θ) = Σ_obs [y·log σ(θ_a − θ_b) + (1 − y)·log σ(θ_b − θ_a)] − (λ/2)·Σ_v θ_v²

The solver is Newton's method with a backtracking (Armijo) line search, each step solving
(L + λI)·δ = ∇F by a Cholesky factorisation kept inside the matrix's envelope. Why this solver:

- F is strictly concave: each observation contributes −σ(d)σ(−d)·(e_a − e_b)(e_a − e_b)ᵀ to the
  Hessian whatever y is, so the Hessian is −(L + λI) with L a weighted graph Laplacian (positive
  semi-definite) and λ > 0. There is exactly one maximiser, and L + λI is symmetric positive
  definite, so Cholesky always succeeds (no pivoting, no regularisation tricks).
- Newton converges quadratically near the maximiser: 4–8 steps from θ = 0 for the groups this
  service sees; the line search makes it globally convergent (the full step is taken whenever
  it increases F enough, which is nearly always; once the Newton decrement gᵀ(L + λI)⁻¹g is
  below 1e-4, F is within about half of that of its maximum and full steps are taken without
  the search, whose comparisons of F would drown in F's rounding). Minorise–maximise (the
  classic BT iteration) and gradient ascent converge linearly, slowest on weakly connected
  graphs such as a ring.
- A group has N ≤ a few hundred vertices. The envelope of a circular graph is two entries a
  row plus one full row, so a step is O(N) there (a fixed-baseline star likewise); all_pairs is
  dense, O(N³/3) a step, so pure Python is fast enough at these sizes (docs/benchmarks.md,
  "Small costs behind code choices"); numpy is not a runtime dependency of this service and
  nothing here needs it.

It stops when every component of the gradient ∇F is within 1e-9 of zero (the optimality
condition; F being λ-strongly concave, θ is then within ‖∇F‖₂/λ of the maximiser), or when a
step no longer changes θ in double precision. Verdicts whose arithmetic overflows doubles (only
unvalidated ones, `validate_verdict_range: false`, far outside [1, 6]) give nan θ, which the
engine's finiteness check turns into a group failure; a fit that does not converge in 100 steps
(never seen) raises ValueError rather than return an inexact reward.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from operator import mul
from typing import Final, final

from genrm_trio.domain.scoring.numeric import log_sigmoid

__all__ = [
    "GRADIENT_TOLERANCE",
    "MAX_NEWTON_STEPS",
    "BradleyTerryFit",
    "PairObservations",
    "fit_bradley_terry",
    "log_likelihood",
]

GRADIENT_TOLERANCE: Final = 1e-9
MAX_NEWTON_STEPS: Final = 100
_ARMIJO: Final = 1e-4  # sufficient-increase constant of the line search
_MIN_STEP: Final = 2.0**-40  # a step halved this far no longer moves θ in doubles
# Newton decrement² gᵀ(L + λI)⁻¹g below which full steps are taken (F* − F ≈ half of it)
_PURE_NEWTON: Final = 1e-4


@final
@dataclass(frozen=True, slots=True)
class PairObservations:
    """Every observation of one pair of vertices ``a != b``: how many, and Σ y from a's side."""

    a: int
    b: int
    count: int
    wins_a: float


@final
@dataclass(frozen=True, slots=True)
class BradleyTerryFit:
    """The maximiser θ (one per vertex), the log-likelihood Σ_obs at θ (without the prior
    term), the number of observations and the Newton steps taken."""

    theta: list[float]
    log_likelihood: float
    observations: int
    newton_steps: int


def log_likelihood(theta: Sequence[float], pairs: Sequence[PairObservations]) -> float:
    """Σ_obs [y·log σ(θ_a − θ_b) + (1 − y)·log σ(θ_b − θ_a)], summed per pair."""
    total = 0.0
    for p in pairs:
        d = theta[p.a] - theta[p.b]
        total += p.wins_a * log_sigmoid(d) + (p.count - p.wins_a) * log_sigmoid(-d)
    return total


def _objective(theta: Sequence[float], pairs: Sequence[PairObservations], prior: float) -> float:
    return log_likelihood(theta, pairs) - 0.5 * prior * sum(t * t for t in theta)


def _envelope(vertices: int, pairs: Sequence[PairObservations]) -> list[int]:
    """For each row v of the Hessian, the first column with an entry: the lowest neighbour
    below v (v itself without one). Cholesky fills in only inside this envelope."""
    first = list(range(vertices))
    for p in pairs:
        low, high = (p.a, p.b) if p.a < p.b else (p.b, p.a)
        first[high] = min(first[high], low)
    return first


def _derivatives(
    theta: Sequence[float], pairs: Sequence[PairObservations], prior: float, first: Sequence[int]
) -> tuple[list[float], list[list[float]]]:
    """∇F, and the lower triangle of −∇²F = L + λI inside the envelope (L the Laplacian weighted
    by count·σ(d)σ(−d)): ``rows[v][u - first[v]]`` is entry (v, u), the diagonal last. One
    ``exp`` per pair: with e = e^−|d|, σ(|d|) = 1/(1 + e) and σ(d)σ(−d) = e/(1 + e)²."""
    grad = [-prior * t for t in theta]
    rows = [[0.0] * (v - first[v]) + [prior] for v in range(len(theta))]
    for p in pairs:
        d = theta[p.a] - theta[p.b]
        e = math.exp(-abs(d))
        s = 1.0 / (1.0 + e)
        g = p.wins_a - p.count * (s if d >= 0 else e * s)  # y − σ(d), summed
        grad[p.a] += g
        grad[p.b] -= g
        w = p.count * e * s * s
        low, high = (p.a, p.b) if p.a < p.b else (p.b, p.a)
        rows[low][-1] += w
        rows[high][-1] += w
        rows[high][low - first[high]] -= w
    return grad, rows


def _cholesky_solve(
    rows: list[list[float]], first: Sequence[int], b: Sequence[float]
) -> list[float]:
    """x with A·x = b, A symmetric positive definite given by its envelope ``rows``
    (`_derivatives`): the lower factor L (its entries stay inside the envelope), then
    L z = b and Lᵀ x = z. A circular graph's envelope is two entries a row plus one full row,
    so this is O(N) there and the dense O(N³/3) only for all_pairs. A non-positive pivot (only
    from nan or inf entries) gives nan."""
    n = len(b)
    low: list[list[float]] = []  # low[i][j - first[i]] = L[i][j]
    for i in range(n):
        fi = first[i]
        row = rows[i]
        li = [0.0] * (i - fi + 1)
        for j in range(fi, i):
            lj, fj = low[j], first[j]
            k0 = max(fi, fj)
            dot = sum(map(mul, li[k0 - fi : j - fi], lj[k0 - fj : j - fj]))
            li[j - fi] = (row[j - fi] - dot) / lj[-1]
        pivot = row[-1] - sum(map(mul, li[:-1], li[:-1]))
        if not pivot > 0:
            return [math.nan] * n
        li[-1] = math.sqrt(pivot)
        low.append(li)
    z = [0.0] * n
    for i in range(n):
        fi, li = first[i], low[i]
        z[i] = (b[i] - sum(map(mul, li[:-1], z[fi:i]))) / li[-1]
    x = z  # Lᵀ x = z, column by column from the last
    for i in range(n - 1, -1, -1):
        fi, li = first[i], low[i]
        x[i] /= li[-1]
        xi = x[i]
        for k in range(fi, i):
            x[k] -= li[k - fi] * xi
    return x


def _nan_fit(n: int, pairs: Sequence[PairObservations], steps: int) -> BradleyTerryFit:
    return BradleyTerryFit([math.nan] * n, math.nan, sum(p.count for p in pairs), steps)


def fit_bradley_terry(
    vertices: int, pairs: Sequence[PairObservations], prior: float
) -> BradleyTerryFit:
    """θ maximising F over ``vertices`` vertices (module docstring), from θ = 0.

    A vertex without observations keeps θ = 0 (the prior alone). Verdicts that overflow the
    arithmetic give nan θ (the engine's finiteness check then fails the group), never an
    exception; ValueError only when 100 Newton steps did not converge.
    """
    if not (math.isfinite(prior) and prior > 0):
        raise ValueError(f"bradley_terry_prior must be finite and > 0, got {prior!r}")
    for p in pairs:
        if not (0 <= p.a < vertices and 0 <= p.b < vertices and p.a != p.b):
            raise ValueError(f"bad pair {p.a}-{p.b} for {vertices} vertices")
    first = _envelope(vertices, pairs)
    theta = [0.0] * vertices
    value: float | None = None  # F(θ), evaluated only when a line search needs it
    for step in range(MAX_NEWTON_STEPS + 1):
        grad, rows = _derivatives(theta, pairs, prior, first)
        if not all(math.isfinite(g) for g in grad):
            return _nan_fit(vertices, pairs, step)
        if max(map(abs, grad), default=0.0) <= GRADIENT_TOLERANCE:
            break
        if step == MAX_NEWTON_STEPS:
            raise ValueError(
                f"GenRM Bradley–Terry fit did not converge in {MAX_NEWTON_STEPS} Newton steps"
            )
        delta = _cholesky_solve(rows, first, grad)
        slope = sum(map(mul, grad, delta))  # gᵀ(L + λI)⁻¹g > 0: an ascent direction
        if not math.isfinite(slope):
            return _nan_fit(vertices, pairs, step)
        if not slope > 0:
            break  # rounding ate the direction: θ is as exact as doubles allow
        if slope > _PURE_NEWTON:
            if value is None:
                value = _objective(theta, pairs, prior)
            t = 1.0
            while True:
                candidate = [th + t * d for th, d in zip(theta, delta, strict=True)]
                new_value = _objective(candidate, pairs, prior)
                if new_value >= value + _ARMIJO * t * slope:
                    break
                t *= 0.5
                if t < _MIN_STEP:  # no step increases F in doubles: absurd unvalidated verdicts
                    return _nan_fit(vertices, pairs, step)
            value = new_value
        else:
            # F is within about slope/2 of its maximum: the full step converges quadratically,
            # and F's own rounding (1e-16·|F|) would make a line search on it meaningless
            candidate = [th + d for th, d in zip(theta, delta, strict=True)]
            value = None
        if candidate == theta:
            break  # θ is as exact as doubles allow
        theta = candidate
    return BradleyTerryFit(theta, log_likelihood(theta, pairs), sum(p.count for p in pairs), step)
