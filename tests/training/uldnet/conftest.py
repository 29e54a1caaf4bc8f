"""Shared fixtures of the ULD-Net tests: a small image folder in the `--data folder:DIR` layout."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image


@pytest.fixture
def image_folder(tmp_path):
    """A factory: ``image_folder(classes=..., per_class=...)`` writes root/<class>/<i>.png|jpg (random RGB) and returns root."""

    def write(classes=("cat", "dog"), per_class: int = 6, size=(40, 30)):
        root = tmp_path / "photos"
        rng = np.random.default_rng(0)
        for name in classes:
            (root / name).mkdir(parents=True)
            for i in range(per_class):
                pixels = rng.integers(0, 256, (*size, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(root / name / f"{i}.{'png' if i % 2 else 'jpg'}")
        return root

    return write
