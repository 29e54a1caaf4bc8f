"""Regret-matching solvers for two-player zero-sum normal-form games: RM+, PRM+, SPRM+ and MI-SPRM+.

The game is a payoff matrix ``A`` (m x n) for the row player, who maximizes ``x^T A y``; the column player
minimizes it (nashpy's convention with ``B = -A``). Each player runs a regret minimizer on its loss vector
(row: ``-A y``, column: ``A^T x``) with the instantaneous regret ``F = <l, x> 1 - l``:

- RM+:   theta <- [theta + F]+, strategy theta / |theta|_1; uniform average.
- PRM+:  predictive: play [theta_hat + m]+ with the prediction m = last F; uniform average.
- SPRM+: PRM+ on the chopped orthant D_R = {theta >= 0, |theta|_1 >= R} with R = 1 and step size eta
  (Farina, Grand-Clement, Kroer, Lee, Luo, NeurIPS 2023); O(1/T) only for eta small enough, so eta is tuned.
- MI-SPRM+: eta = 1 and the adaptive regret domain: the floor R_t (one for both players) grows by one whenever
  ``|F^t - F^{t-1}|^2 - (B(th^t, theta^{t-1}) + B(th^t, theta^t)) / 2 > 0`` with ``B(a, b) = |a - b|^2 / 2``;
  the output is the R_t-weighted average (Meng, Zhang, Yang, Li, Ding, Gao, *A Faster Parameter-Free Regret
  Matching Algorithm*, ICLR 2026; the update equations as ../shared/specs/other_seeds.md §4.1 reads them).

Updates are simultaneous (both players see the other's current strategy) or alternating (the row player moves
first, the column player answers the new row strategy). The duality gap of the averaged strategies,
``max_i (A y)_i - min_j (x^T A)_j``, is recorded at the requested iterations.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from ..errors import InputError

Algorithm = Literal["rm+", "prm+", "sprm+", "mi-sprm+"]
ALGORITHMS: tuple[str, ...] = ("rm+", "prm+", "sprm+", "mi-sprm+")


@dataclass
class Solution:
    """What a solver returns: the averaged strategies, their duality gap curve and (MI-SPRM+) the final floor."""

    algorithm: str
    x: np.ndarray  # (m,) averaged row strategy
    y: np.ndarray  # (n,) averaged column strategy
    iterations: list[int] = field(default_factory=list)  # where the gap was recorded
    gaps: list[float] = field(default_factory=list)  # duality gap of the averages at those iterations
    floor: float = 0.0  # the regret-domain floor R at the end (0 for RM+ / PRM+)
    floor_raises: int = 0  # how often MI-SPRM+ raised the floor

    @property
    def gap(self) -> float:
        """The duality gap of the final averaged strategies."""
        return self.gaps[-1]

    def to_dict(self) -> dict:
        return {"algorithm": self.algorithm, "x": self.x.tolist(), "y": self.y.tolist(), "gap": self.gap,
                "iterations": self.iterations, "gaps": self.gaps, "floor": self.floor,
                "floor_raises": self.floor_raises}


def duality_gap(A: np.ndarray, x: np.ndarray, y: np.ndarray) -> float:
    """``max_i (A y)_i - min_j (x^T A)_j``: zero exactly at a Nash equilibrium of the zero-sum game ``A``."""
    return float(np.max(A @ y) - np.min(x @ A))


def project_simplex(v: np.ndarray, z: float) -> np.ndarray:
    """Euclidean projection of ``v`` onto the scaled simplex {theta >= 0, sum theta = z} (sort-based)."""
    u = np.sort(v)[::-1]
    css = np.cumsum(u) - z
    ind = np.arange(1, v.size + 1)
    rho = np.nonzero(u - css / ind > 0)[0][-1]
    return np.maximum(v - css[rho] / (rho + 1), 0.0)


def project_floor(v: np.ndarray, floor: float) -> np.ndarray:
    """Euclidean projection onto the chopped orthant D_R = {theta >= 0, |theta|_1 >= R} (R <= 0: the orthant)."""
    p = np.maximum(v, 0.0)
    if floor <= 0.0 or (math.fsum(p.tolist()) if p.size < 64 else p.sum()) >= floor:
        return p
    return project_simplex(v, floor)


def checkpoints(iterations: int, per_decade: int = 10) -> list[int]:
    """Iterations where the gap is recorded: about ``per_decade`` log-spaced points per decade, ending at T."""
    if iterations < 1:
        raise InputError("iterations", "an integer >= 1", iterations)
    points = np.unique(np.round(np.logspace(0, np.log10(iterations), max(2, int(per_decade * np.log10(iterations)) + 1))))
    return sorted({int(p) for p in points} | {iterations})


def check_payoff(A: object) -> np.ndarray:
    """A payoff matrix as a finite float64 (m, n) array with m, n >= 1; anything else is refused by name."""
    try:
        arr = np.asarray(A, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise InputError("payoff", "a 2-D array of numbers", type(A).__name__) from exc
    if arr.ndim != 2 or 0 in arr.shape:
        raise InputError("payoff", "a 2-D array with at least one row and one column", f"shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise InputError("payoff", "finite numbers", "NaN or infinity")
    return arr


def solve(A: object, algorithm: Algorithm = "mi-sprm+", iterations: int = 1000, *, eta: float = 0.1,
          alternating: bool = False, record: Sequence[int] | None = None) -> Solution:
    """Run one regret-matching algorithm on the zero-sum game ``A`` for ``iterations`` steps.

    Args:
        A: the row player's payoff matrix (m x n); the row player maximizes.
        algorithm: "rm+", "prm+", "sprm+" or "mi-sprm+".
        iterations: T, the number of updates.
        eta: SPRM+'s step size (RM+ is scale-invariant; PRM+ and MI-SPRM+ use 1).
        alternating: alternating instead of simultaneous updates.
        record: iterations at which to record the gap (default: ~10 log-spaced points per decade and T).

    Returns:
        A :class:`Solution` with the averaged strategies and their gap curve.

    Example:
        >>> sol = solve([[0, 1, -1], [-1, 0, 1], [1, -1, 0]], "mi-sprm+", 2000)
        >>> sol.gap < 1e-2
        True
    """
    A = check_payoff(A)
    if algorithm not in ALGORITHMS:
        raise InputError("algorithm", f"one of {list(ALGORITHMS)}", algorithm)
    if not isinstance(iterations, (int, np.integer)) or isinstance(iterations, bool) or iterations < 1:
        raise InputError("iterations", "an integer >= 1", iterations)
    if not np.isfinite(eta) or eta <= 0:
        raise InputError("eta", "a positive number", eta)
    marks = sorted({int(t) for t in (record if record is not None else checkpoints(iterations)) if 1 <= t <= iterations}
                   | {iterations})
    predictive = algorithm != "rm+"
    adaptive = algorithm == "mi-sprm+"
    floor = 1.0 if algorithm in ("sprm+", "mi-sprm+") else 0.0
    step = eta if algorithm == "sprm+" else 1.0
    m, n = A.shape
    AT = np.ascontiguousarray(A.T)
    hx = np.full(m, floor / m)  # theta_hat: the accumulated (projected) regrets
    hy = np.full(n, floor / n)
    px, py = np.zeros(m), np.zeros(n)  # predictions: the previous instantaneous regrets
    x_prev_theta, y_prev_theta = hx.copy(), hy.copy()  # theta^{t-1}, for MI-SPRM+'s criterion
    y = _normalize(hy)  # y^1: the column strategy the row player answers first when alternating
    sx, sy, weight = np.zeros(m), np.zeros(n), 0.0
    out = Solution(algorithm, np.full(m, 1.0 / m), np.full(n, 1.0 / n), floor=floor)
    k = 0
    for t in range(1, iterations + 1):
        tx = project_floor(hx + step * px, floor) if predictive else hx
        x = _normalize(tx)
        if not alternating:
            ty = project_floor(hy + step * py, floor) if predictive else hy
            y = _normalize(ty)
        w = floor if adaptive else 1.0  # MI-SPRM+ averages with weights R_t
        sx += w * x
        sy += w * y
        weight += w
        lx = -(A @ y)
        fx = (lx @ x) - lx
        hx_before = hx
        hx = project_floor(hx + step * fx, floor) if floor else np.maximum(hx + fx, 0.0)
        if alternating:  # the column player answers the row player's next strategy (Burch et al.'s alternation)
            x = _normalize(project_floor(hx + step * fx, floor) if predictive else hx)
            ty = project_floor(hy + step * py, floor) if predictive else hy
            y = _normalize(ty)
        ly = AT @ x
        fy = (ly @ y) - ly
        if adaptive:  # the adaptive regret domain: one floor R for both players, raised by one when the test fires
            change = _sq(fx - px) + _sq(fy - py)
            bregman = 0.25 * (_sq(hx_before - x_prev_theta) + _sq(hy - y_prev_theta) + _sq(hx_before - tx)
                              + _sq(hy - ty))
            x_prev_theta, y_prev_theta = tx, ty
        hy = project_floor(hy + step * fy, floor) if floor else np.maximum(hy + fy, 0.0)
        px, py = fx, fy
        if adaptive and change - bregman > 0:
            floor += 1.0
            out.floor_raises += 1
        if t == marks[k]:
            out.iterations.append(t)
            out.gaps.append(duality_gap(A, sx / weight, sy / weight))
            k += 1
    out.x, out.y, out.floor = sx / weight, sy / weight, floor
    return out


def _sq(v: np.ndarray) -> float:
    """|v|^2 (a dot product: far cheaper than np.sum on the small vectors of a game)."""
    return float(v @ v)


def _normalize(theta: np.ndarray) -> np.ndarray:
    """theta / |theta|_1, uniform where theta is all zero (RM+ before any positive regret)."""
    total = math.fsum(theta.tolist()) if theta.size < 64 else float(theta.sum())
    return theta / total if total > 0 else np.full(theta.size, 1.0 / theta.size)


def loglog_slope(iterations: Sequence[int], gaps: Sequence[float], lo: float, hi: float) -> float:
    """Least-squares slope of log(gap) against log(T) over the recorded T in [lo, hi] (-1 for an O(1/T) rate)."""
    t = np.asarray(iterations, dtype=float)
    g = np.asarray(gaps, dtype=float)
    keep = (t >= lo) & (t <= hi) & (g > 0)
    if keep.sum() < 2:
        raise InputError("iterations", f"at least two recorded points with a positive gap in [{lo:g}, {hi:g}]",
                         int(keep.sum()))
    return float(np.polyfit(np.log(t[keep]), np.log(g[keep]), 1)[0])
