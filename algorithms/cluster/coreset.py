"""k-clustering in the R-model: an O(k polylog n) centre set and a mapping, from a noisy quadruplet oracle only.

After Raychaudhury, Esmailpour, Galhotra, Sintos, *Metric k-clustering using only Weak Comparison Oracles*,
ICLR 2026 (arXiv 2601.19333), ALG-G, as far as the paper's abstract, reviews and summaries give it
(../shared/specs/other_seeds.md §1.2; the appendix and the constants were not available):

    V_0 = V
    round i, while V_i is not empty:
        sample S_i (sample_factor * k * ln n centres) from V_i; they map to themselves
        KERNEL(s) for each s in S_i: the kernel_factor * ln n points nearest s among a pool drawn from V_i,
            found by counting wins of distinct comparisons (a PROBSORT stand-in)
        ALG-TESTER: d(x1, c1) <= d(x2, c2)? by a majority over distinct questions d(x1, k1) <= d(x2, k2),
            k1 in KERNEL(c1) (c1 itself included), k2 in KERNEL(c2): persistent noise cannot repeat itself
            across distinct questions, so the vote beats phi; proxies are good when d(x, c) exceeds the
            kernel radius, i.e. the tester emulates an adversarial oracle with mu ~ 1
        every other point of V_i: its approximate nearest centre in S_i (a scan of S_i with the tester)
        rank those points by d(v, centre(v)) by counting wins against reference_factor * ln n reference points
            (PCOUNT against a guard set); map the closest remove_fraction to their centres, remove them
        V_{i+1} = the rest
    centres C = the union of the S_i (an alpha-Coreset+), mapping M = the recorded assignments

Deviations, stated: the paper's PROBSORT (Geissmann et al.) and ADVSORT are replaced by win counting, which has
no O(log m) dislocation guarantee; sample sizes use one power of ln n where the paper's are Θ(k log² n) and
Θ(k log³ n) with unknown constants; the nearest centre is a tester scan, not ADVSORT. Every constant is a field
of :class:`CoresetConfig`. ``trust=True`` is the paper's baseline: the same skeleton, every answer believed
(one direct question per comparison, no kernels).

The final exactly-k centres (:func:`reduce_to_k`) come, as in the paper's experiments, from weighted k-means++
seeding and k-medoid swaps on the coreset with *exact* distances: that step is not part of the R-model algorithm.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from veil.config import Config, ConfigError, field

from ..errors import InputError
from .oracles import CountingOracle, QuadrupletOracle


@dataclass
class CoresetConfig(Config):
    """The constants of the R-model coreset (the paper leaves them as Θ(.)); defaults calibrated on 2-D blobs."""

    sample_factor: float = field(1.0, "centres sampled per round: ceil(sample_factor * k * ln n)")
    kernel_factor: float = field(1.0, "kernel size per centre: ceil(kernel_factor * ln n) points")
    pool_factor: float = field(3.0, "candidate pool for the kernels: ceil(pool_factor * k * kernel size) points")
    votes: int = field(11, "distinct questions per tester decision (odd; the direct question is one of them)")
    reference_factor: float = field(2.0, "reference points per round for ranking: ceil(reference_factor * ln n)")
    remove_fraction: float = field(0.5, "fraction of a round's points mapped (and removed) per round")
    max_rounds: int = field(64, "the last round maps every remaining point")
    trust: bool = field(False, "the trust-every-answer baseline: one direct question per comparison, no kernels")
    seed: int = field(0, "seed of the sampling")

    def validate(self) -> None:
        for name in ("sample_factor", "kernel_factor", "pool_factor", "reference_factor"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"CoresetConfig.{name}: expected a positive number, received {getattr(self, name)}")
        if self.votes < 1 or self.votes % 2 == 0:
            raise ConfigError(f"CoresetConfig.votes: expected an odd integer >= 1, received {self.votes}")
        if not 0.0 < self.remove_fraction < 1.0:
            raise ConfigError(f"CoresetConfig.remove_fraction: expected a number in (0, 1), received {self.remove_fraction}")
        if self.max_rounds < 1:
            raise ConfigError(f"CoresetConfig.max_rounds: expected an integer >= 1, received {self.max_rounds}")


@dataclass
class Coreset:
    """An alpha-Coreset+: centres (item indices), the mapping of every item to one of them, and its cost in queries."""

    centers: np.ndarray  # (c,) item indices
    mapping: np.ndarray  # (n,) item index of each item's centre (a centre maps to itself)
    rounds: int
    queries: int | None  # distinct oracle questions (None when the oracle does not count them)

    @property
    def weights(self) -> np.ndarray:
        """(c,) how many items map to each centre."""
        return np.array([np.count_nonzero(self.mapping == c) for c in self.centers])


def rank_model_coreset(oracle: QuadrupletOracle, k: int, config: CoresetConfig | None = None,
                       progress: Callable[[int, int], None] | None = None) -> Coreset:
    """Centres and a mapping whose k-clustering cost is within a constant of the optimum (w.h.p., per the paper).

    Args:
        oracle: answers "is d(a, b) <= d(c, d)?" over items 0..n-1; wrap it in :class:`CountingOracle` to count.
        k: the number of clusters the coreset is for.
        config: the constants (:class:`CoresetConfig`).
        progress: called as ``progress(round, points_left)`` at the start of every round.

    Returns:
        The :class:`Coreset` (``queries`` filled in when ``oracle`` is a :class:`CountingOracle`).

    Example:
        >>> import numpy as np
        >>> from veil.algorithms.cluster import CountingOracle, ExactOracle, PersistentNoisyOracle
        >>> pts = np.random.default_rng(0).normal(size=(200, 2))
        >>> oracle = CountingOracle(PersistentNoisyOracle(ExactOracle(pts), phi=0.1))
        >>> coreset = rank_model_coreset(oracle, k=3)
        >>> coreset.mapping.shape, oracle.queries == coreset.queries
        ((200,), True)
    """
    config = config or CoresetConfig()
    n = oracle.n
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 1 <= k <= n:
        raise InputError("k", f"an integer in [1, {n}]", k)
    rng = np.random.default_rng(config.seed)
    log_n = max(math.log(n), 1.0)
    n_sample = math.ceil(config.sample_factor * k * log_n)
    n_kernel = 0 if config.trust else math.ceil(config.kernel_factor * log_n)
    n_refs = math.ceil(config.reference_factor * log_n)
    votes = 1 if config.trust else config.votes
    start = oracle.queries if isinstance(oracle, CountingOracle) else None
    mapping = np.full(n, -1, dtype=np.int64)
    centers: list[np.ndarray] = []
    remaining = np.arange(n)
    rounds = 0
    while remaining.size:
        rounds += 1
        if progress is not None:
            progress(rounds, int(remaining.size))
        if remaining.size <= n_sample:  # the last few points open centres of their own
            mapping[remaining] = remaining
            centers.append(remaining)
            break
        sample = rng.choice(remaining, n_sample, replace=False)
        mapping[sample] = sample
        centers.append(sample)
        rest = np.setdiff1d(remaining, sample)
        tester = Tester(oracle, sample, kernels(oracle, sample, rest, n_kernel, config.pool_factor * k, rng), votes)
        centre = tester.nearest(rest, rng)  # (|rest|,) positions in `sample`
        if rounds == config.max_rounds:
            mapping[rest] = sample[centre]
            break
        score = tester.closeness(rest, centre, rng.choice(rest.size, min(n_refs, rest.size), replace=False))
        order = np.lexsort((rng.random(rest.size), -score))  # most wins (closest) first, ties at random
        done = order[: max(1, math.ceil(config.remove_fraction * rest.size))]
        mapping[rest[done]] = sample[centre[done]]
        remaining = np.delete(rest, done)
    queries = None if start is None else oracle.queries - start
    return Coreset(np.concatenate(centers), mapping, rounds, queries)


def kernels(oracle: QuadrupletOracle, sample: np.ndarray, candidates: np.ndarray, size: int, pool_factor: float,
            rng: np.random.Generator) -> np.ndarray:
    """(|sample|, size) KERNEL of each centre: the ``size`` candidates nearest it, by counting wins.

    A pool of ``pool_factor * size`` candidates is ranked for each centre s by how many of ``size`` reference pool
    points it beats ("d(s, u) <= d(s, r)?", distinct questions); the best ``2 * size`` are then ranked by all
    their pairwise comparisons and the best ``size`` kept."""
    if size == 0:
        return np.zeros((sample.size, 0), dtype=np.int64)
    pool = rng.choice(candidates, min(candidates.size, math.ceil(pool_factor * size)), replace=False)
    size = min(size, pool.size)
    refs = pool[rng.choice(pool.size, min(size, pool.size), replace=False)]
    s = np.repeat(sample, pool.size * refs.size)
    u = np.tile(np.repeat(pool, refs.size), sample.size)
    r = np.tile(refs, sample.size * pool.size)
    wins = oracle.le_many(np.stack([s, u], 1), np.stack([s, r], 1)).reshape(sample.size, pool.size, refs.size).sum(2)
    head_size = min(pool.size, 2 * size)
    head = np.argsort(-wins + rng.random(wins.shape) * 0.5, axis=1)[:, :head_size]  # (|sample|, head)
    i, j = np.triu_indices(head_size, 1)
    a, b = pool[head[:, i]], pool[head[:, j]]  # (|sample|, pairs)
    s = np.repeat(sample, i.size)
    le = oracle.le_many(np.stack([s, a.ravel()], 1), np.stack([s, b.ravel()], 1)).reshape(sample.size, i.size)
    count = np.zeros((sample.size, head_size))
    np.add.at(count, (slice(None), i), le)
    np.add.at(count, (slice(None), j), ~le)
    best = np.argsort(-count + rng.random(count.shape) * 0.5, axis=1)[:, :size]
    return np.take_along_axis(pool[head], best, axis=1)


class Tester:
    """ALG-TESTER over one round's centres: "d(x1, c1) <= d(x2, c2)?" by a majority of distinct questions
    "d(x1, k1) <= d(x2, k2)?" with k1, k2 from the centres' kernels (the centre itself first)."""

    def __init__(self, oracle: QuadrupletOracle, centers: np.ndarray, kernel: np.ndarray, votes: int) -> None:
        self.oracle, self.centers = oracle, centers
        self.proxies = np.concatenate([centers[:, None], kernel], axis=1)  # (c, 1 + L)
        width = self.proxies.shape[1]
        pairs = [(i, (i + shift) % width) for shift in range(width) for i in range(width)]
        self.pairs = np.array(pairs[: min(votes, len(pairs))])  # (votes, 2): (0, 0) is the direct question

    def le(self, x1: np.ndarray, c1: np.ndarray, x2: np.ndarray, c2: np.ndarray) -> np.ndarray:
        """(q,) majority answers; ``c1``/``c2`` are positions in the round's centres."""
        p1 = self.proxies[c1][:, self.pairs[:, 0]]  # (q, votes)
        p2 = self.proxies[c2][:, self.pairs[:, 1]]
        v = self.pairs.shape[0]
        e1 = np.stack([np.repeat(x1, v), p1.ravel()], 1)
        e2 = np.stack([np.repeat(x2, v), p2.ravel()], 1)
        return self.oracle.le_many(e1, e2).reshape(-1, v).sum(1) * 2 > v

    def nearest(self, points: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """(q,) position of each point's approximate nearest centre: a scan of the centres in random order."""
        order = rng.permutation(self.centers.size)
        best = np.full(points.size, order[0])
        for c in order[1:]:
            challenger = np.full(points.size, c)
            best = np.where(self.le(points, challenger, points, best), challenger, best)
        return best

    def closeness(self, points: np.ndarray, centre: np.ndarray, refs: np.ndarray) -> np.ndarray:
        """(q,) how many reference points (positions in ``points``) each point is nearer its centre than they are."""
        q, r = points.size, refs.size
        x1, c1 = np.repeat(points, r), np.repeat(centre, r)
        x2, c2 = np.tile(points[refs], q), np.tile(centre[refs], q)
        return self.le(x1, c1, x2, c2).reshape(q, r).sum(1)


def mapping_cost(distance: Callable[[np.ndarray, np.ndarray], np.ndarray], mapping: np.ndarray, p: float = 2.0) -> float:
    """sum_v d(v, M(v))^p with exact distances (for evaluation; the algorithm never sees them)."""
    items = np.arange(mapping.size)
    return float(np.sum(distance(items, mapping) ** p))


def reduce_to_k(coreset: Coreset, distance: Callable[[np.ndarray, np.ndarray], np.ndarray], k: int, p: float = 2.0,
                seed: int = 0, iterations: int = 20, n_init: int = 8) -> np.ndarray:
    """k of the coreset's centres (item indices): weighted k-means++ seeding, then k-medoid updates, the best of
    ``n_init`` starts by weighted coreset cost, with exact distances between coreset centres, as the paper's
    experiments do. Compose with the mapping for labels (:func:`compose_labels`)."""
    centers, weights = coreset.centers, coreset.weights.astype(np.float64)
    c = centers.size
    if not 1 <= k <= c:
        raise InputError("k", f"an integer in [1, {c}] (the coreset's size)", k)
    i, j = np.meshgrid(np.arange(c), np.arange(c), indexing="ij")
    cost = distance(centers[i.ravel()], centers[j.ravel()]).reshape(c, c) ** p  # (c, c)
    rng = np.random.default_rng(seed)
    starts = [_kmedoids(cost, weights, _kmeanspp_seeds(cost, weights, k, rng), iterations) for _ in range(n_init)]
    best = min(starts, key=lambda chosen: float(weights @ cost[:, chosen].min(1)))
    return centers[best]


def _kmedoids(cost: np.ndarray, weights: np.ndarray, chosen: np.ndarray, iterations: int) -> np.ndarray:
    """Weighted alternating k-medoid updates from the seeds ``chosen`` (rows of the (c, c) cost matrix)."""
    k = chosen.size
    for _ in range(iterations):
        label = np.argmin(cost[:, chosen], axis=1)
        update = []
        for cluster in range(k):
            members = np.nonzero(label == cluster)[0]
            if members.size == 0:
                update.append(chosen[cluster])
                continue
            within = cost[np.ix_(members, members)] @ weights[members]  # weighted cost of each member as medoid
            update.append(members[np.argmin(within)])
        if update == list(chosen):
            break
        chosen = np.array(update)
    return chosen


def compose_labels(coreset: Coreset, distance: Callable[[np.ndarray, np.ndarray], np.ndarray],
                   final: np.ndarray) -> np.ndarray:
    """(n,) each item's final centre (item index): the one of ``final`` nearest its coreset centre M(v)."""
    c = coreset.centers
    d = distance(np.repeat(c, final.size), np.tile(final, c.size)).reshape(c.size, final.size)
    nearest = dict(zip(c.tolist(), final[d.argmin(1)].tolist(), strict=True))
    return np.array([nearest[m] for m in coreset.mapping.tolist()])


def _kmeanspp_seeds(cost: np.ndarray, weights: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """k rows of a (c, c) cost matrix by weighted D^p sampling (k-means++)."""
    first = rng.choice(cost.shape[0], p=weights / weights.sum())
    chosen = [first]
    nearest = cost[:, first].copy()
    for _ in range(1, k):
        mass = weights * nearest
        pick = rng.choice(cost.shape[0], p=mass / mass.sum()) if mass.sum() > 0 else rng.integers(cost.shape[0])
        chosen.append(pick)
        nearest = np.minimum(nearest, cost[:, pick])
    return np.array(chosen)
