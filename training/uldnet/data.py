"""Datasets for ULD-Net training: the bundled digits preset, users' .npz files, image folders and CIFAR batches.

(The bundled 32x32 RGB task ``photos32`` lives in photos.py.) Every :class:`Splits` records its *input
contract* — sample shape, dtype, value scale and normalisation — which the checkpoint keeps and export
writes into the model metadata, so a client knows what to send.

Everything becomes a :class:`Splits` of float32 inputs and int64 labels with a fixed stratified
train/val/test split (split seed 0 by default, independent of the training seed), so runs with different
training seeds are evaluated on the same test set.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp"}


class DataError(ValueError):
    """A user's data file or folder is not what its loader expects; the message names the file and the expectation."""


# "range": the closed interval every input value lies in (the HE client refuses values outside it, he/contract.py)
PIXELS_01 = {"scale": "pixel / 255 (values in [0, 1])", "normalization": "none", "range": [0.0, 1.0]}


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
    input_contract: dict[str, Any] = field(default_factory=dict)  # scale / normalisation of one sample

    @property
    def input_shape(self) -> list[int]:
        return list(self.x_train.shape[1:])

    def contract(self) -> dict[str, Any]:
        """What one input sample must be: dtype, shape, value scale and normalisation."""
        return {"dtype": "float32", "shape": self.input_shape, "scale": "as given", "normalization": "none",
                **self.input_contract}

    def describe(self) -> dict:
        return {"source": self.source, "classes": self.classes, "input_shape": self.input_shape,
                "sizes": {"train": len(self.y_train), "val": len(self.y_val), "test": len(self.y_test)},
                "input": self.contract()}


def split_stratified(x: np.ndarray, y: np.ndarray, classes: list[str], source: str, val_fraction: float = 0.2,
                     test_fraction: float = 0.2, split_seed: int = 0, contract: dict[str, Any] | None = None) -> Splits:
    """A stratified train/val/test split that depends only on the data and ``split_seed``."""
    from sklearn.model_selection import train_test_split

    if not 0 < val_fraction < 1 or not 0 < test_fraction < 1 or val_fraction + test_fraction >= 1:
        raise ValueError(f"split fractions: expected val, test in (0, 1) with a sum < 1, received {val_fraction}, {test_fraction}")
    x_rest, x_test, y_rest, y_test = train_test_split(x, y, test_size=test_fraction, stratify=y, random_state=split_seed)
    val_share = val_fraction / (1.0 - test_fraction)
    x_train, x_val, y_train, y_val = train_test_split(x_rest, y_rest, test_size=val_share, stratify=y_rest,
                                                      random_state=split_seed)
    return Splits(x_train, y_train, x_val, y_val, x_test, y_test, classes, source, dict(contract or {}))


def load_digits_preset(split_seed: int = 0) -> Splits:
    """scikit-learn's 8x8 digits (1797 images, bundled), scaled to [0, 1], shape (N, 1, 8, 8)."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = (digits.images / 16.0).astype(np.float32)[:, None]  # (N, 1, 8, 8)
    y = digits.target.astype(np.int64)
    return split_stratified(x, y, [str(c) for c in range(10)], "preset:digits", split_seed=split_seed,
                            contract={"scale": "pixel / 16 (sklearn digits 0..16 -> [0, 1])", "normalization": "none",
                                      "range": [0.0, 1.0]})


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
    return split_stratified(x.astype(np.float32), labels, classes, f"npz:{path.name}", split_seed=split_seed,
                            contract={"scale": "as stored in the .npz (no rescaling)", "normalization": "none"})


def load_image_folder(root: str | Path, image_size: int, grayscale: bool = True, split_seed: int = 0,
                      flag: str = "--image-folder") -> Splits:
    """An ImageFolder-style tree ``root/<class>/<image>`` (PNG, JPEG, ... via Pillow), resized to image_size^2
    (bilinear) and scaled to [0, 1]; ``flag`` is how the user named the folder, for the error messages."""
    from PIL import Image, UnidentifiedImageError

    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"{flag}: expected a directory of class folders, received {str(root)!r}")
    class_dirs = sorted(d for d in root.iterdir() if d.is_dir())
    if len(class_dirs) < 2:
        raise DataError(f"{flag}: expected >= 2 class sub-folders in {root}, found {len(class_dirs)}")
    xs, ys = [], []
    for label, class_dir in enumerate(class_dirs):
        files = sorted(f for f in class_dir.iterdir() if f.suffix.lower() in IMAGE_SUFFIXES)
        for f in files:
            try:
                with Image.open(f) as img:
                    img = img.convert("L" if grayscale else "RGB").resize((image_size, image_size), Image.BILINEAR)
                    arr = np.asarray(img, dtype=np.float32) / 255.0
            except (UnidentifiedImageError, OSError) as exc:
                raise DataError(f"{f}: expected an image Pillow can read ({', '.join(sorted(IMAGE_SUFFIXES))}), "
                                f"received an unreadable file ({exc})") from exc
            xs.append(arr[None] if grayscale else arr.transpose(2, 0, 1))  # (C, H, W)
            ys.append(label)
    counts = np.bincount(np.asarray(ys, dtype=np.int64), minlength=len(class_dirs))
    if counts.min() < 5:
        raise DataError(f"{flag}: expected >= 5 images per class for a stratified split, "
                        f"received {dict(zip([d.name for d in class_dirs], counts.tolist(), strict=True))}")
    contract = {**PIXELS_01, "layout": "CHW, " + ("grey" if grayscale else "RGB"),
                "resize": f"bilinear to {image_size}x{image_size}"}
    return split_stratified(np.stack(xs), np.asarray(ys, dtype=np.int64), [d.name for d in class_dirs],
                            f"image-folder:{root.name}", split_seed=split_seed, contract=contract)


# the python version of the official archives (cifar-10-python.tar.gz, cifar-100-python.tar.gz), extracted
CIFAR_FILES = {
    "cifar10": {"folder": "cifar-10-batches-py", "train": [f"data_batch_{i}" for i in range(1, 6)],
                "test": ["test_batch"], "labels": b"labels", "meta": ("batches.meta", b"label_names"), "classes": 10},
    "cifar100": {"folder": "cifar-100-python", "train": ["train"], "test": ["test"], "labels": b"fine_labels",
                 "meta": ("meta", b"fine_label_names"), "classes": 100},
}


def _unpickle(path: Path) -> Any:
    """A CIFAR batch file: a pickled dict of numpy arrays and lists. Only numpy's array and dtype constructors
    may be called (a pickle can run any code it names; these files need nothing else)."""
    import pickle

    allowed = {("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
               ("numpy", "ndarray"), ("numpy", "dtype"), ("numpy.core.multiarray", "scalar"),
               ("numpy._core.multiarray", "scalar"), ("_codecs", "encode")}

    class NumpyOnly(pickle.Unpickler):
        def find_class(self, module: str, name: str) -> Any:
            if (module, name) not in allowed:
                raise DataError(f"{path}: expected a CIFAR python-pickle batch (numpy arrays and lists), "
                                f"received a pickle that calls {module}.{name}")
            return super().find_class(module, name)

    try:
        with open(path, "rb") as f:
            return NumpyOnly(f, encoding="bytes").load()
    except DataError:
        raise
    except Exception as exc:  # a truncated or foreign file: say which and what it should be
        raise DataError(f"{path}: expected a CIFAR python-pickle batch file, could not unpickle it "
                        f"({type(exc).__name__}: {exc})") from exc


def _cifar_batch(path: Path, labels_key: bytes, num_classes: int) -> tuple[np.ndarray, np.ndarray]:
    """(images (N, 3, 32, 32) uint8, labels (N,)) of one batch file, checked."""
    batch = _unpickle(path)
    if not isinstance(batch, dict) or b"data" not in batch or labels_key not in batch:
        keys = sorted(batch) if isinstance(batch, dict) else type(batch).__name__
        raise DataError(f"{path}: expected a dict with b'data' (N, 3072) uint8 and {labels_key!r}, received {keys}")
    data, labels = np.asarray(batch[b"data"]), np.asarray(batch[labels_key])
    if data.ndim != 2 or data.shape[1] != 3072 or data.dtype != np.uint8:
        raise DataError(f"{path}: expected b'data' of shape (N, 3072) and dtype uint8 (32x32 RGB, channel-major), "
                        f"received shape {data.shape} and dtype {data.dtype}")
    if labels.shape != (len(data),) or not np.issubdtype(labels.dtype, np.integer) or labels.min(initial=0) < 0 \
            or labels.max(initial=0) >= num_classes:
        raise DataError(f"{path}: expected {labels_key!r} with {len(data)} integer labels in 0..{num_classes - 1}, "
                        f"received shape {labels.shape}, dtype {labels.dtype}")
    return data.reshape(-1, 3, 32, 32), labels.astype(np.int64)


def load_cifar(kind: str, root: str | Path, val_fraction: float = 0.1, split_seed: int = 0) -> Splits:
    """CIFAR-10 / CIFAR-100 from the extracted python archive (``root`` is the ``cifar-10-batches-py`` /
    ``cifar-100-python`` folder or the folder holding it); pixels / 255, the official test split as test,
    a stratified ``val_fraction`` of the training batches as validation."""
    from sklearn.model_selection import train_test_split

    if kind not in CIFAR_FILES:
        raise DataError(f"--data: expected one of {sorted(CIFAR_FILES)}, received {kind!r}")
    spec, root = CIFAR_FILES[kind], Path(root)
    folder = root / spec["folder"] if (root / spec["folder"]).is_dir() else root
    parts = {}
    for split in ("train", "test"):
        xs, ys = [], []
        for name in spec[split]:
            path = folder / name
            if not path.is_file():
                raise FileNotFoundError(f"--data {kind}:{root}: expected the batch file {path} (the python version of "
                                        f"the official archive, extracted: {', '.join(spec['train'] + spec['test'])})")
            x, y = _cifar_batch(path, spec["labels"], spec["classes"])
            xs.append(x)
            ys.append(y)
        parts[split] = np.concatenate(xs), np.concatenate(ys)
    meta_file, meta_key = spec["meta"]
    classes = [str(c) for c in range(spec["classes"])]
    if (folder / meta_file).is_file():  # optional: the class names
        meta = _unpickle(folder / meta_file)
        names = meta.get(meta_key) if isinstance(meta, dict) else None
        if names is not None and len(names) == spec["classes"]:
            classes = [n.decode() if isinstance(n, bytes) else str(n) for n in names]
    (x_all, y_all), (x_test, y_test) = parts["train"], parts["test"]
    if min(np.bincount(y_all, minlength=spec["classes"])) * val_fraction < 1:
        raise DataError(f"--data {kind}:{root}: expected every class at least {int(1 / val_fraction)} times in the "
                        f"training batches (for a stratified {val_fraction:.0%} validation split), received counts "
                        f"{np.bincount(y_all, minlength=spec['classes']).min()}..{np.bincount(y_all).max()}")
    x_train, x_val, y_train, y_val = train_test_split(x_all, y_all, test_size=val_fraction, stratify=y_all,
                                                      random_state=split_seed)
    scale = lambda a: (a.astype(np.float32) / 255.0)  # noqa: E731
    contract = {**PIXELS_01, "layout": "CHW, RGB"}
    return Splits(scale(x_train), y_train, scale(x_val), y_val, scale(x_test), y_test, classes,
                  f"{kind}:{folder.name}", contract)


def load_data_spec(spec: str, image_size: int = 32, split_seed: int = 0) -> Splits:
    """``--data``: ``folder:DIR``, ``cifar10:DIR``, ``cifar100:DIR``, ``npz:FILE`` or a path to an .npz file."""
    kind, sep, rest = spec.partition(":")
    if sep and kind == "folder":
        return load_image_folder(rest, image_size, grayscale=False, split_seed=split_seed, flag=f"--data {spec}")
    if sep and kind in CIFAR_FILES:
        return load_cifar(kind, rest, split_seed=split_seed)
    if sep and kind == "npz":
        return load_npz(rest, split_seed=split_seed)
    if spec.endswith(".npz"):
        return load_npz(spec, split_seed=split_seed)
    raise DataError(f"--data: expected folder:DIR, cifar10:DIR, cifar100:DIR, npz:FILE or a .npz path, received {spec!r}")
