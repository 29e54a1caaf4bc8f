"""Datasets for ULD-Net training: the bundled digits preset, users' .npz files and image folders.

Everything becomes a :class:`Splits` of float32 inputs and int64 labels with a fixed stratified
train/val/test split (split seed 0 by default, independent of the training seed), so runs with different
training seeds are evaluated on the same test set.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp"}


@dataclass
class Splits:
    """Train/val/test arrays plus what a checkpoint needs to describe them."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_val: np.ndarray
    y_val: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    classes: list[str]
    source: str

    @property
    def input_shape(self) -> list[int]:
        return list(self.x_train.shape[1:])

    def describe(self) -> dict:
        return {"source": self.source, "classes": self.classes, "input_shape": self.input_shape,
                "sizes": {"train": len(self.y_train), "val": len(self.y_val), "test": len(self.y_test)}}


def split_stratified(x: np.ndarray, y: np.ndarray, classes: list[str], source: str, val_fraction: float = 0.2,
                     test_fraction: float = 0.2, split_seed: int = 0) -> Splits:
    """A stratified train/val/test split that depends only on the data and ``split_seed``."""
    from sklearn.model_selection import train_test_split

    if not 0 < val_fraction < 1 or not 0 < test_fraction < 1 or val_fraction + test_fraction >= 1:
        raise ValueError(f"split fractions: expected val, test in (0, 1) with a sum < 1, received {val_fraction}, {test_fraction}")
    x_rest, x_test, y_rest, y_test = train_test_split(x, y, test_size=test_fraction, stratify=y, random_state=split_seed)
    val_share = val_fraction / (1.0 - test_fraction)
    x_train, x_val, y_train, y_val = train_test_split(x_rest, y_rest, test_size=val_share, stratify=y_rest,
                                                      random_state=split_seed)
    return Splits(x_train, y_train, x_val, y_val, x_test, y_test, classes, source)


def load_digits_preset(split_seed: int = 0) -> Splits:
    """scikit-learn's 8x8 digits (1797 images, bundled), scaled to [0, 1], shape (N, 1, 8, 8)."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = (digits.images / 16.0).astype(np.float32)[:, None]  # (N, 1, 8, 8)
    y = digits.target.astype(np.int64)
    return split_stratified(x, y, [str(c) for c in range(10)], "preset:digits", split_seed=split_seed)


def _labels(y: np.ndarray, field_name: str) -> tuple[np.ndarray, list[str]]:
    """Map arbitrary labels to 0..K-1 (sorted), returning the class names."""
    if y.ndim != 1:
        raise ValueError(f"{field_name}: expected a 1-D label array, received shape {y.shape}")
    values, index = np.unique(y, return_inverse=True)
    if len(values) < 2:
        raise ValueError(f"{field_name}: expected at least 2 classes, received {len(values)}")
    return index.astype(np.int64), [str(v) for v in values]


def load_npz(path: str | Path, split_seed: int = 0) -> Splits:
    """A user's .npz with arrays ``x`` (N, ...) and ``y`` (N,); used as given (no rescaling)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"--data: expected an existing .npz file, received {str(path)!r}")
    with np.load(path, allow_pickle=False) as data:
        missing = {"x", "y"} - set(data.files)
        if missing:
            raise ValueError(f"{path}: expected arrays 'x' and 'y', missing {sorted(missing)} (found {data.files})")
        x, y = np.asarray(data["x"]), np.asarray(data["y"])
    if x.ndim < 2 or len(x) != len(y):
        raise ValueError(f"{path}: expected x of shape (N, ...) and y of shape (N,), received {x.shape} and {y.shape}")
    if not np.issubdtype(x.dtype, np.number):
        raise ValueError(f"{path}: expected numeric x, received dtype {x.dtype}")
    labels, classes = _labels(y, f"{path}:y")
    return split_stratified(x.astype(np.float32), labels, classes, f"npz:{path.name}", split_seed=split_seed)


def load_image_folder(root: str | Path, image_size: int, grayscale: bool = True, split_seed: int = 0) -> Splits:
    """An ImageFolder-style tree ``root/<class>/<image>``, resized to image_size^2 and scaled to [0, 1]."""
    from PIL import Image

    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"--image-folder: expected a directory of class folders, received {str(root)!r}")
    class_dirs = sorted(d for d in root.iterdir() if d.is_dir())
    if len(class_dirs) < 2:
        raise ValueError(f"--image-folder: expected >= 2 class sub-folders in {root}, found {len(class_dirs)}")
    xs, ys = [], []
    for label, class_dir in enumerate(class_dirs):
        files = sorted(f for f in class_dir.iterdir() if f.suffix.lower() in IMAGE_SUFFIXES)
        for f in files:
            with Image.open(f) as img:
                img = img.convert("L" if grayscale else "RGB").resize((image_size, image_size), Image.BILINEAR)
                arr = np.asarray(img, dtype=np.float32) / 255.0
            xs.append(arr[None] if grayscale else arr.transpose(2, 0, 1))  # (C, H, W)
            ys.append(label)
    counts = np.bincount(np.asarray(ys), minlength=len(class_dirs))
    if counts.min() < 5:
        raise ValueError(f"--image-folder: expected >= 5 images per class for a stratified split, "
                         f"received {dict(zip([d.name for d in class_dirs], counts.tolist(), strict=True))}")
    return split_stratified(np.stack(xs), np.asarray(ys, dtype=np.int64), [d.name for d in class_dirs],
                            f"image-folder:{root.name}", split_seed=split_seed)
