"""`photos32`: a bundled, deterministic 32x32 RGB classification task cut from photos that packages ship.

One class per source image (scikit-image's ``skimage.data`` colour photos and grey textures, matplotlib's
``grace_hopper.jpg``). The task is built so that a model must read texture and shape, not colour:

- every image is resized so its short side is ``SHORT_SIDE`` pixels and cut into a grid of ``BLOCK`` x
  ``BLOCK`` blocks; each block goes whole to train, val or test (a seeded 60/20/20 draw per image), and every
  crop lies inside one block, so **no source pixel is in two splits** (``Photos32.boxes`` records each crop);
- a crop is a square of a random side in ``CROP_SIDES`` (scale jitter) at a random place in its block,
  resized to 32x32 (antialiased), turned by a random multiple of 90 degrees and flipped at random;
- Gaussian noise of ``NOISE`` times the crop's own standard deviation is added to each channel;
- each crop is then standardised on its own, per channel (zero mean, unit variance over H, W), so the mean
  colour and contrast of a source image do not give its class away;
- near-flat crops (pixel std < ``MIN_STD``, e.g. the black sky of the Hubble field) are drawn again.

Build with :func:`load_photos32` (``--preset photos32`` on the command line); ``standardize_per_sample`` is
the normalisation a client applies to its own 32x32 crops before sending them to a photos32 model.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from .data import Splits

SHORT_SIDE = 256  # every source is resized so its short side has this many pixels
BLOCK = 64  # side of the split blocks (a crop never crosses one)
CROP_SIDES = (24, 64)  # crop side drawn uniformly from this range (pixels of the resized source), then -> 32x32
NOISE = 0.25  # Gaussian noise, times the crop's own std, added per channel before standardisation
MIN_STD = 0.03  # crops flatter than this (pixel values in [0, 1]) are drawn again
SIZE = 32
PER_CLASS = {"train": 400, "val": 100, "test": 200}
SPLIT_SHARES = (0.6, 0.2, 0.2)  # share of blocks per image for train / val / test
SPLITS = ("train", "val", "test")
INPUT_CONTRACT = {
    "dtype": "float32", "shape": [3, SIZE, SIZE], "layout": "CHW, RGB",
    "scale": "pixel / 255 (values in [0, 1]) before normalisation",
    "normalization": "per-sample, per-channel standardisation: (x - mean_c) / std_c over H and W "
                     "(veil.training.uldnet.photos.standardize_per_sample)",
}


def _skimage(name: str) -> Callable[[], np.ndarray]:
    def load() -> np.ndarray:
        import skimage.data

        image = getattr(skimage.data, name)()
        return image[0] if isinstance(image, tuple) else image  # stereo_motorcycle: (left, right, disparity)

    return load


def _grace_hopper() -> np.ndarray:
    import matplotlib.cbook
    from PIL import Image

    with matplotlib.cbook.get_sample_data("grace_hopper.jpg") as f, Image.open(f) as img:
        return np.asarray(img.convert("RGB"))


# class name -> loader of the bundled source image (uint8, H x W or H x W x 3/4)
SOURCES: dict[str, Callable[[], np.ndarray]] = {
    "astronaut": _skimage("astronaut"),
    "chelsea": _skimage("chelsea"),
    "coffee": _skimage("coffee"),
    "hubble_deep_field": _skimage("hubble_deep_field"),
    "immunohistochemistry": _skimage("immunohistochemistry"),
    "motorcycle": _skimage("stereo_motorcycle"),
    "retina": _skimage("retina"),
    "rocket": _skimage("rocket"),
    "grace_hopper": _grace_hopper,
    "brick": _skimage("brick"),
    "grass": _skimage("grass"),
    "gravel": _skimage("gravel"),
}


@dataclass
class Photos32:
    """The task's splits plus where every crop came from: ``boxes[split]`` is (N, 4) ``[class, y0, x0, side]``
    in the resized source's pixels (a crop covers rows y0..y0+side-1 and columns x0..x0+side-1)."""

    splits: Splits
    boxes: dict[str, np.ndarray]
    image_shapes: list[tuple[int, int]]


def standardize_per_sample(x: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """(x - mean) / std per sample and channel over H, W of (N, C, H, W) (photos32's normalisation)."""
    x = np.asarray(x, dtype=np.float64)  # statistics in float64: float32 sums lose ~1e-3 over 1024 pixels
    if x.ndim != 4:
        raise ValueError(f"standardize_per_sample: expected (N, C, H, W), received shape {x.shape}")
    mean = x.mean(axis=(2, 3), keepdims=True)
    std = x.std(axis=(2, 3), keepdims=True)
    return ((x - mean) / (std + eps)).astype(np.float32)


def _source(name: str) -> np.ndarray:
    """The source image as float32 RGB in [0, 1], short side resized to SHORT_SIDE: (H, W, 3)."""
    import torch
    import torch.nn.functional as F

    image = np.asarray(SOURCES[name]())
    if image.ndim == 2:
        image = np.repeat(image[..., None], 3, axis=2)
    image = image[..., :3].astype(np.float32) / 255.0  # drop alpha
    h, w = image.shape[:2]
    size = (SHORT_SIDE, round(w * SHORT_SIDE / h)) if h <= w else (round(h * SHORT_SIDE / w), SHORT_SIDE)
    t = torch.from_numpy(np.ascontiguousarray(image.transpose(2, 0, 1)))[None]  # (1, 3, H, W)
    return F.interpolate(t, size=size, mode="bilinear", antialias=True, align_corners=False)[0].numpy().transpose(1, 2, 0)


def _assign_blocks(rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """(rows, cols) split index per block: a seeded permutation cut 60/20/20 (each split gets >= 1 block)."""
    n = rows * cols
    n_val, n_test = max(1, round(n * SPLIT_SHARES[1])), max(1, round(n * SPLIT_SHARES[2]))
    labels = np.zeros(n, dtype=np.int64)
    order = rng.permutation(n)
    labels[order[:n_val]] = 1
    labels[order[n_val:n_val + n_test]] = 2
    return labels.reshape(rows, cols)


def _crops(image: np.ndarray, blocks: list[tuple[int, int]], count: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """``count`` crops from the given blocks: (count, 3, 32, 32) standardised, and their boxes (count, 3)."""
    import torch
    import torch.nn.functional as F

    out, boxes = np.empty((count, 3, SIZE, SIZE), np.float32), np.empty((count, 3), np.int64)
    i = tries = 0
    while i < count:
        tries += 1
        if tries > 50 * count:
            raise RuntimeError("photos32: too many near-flat crops; lower MIN_STD")
        by, bx = blocks[rng.integers(len(blocks))]
        side = int(rng.integers(CROP_SIDES[0], CROP_SIDES[1] + 1))
        y0 = by * BLOCK + int(rng.integers(BLOCK - side + 1))
        x0 = bx * BLOCK + int(rng.integers(BLOCK - side + 1))
        crop = image[y0:y0 + side, x0:x0 + side]  # (side, side, 3)
        if crop.std() < MIN_STD:
            continue
        t = torch.from_numpy(np.ascontiguousarray(crop.transpose(2, 0, 1)))[None]  # (1, 3, side, side)
        small = F.interpolate(t, size=(SIZE, SIZE), mode="bilinear", antialias=True, align_corners=False)[0].numpy()
        small = np.rot90(small, k=int(rng.integers(4)), axes=(1, 2))
        if rng.integers(2):
            small = small[:, :, ::-1]
        small = small + rng.normal(0.0, NOISE * float(small.std()), small.shape)
        out[i], boxes[i] = standardize_per_sample(small[None])[0], (y0, x0, side)
        i += 1
    return out, boxes


@lru_cache(maxsize=2)
def build_photos32(seed: int = 0) -> Photos32:
    """Build the task (about 10 s on one core); the same seed gives the same arrays on any machine's numpy."""
    parts: dict[str, tuple[list, list, list]] = {s: ([], [], []) for s in SPLITS}
    shapes = []
    for label, name in enumerate(SOURCES):
        rng = np.random.default_rng([seed, label])
        image = _source(name)
        rows, cols = image.shape[0] // BLOCK, image.shape[1] // BLOCK
        shapes.append(image.shape[:2])
        assignment = _assign_blocks(rows, cols, rng)
        for s, split in enumerate(SPLITS):
            blocks = [tuple(b) for b in np.argwhere(assignment == s)]
            x, boxes = _crops(image, blocks, PER_CLASS[split], rng)
            parts[split][0].append(x)
            parts[split][1].append(np.full(len(x), label, np.int64))
            parts[split][2].append(np.column_stack([np.full(len(x), label), boxes]))
    arrays = {s: (np.concatenate(p[0]), np.concatenate(p[1]), np.concatenate(p[2])) for s, p in parts.items()}
    splits = Splits(*arrays["train"][:2], *arrays["val"][:2], *arrays["test"][:2], list(SOURCES), "preset:photos32",
                    input_contract=dict(INPUT_CONTRACT))
    return Photos32(splits, {s: a[2] for s, a in arrays.items()}, shapes)


def load_photos32(seed: int = 0) -> Splits:
    """The photos32 task: 12 classes, 4800 / 1200 / 2400 crops of (3, 32, 32), see the module docstring."""
    return build_photos32(seed).splits
