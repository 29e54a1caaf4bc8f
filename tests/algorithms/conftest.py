"""Small shared data for the algorithms tests: 2-D blobs (the spec's test set, at a CI size)."""

from __future__ import annotations

import numpy as np
import pytest


def make_blobs(n: int, k: int, seed: int = 0, spread: float = 10.0) -> np.ndarray:
    """n 2-D points around k centres drawn uniformly in [-spread, spread]^2, unit normal noise."""
    rng = np.random.default_rng(seed)
    centres = rng.uniform(-spread, spread, (k, 2))
    return centres[rng.integers(k, size=n)] + rng.normal(size=(n, 2))


@pytest.fixture(scope="session")
def blobs() -> np.ndarray:
    return make_blobs(300, 3, seed=1)
