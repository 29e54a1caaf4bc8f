"""Baselines with exact distances: k-means++ (seeding + Lloyd) on coordinates and k-medoids on a metric.

They see what the R-model algorithm never does (the distances), so they are the yardstick for its cost.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..errors import InputError


def kmeans_pp(points: np.ndarray, k: int, seed: int = 0, n_init: int = 4, iterations: int = 100) -> np.ndarray:
    """(k, dim) centres: k-means++ seeding then Lloyd's iterations, the best of ``n_init`` starts by k-means cost."""
    x = np.asarray(points, dtype=np.float64)
    if x.ndim != 2 or not 1 <= k <= x.shape[0]:
        raise InputError("k", f"an integer in [1, {x.shape[0] if x.ndim == 2 else 0}] for (n, dim) points", k)
    rng = np.random.default_rng(seed)
    best, best_cost = None, np.inf
    for _ in range(n_init):
        centres = [x[rng.integers(x.shape[0])]]
        d2 = np.sum((x - centres[0]) ** 2, axis=1)
        for _ in range(1, k):
            centres.append(x[rng.choice(x.shape[0], p=d2 / d2.sum())] if d2.sum() > 0 else x[rng.integers(x.shape[0])])
            d2 = np.minimum(d2, np.sum((x - centres[-1]) ** 2, axis=1))
        c = np.array(centres)
        for _ in range(iterations):
            label = np.argmin(_sq_dists(x, c), axis=1)
            new = np.array([x[label == j].mean(0) if np.any(label == j) else c[j] for j in range(k)])
            if np.allclose(new, c):
                break
            c = new
        cost = float(np.min(_sq_dists(x, c), axis=1).sum())
        if cost < best_cost:
            best, best_cost = c, cost
    assert best is not None
    return best


def _sq_dists(x: np.ndarray, c: np.ndarray) -> np.ndarray:
    """(n, k) squared Euclidean distances."""
    return np.maximum(np.sum(x**2, 1)[:, None] - 2 * x @ c.T + np.sum(c**2, 1)[None, :], 0.0)


def kmedoids(distance: Callable[[np.ndarray, np.ndarray], np.ndarray], n: int, k: int, p: float = 2.0, seed: int = 0,
             iterations: int = 30, n_init: int = 4) -> np.ndarray:
    """(k,) medoid item indices: k-means++-style seeding and alternating (Voronoi) medoid updates on d^p, the best
    of ``n_init`` starts."""
    if not 1 <= k <= n:
        raise InputError("k", f"an integer in [1, {n}]", k)
    rng = np.random.default_rng(seed)
    i, j = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    cost = distance(i.ravel(), j.ravel()).reshape(n, n) ** p
    best, best_cost = None, np.inf
    for _ in range(n_init):
        medoids = _voronoi_medoids(cost, _seeds(cost, k, rng), iterations)
        total = float(cost[:, medoids].min(1).sum())
        if total < best_cost:
            best, best_cost = medoids, total
    assert best is not None
    return best


def _seeds(cost: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """k rows by D^p sampling (k-means++ seeding on a cost matrix)."""
    n = cost.shape[0]
    chosen = [int(rng.integers(n))]
    nearest = cost[:, chosen[0]].copy()
    for _ in range(1, k):
        chosen.append(int(rng.choice(n, p=nearest / nearest.sum())) if nearest.sum() > 0 else int(rng.integers(n)))
        nearest = np.minimum(nearest, cost[:, chosen[-1]])
    return np.array(chosen)


def _voronoi_medoids(cost: np.ndarray, medoids: np.ndarray, iterations: int) -> np.ndarray:
    """Alternate: assign to the nearest medoid, move each medoid to its cluster's cheapest member."""
    for _ in range(iterations):
        label = np.argmin(cost[:, medoids], axis=1)
        new = medoids.copy()
        for cluster in range(medoids.size):
            members = np.nonzero(label == cluster)[0]
            if members.size:
                new[cluster] = members[np.argmin(cost[np.ix_(members, members)].sum(1))]
        if np.array_equal(new, medoids):
            break
        medoids = new
    return medoids


def cost_to_centres(distance: Callable[[np.ndarray, np.ndarray], np.ndarray], n: int, centres: np.ndarray,
                    p: float = 2.0) -> float:
    """sum_v min_c d(v, c)^p over item-index centres."""
    v = np.repeat(np.arange(n), centres.size)
    c = np.tile(centres, n)
    return float(np.sum(distance(v, c).reshape(n, centres.size).min(1) ** p))


def kmeans_cost(points: np.ndarray, centres: np.ndarray) -> float:
    """sum_v min_c |v - c|^2 for coordinate centres (the k-means objective, p = 2)."""
    return float(np.min(_sq_dists(np.asarray(points, dtype=np.float64), np.asarray(centres, dtype=np.float64)), 1).sum())
