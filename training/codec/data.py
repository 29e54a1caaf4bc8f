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


def random_crops(images: list[np.ndarray], n: int, side: int, rng: np.random.Generator) -> torch.Tensor:
    """(n, 3, side, side) float32 in [-0.5, 0.5]: random crops (images smaller than ``side`` are padded by
    reflection), random flips and a random channel permutation (colour augmentation for a small photo set)."""
    out = np.empty((n, 3, side, side), np.float32)
    for i in range(n):
        img = images[rng.integers(len(images))]
        if min(img.shape[:2]) < side:
            pad = side - min(img.shape[:2])
            img = np.pad(img, ((0, pad), (0, pad), (0, 0)), mode="reflect")
        y, x = rng.integers(img.shape[0] - side + 1), rng.integers(img.shape[1] - side + 1)
        crop = img[y:y + side, x:x + side]
        if rng.random() < 0.5:
            crop = crop[:, ::-1]
        crop = crop[..., rng.permutation(3)]
        out[i] = crop.transpose(2, 0, 1) / 255.0 - 0.5
    return torch.from_numpy(out)
