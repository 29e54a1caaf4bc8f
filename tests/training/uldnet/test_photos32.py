"""photos32 (issue 30 §1): the bundled 32x32 RGB task — disjoint regions, per-crop normalisation, determinism."""

from __future__ import annotations

import numpy as np
import pytest
from veil.training.uldnet.photos import (
    BLOCK,
    SOURCES,
    SPLITS,
    build_photos32,
    load_photos32,
    standardize_per_sample,
)


@pytest.fixture(scope="module")
def task():
    return build_photos32(0)


def test_shapes_classes_and_sizes(task) -> None:
    data = task.splits
    assert len(data.classes) == len(SOURCES) >= 10 and data.source == "preset:photos32"
    assert data.x_train.shape == (4800, 3, 32, 32) and data.x_train.dtype == np.float32
    assert data.describe()["sizes"] == {"train": 4800, "val": 1200, "test": 2400}
    for y in (data.y_train, data.y_val, data.y_test):
        assert np.bincount(y).min() == np.bincount(y).max()  # balanced: one class per source image
    assert load_photos32() is data  # built once per process


def test_no_source_pixel_is_in_two_splits(task) -> None:
    for label, (h, w) in enumerate(task.image_shapes):
        owner = np.full((h, w), -1)
        for s, split in enumerate(SPLITS):
            boxes = task.boxes[split][task.boxes[split][:, 0] == label]
            assert len(boxes)
            for _, y0, x0, side in boxes:
                region = owner[y0:y0 + side, x0:x0 + side]
                assert region.shape == (side, side)  # inside the image
                assert np.isin(region, (-1, s)).all(), f"class {label}: a {split} crop overlaps another split"
                region[...] = s
                assert y0 // BLOCK == (y0 + side - 1) // BLOCK and x0 // BLOCK == (x0 + side - 1) // BLOCK  # one block


def test_every_crop_is_standardised_per_channel(task) -> None:
    x = task.splits.x_test
    np.testing.assert_allclose(x.mean(axis=(2, 3)), 0.0, atol=1e-4)
    np.testing.assert_allclose(x.std(axis=(2, 3)), 1.0, atol=1e-3)
    np.testing.assert_allclose(standardize_per_sample(x * 7.0 + 3.0), x, atol=5e-3)  # up to eps / std


def test_the_same_seed_builds_the_same_task(task) -> None:
    again = build_photos32.__wrapped__(0)
    assert np.array_equal(again.splits.x_train, task.splits.x_train)
    assert all(np.array_equal(again.boxes[s], task.boxes[s]) for s in SPLITS)


def test_the_input_contract_says_how_crops_are_normalised(task) -> None:
    contract = task.splits.describe()["input"]
    assert contract["shape"] == [3, 32, 32] and contract["dtype"] == "float32"
    assert "per-channel standardisation" in contract["normalization"] and "[0, 1]" in contract["scale"]
