"""Cluster 2-D blobs with only a noisy quadruplet oracle ("is d(a, b) <= d(c, d)?"), and compare with k-means++.

    python examples/cluster.py                       # n = 1000, k = 5, phi = 0.15
    python examples/cluster.py --n 300 --k 3 --phi 0.25

The oracle answers each distinct question wrongly with probability phi, the same way every time (persistent
noise); the algorithm never sees a distance. Trusting every answer is the baseline.
"""

from __future__ import annotations

import argparse

import numpy as np
from veil.algorithms.cluster import (
    CoresetConfig,
    CountingOracle,
    ExactOracle,
    PersistentNoisyOracle,
    compose_labels,
    kmeans_cost,
    kmeans_pp,
    mapping_cost,
    rank_model_coreset,
    reduce_to_k,
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--k", type=int, default=5)
    parser.add_argument("--phi", type=float, default=0.15)
    args = parser.parse_args()

    rng = np.random.default_rng(0)
    points = rng.uniform(-10, 10, (args.k, 2))[rng.integers(args.k, size=args.n)] + rng.normal(size=(args.n, 2))
    truth = ExactOracle(points)  # used to build the noisy oracle and to score the result, never by the algorithm
    reference = kmeans_cost(points, kmeans_pp(points, args.k))
    print(f"k-means++ on exact distances: cost {reference:.0f}")
    for name, trust in (("coreset", False), ("trust every answer", True)):
        oracle = CountingOracle(PersistentNoisyOracle(truth, phi=args.phi, seed=1))
        coreset = rank_model_coreset(oracle, args.k, CoresetConfig(trust=trust))
        final = reduce_to_k(coreset, truth.distances, args.k)  # k centres among the coreset, as the paper does
        labels = compose_labels(coreset, truth.distances, final)
        print(f"{name}: {coreset.centers.size} centres, {oracle.queries:,} distinct queries, "
              f"coreset cost {mapping_cost(truth.distances, coreset.mapping) / reference:.2f}x, "
              f"k-centre cost {mapping_cost(truth.distances, labels) / reference:.2f}x k-means++")


if __name__ == "__main__":
    main()
