"""veil.algorithms.cluster: metric k-clustering with only a noisy quadruplet oracle (the R-model).

Oracles (:mod:`.oracles`), the coreset algorithm (:mod:`.coreset`), exact-distance baselines (:mod:`.baselines`)
and the JSONL reader (:mod:`.data`)."""

from .baselines import cost_to_centres, kmeans_cost, kmeans_pp, kmedoids
from .coreset import Coreset, CoresetConfig, compose_labels, mapping_cost, rank_model_coreset, reduce_to_k
from .data import Items, load_jsonl, parse_jsonl
from .oracles import (
    CountingOracle,
    ExactOracle,
    ModelOracle,
    PersistentNoisyOracle,
    QuadrupletOracle,
    le,
)

__all__ = ["Coreset", "CoresetConfig", "CountingOracle", "ExactOracle", "Items", "ModelOracle",
           "PersistentNoisyOracle", "QuadrupletOracle", "compose_labels", "cost_to_centres", "kmeans_cost",
           "kmeans_pp", "kmedoids", "le", "load_jsonl", "mapping_cost", "parse_jsonl", "rank_model_coreset",
           "reduce_to_k"]
