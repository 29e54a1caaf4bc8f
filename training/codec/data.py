"""Training images: the bundled ``skimage.data`` photos (fixed split) or a folder of the user's, and random crops.

The split is fixed: astronaut, coffee and chelsea are held out for evaluation and never trained on; ``cat``
is the same photo as chelsea, so it is left out of training too. Greyscale photos are replicated to RGB.
"""

from __future__ import annotations

import numpy as np
import torch
from veil.codec.images import HELD_OUT, bundled

TRAIN = ("rocket", "hubble_deep_field", "immunohistochemistry", "retina", "colorwheel", "camera", "brick", "grass",
         "gravel", "coins", "moon", "cell", "clock")
NEVER = ("cat",)  # the held-out chelsea under another name


def skimage_images(names: tuple[str, ...] = TRAIN) -> dict[str, np.ndarray]:
    """Bundled training photos by name as (H, W, 3) uint8; refuses the held-out ones."""
    overlap = set(names) & (set(HELD_OUT) | set(NEVER))
    if overlap:
        raise ValueError(f"training images: {sorted(overlap)} are held out for evaluation and cannot be trained on")
    return bundled(names)


def sampling_weights(images: list[np.ndarray], colour: float = 3.0) -> np.ndarray:
    """Probability of drawing each image: colour photos ``colour`` times as often as greyscale ones (the
    held-out photos are colour; with greyscale crops dominating, a small model learns to output grey)."""
    grey = [bool(np.array_equal(im[..., 0], im[..., 1]) and np.array_equal(im[..., 1], im[..., 2])) for im in images]
    w = np.array([1.0 if g else colour for g in grey])
    return w / w.sum()


def random_crops(images: list[np.ndarray], n: int, side: int, rng: np.random.Generator,
                 weights: np.ndarray | None = None) -> torch.Tensor:
    """(n, 3, side, side) float32 in [-0.5, 0.5]: random crops (images drawn with ``weights``; those smaller
    than ``side`` are padded by reflection), random flips and, half the time, a random channel permutation
    (colour augmentation for a small photo set)."""
    out = np.empty((n, 3, side, side), np.float32)
    for i in range(n):
        img = images[rng.choice(len(images), p=weights)]
        if min(img.shape[:2]) < side:
            pad = side - min(img.shape[:2])
            img = np.pad(img, ((0, pad), (0, pad), (0, 0)), mode="reflect")
        y, x = rng.integers(img.shape[0] - side + 1), rng.integers(img.shape[1] - side + 1)
        crop = img[y:y + side, x:x + side]
        if rng.random() < 0.5:
            crop = crop[:, ::-1]
        if rng.random() < 0.5:
            crop = crop[..., rng.permutation(3)]
        out[i] = crop.transpose(2, 0, 1) / 255.0 - 0.5
    return torch.from_numpy(out)
