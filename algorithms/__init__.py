"""veil.algorithms: seed algorithms that neither train nor serve a model (numpy only).

- :mod:`veil.algorithms.cluster`: metric k-clustering with only a noisy quadruplet oracle ("is d(a,b) <= d(c,d)?"),
  after Raychaudhury, Esmailpour, Galhotra, Sintos, *Metric k-clustering using only Weak Comparison Oracles*,
  ICLR 2026 (arXiv 2601.19333).
- :mod:`veil.algorithms.games`: regret-matching equilibrium solvers for two-player zero-sum games (RM+, PRM+,
  SPRM+, MI-SPRM+), after Meng et al., *A Faster Parameter-Free Regret Matching Algorithm*, ICLR 2026.

A model oracle talks to a served veil model over HTTP (the Open Inference Protocol); nothing here imports the
engine or training.
"""

from .errors import AlgorithmsError, InputError

__all__ = ["AlgorithmsError", "InputError"]
