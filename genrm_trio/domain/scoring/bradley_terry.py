"""The penalised Bradley–Terry fit of a comparison graph (docs/scoring.md, "Bradley–Terry").

Pure. Given, for each judged pair of vertices {a, b}, the number of observations and the sum of
their outcomes y ∈ [0, 1] from a's side (y = 1: a clearly better), θ maximises

    F(θ) = Σ_obs [y·log σ(θ_a − θ_b) + (1 − y)·log σ(θ_b − θ_a)] − (λ/2)·Σ_v θ_v²

The solver is Newton's method with a backtracking (Armijo) line search, each step solving
(L + λI)·δ = ∇F either by a Cholesky factorisation kept inside the matrix's envelope or by
preconditioned conjugate gradients, whichever the cost model (`_cholesky_cost`, `_cg_cost`)
finds cheaper for the graph. Why this solver:

- F is strictly concave: each observation contributes −σ(d)σ(−d)·(e_a − e_b)(e_a − e_b)ᵀ to the
  Hessian whatever y is, so the Hessian is −(L + λI) with L a weighted graph Laplacian (positive
  semi-definite) and λ > 0. There is exactly one maximiser, and L + λI is symmetric positive
  definite, so Cholesky always succeeds (no pivoting, no regularisation tricks) and conjugate
  gradients converge.
- Newton converges quadratically near the maximiser: 4–8 steps from θ = 0 for the groups this
  service sees; the line search makes it globally convergent (the full step is taken whenever
  it increases F enough, which is nearly always; once the Newton decrement gᵀ(L + λI)⁻¹g is
  below 1e-4, F is within about half of that of its maximum and full steps are taken without
  the search, whose comparisons of F would drown in F's rounding). Minorise–maximise (the
  classic BT iteration) and gradient ascent converge linearly, slowest on weakly connected
  graphs such as a ring.
- The envelope of a circular graph is two entries a row plus one full row, so a Cholesky step
  is O(N) there (a fixed-baseline star likewise), and small groups are cheap either way. A
  regular graph's spread offsets fill the envelope (O(N³) like all_pairs), so large regular and
  all_pairs groups take conjugate gradients instead: O(pairs) per product with the pair list,
  or N² in C with dense rows, and few products, because λ bounds the smallest eigenvalue and
  the diagonal preconditioner evens out the degrees. The two agree to ~1e-15 in θ. numpy is
  not a runtime dependency of this service and nothing here needs it; a large group's whole
  scoring runs in a worker thread (docs/architecture.md, "Scoring off the loop").

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
_CG_RESIDUAL: Final = 1e-12  # ‖(L + λI)x − b‖₂ / ‖b‖₂ at which a CG solve stops
_CG_MAX_ITERATIONS_PER_VERTEX: Final = 4  # a safety bound: exact arithmetic needs ≤ N
_CG_DENSE_WEIGHT: Final = 10  # `_cg_cost`'s weights, from measured fits
_CG_SPARSE_WEIGHT: Final = 200


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
    theta: Sequence[float], pairs: Sequence[PairObservations], prior: float
) -> tuple[list[float], list[float], list[float]]:
    """∇F, the diagonal of −∇²F = L + λI, and each pair's weight count·σ(d)σ(−d) (its
    off-diagonal entry, negated). One ``exp`` per pair: with e = e^−|d|, σ(|d|) = 1/(1 + e) and
    σ(d)σ(−d) = e/(1 + e)²."""
    grad = [-prior * t for t in theta]
    diagonal = [prior] * len(theta)
    weights: list[float] = []
    for p in pairs:
        d = theta[p.a] - theta[p.b]
        e = math.exp(-abs(d))
        s = 1.0 / (1.0 + e)
        g = p.wins_a - p.count * (s if d >= 0 else e * s)  # y − σ(d), summed
        grad[p.a] += g
        grad[p.b] -= g
        w = p.count * e * s * s
        low, high = (p.a, p.b) if p.a < p.b else (p.b, p.a)
        diagonal[low] += w
        diagonal[high] += w
        weights.append(w)
    return grad, diagonal, weights


def _envelope_rows(
    diagonal: Sequence[float],
    pairs: Sequence[PairObservations],
    weights: Sequence[float],
    first: Sequence[int],
) -> list[list[float]]:
    """The lower triangle of L + λI inside the envelope: ``rows[v][u - first[v]]`` is entry
    (v, u), the diagonal last."""
    rows = [[0.0] * (v - first[v]) + [diagonal[v]] for v in range(len(diagonal))]
    for p, w in zip(pairs, weights, strict=True):
        low, high = (p.a, p.b) if p.a < p.b else (p.b, p.a)
        rows[high][low - first[high]] -= w
    return rows


def _cholesky_cost(first: Sequence[int]) -> int:
    """About the multiply-adds of the envelope Cholesky factorisation: Σ_v (envelope row)²/2."""
    return sum((v - f) * (v - f) for v, f in enumerate(first)) // 2


def _cg_cost(vertices: int, pairs: int) -> int:
    """About the cost of a conjugate-gradient solve in the Cholesky's units (a multiply-add in
    C): a weight times the work of one product with the matrix, N² for dense rows, N + 2·pairs
    Python-level steps for the pair list (`_cg_solve`). The weights are fitted to measured fits
    (docs/benchmarks.md, "Scoring at scale"): CG wins from all_pairs N = 64 and regular
    d = 8 N = 128 up, the Cholesky below and on circular and fixed-baseline graphs."""
    if _dense(vertices, pairs):
        return _CG_DENSE_WEIGHT * vertices * vertices
    return _CG_SPARSE_WEIGHT * (vertices + 2 * pairs)


def _dense(vertices: int, pairs: int) -> bool:
    """CG's products use dense rows when more than an eighth of all pairs are present."""
    return pairs * 8 > vertices * (vertices - 1) // 2


def _cg_solve(
    diagonal: Sequence[float],
    pairs: Sequence[PairObservations],
    weights: Sequence[float],
    b: Sequence[float],
) -> list[float]:
    """x with (L + λI)·x = b by conjugate gradients with the diagonal as preconditioner, to a
    residual of `_CG_RESIDUAL` relative to b (absolute floor 1e-15). The matrix is used through
    its products only: the pair list (sparse graphs), or dense rows when more than an eighth of
    all pairs are present (the products then run in C, `sum(map(mul, ...))`). L + λI is
    symmetric positive definite with eigenvalues in [λ, λ + 2·max weighted degree], so CG
    converges; x from 0 keeps bᵀx > 0, an ascent direction for Newton."""
    n = len(b)
    if not all(math.isfinite(v) and v > 0 for v in diagonal):
        return [math.nan] * n
    if _dense(n, len(pairs)):
        matrix = [[0.0] * n for _ in range(n)]
        for v in range(n):
            matrix[v][v] = diagonal[v]
        for p, w in zip(pairs, weights, strict=True):
            matrix[p.a][p.b] -= w
            matrix[p.b][p.a] -= w

        def product(x: Sequence[float]) -> list[float]:
            return [sum(map(mul, row, x)) for row in matrix]

    else:
        ends = [(p.a, p.b, w) for p, w in zip(pairs, weights, strict=True)]

        def product(x: Sequence[float]) -> list[float]:
            y = list(map(mul, diagonal, x))
            for a, c, w in ends:
                y[a] -= w * x[c]
                y[c] -= w * x[a]
            return y

    inverse = [1.0 / v for v in diagonal]
    x = [0.0] * n
    r = list(b)
    z = list(map(mul, inverse, r))
    direction = list(z)
    rz = sum(map(mul, r, z))
    limit = max(_CG_RESIDUAL * math.sqrt(sum(map(mul, b, b))), 1e-15)
    for _ in range(_CG_MAX_ITERATIONS_PER_VERTEX * n + 10):
        if math.sqrt(sum(map(mul, r, r))) <= limit:
            break
        q = product(direction)
        curvature = sum(map(mul, direction, q))
        if not (math.isfinite(curvature) and curvature > 0):
            return [math.nan] * n
        alpha = rz / curvature
        x = [xi + alpha * di for xi, di in zip(x, direction, strict=True)]
        r = [ri - alpha * qi for ri, qi in zip(r, q, strict=True)]
        z = list(map(mul, inverse, r))
        rz_next = sum(map(mul, r, z))
        beta = rz_next / rz
        rz = rz_next
        direction = [zi + beta * di for zi, di in zip(z, direction, strict=True)]
    return x


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
    # the envelope Cholesky where its fill is small (circular, fixed baseline, small groups),
    # conjugate gradients where it is not (all_pairs and regular graphs at large N)
    direct = _cholesky_cost(first) <= _cg_cost(vertices, len(pairs))
    theta = [0.0] * vertices
    value: float | None = None  # F(θ), evaluated only when a line search needs it
    for step in range(MAX_NEWTON_STEPS + 1):
        grad, diagonal, weights = _derivatives(theta, pairs, prior)
        if not all(math.isfinite(g) for g in grad):
            return _nan_fit(vertices, pairs, step)
        if max(map(abs, grad), default=0.0) <= GRADIENT_TOLERANCE:
            break
        if step == MAX_NEWTON_STEPS:
            raise ValueError(
                f"GenRM Bradley–Terry fit did not converge in {MAX_NEWTON_STEPS} Newton steps"
            )
        if direct:
            delta = _cholesky_solve(_envelope_rows(diagonal, pairs, weights, first), first, grad)
        else:
            delta = _cg_solve(diagonal, pairs, weights, grad)
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
