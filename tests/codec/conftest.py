"""A tiny codec trained for a few steps and exported once per session, and small test images."""

from __future__ import annotations

import types
from pathlib import Path

import numpy as np
import pytest
import skimage.data


def tiny_codec(base: Path) -> Path:
    """Train (40 + 40 steps, tiny widths) and export once per pytest session; returns the version folder."""
    folder = base / "codec-tiny"
    if not (folder / "repo" / "codec" / "1" / "codec.json").is_file():
        from veil.export.codec import export_codec
        from veil.training.codec.config import CodecModelConfig, CodecTrainConfig
        from veil.training.codec.data import skimage_images
        from veil.training.codec.trainer import save_codec, train_codec

        images = skimage_images(("rocket", "camera"))
        model = CodecModelConfig(d=8, bits=[4, 4, 4, 4, 6, 6, 6, 8, 8, 8], channels=[8, 16, 16, 16], prior_width=32,
                                 prior_layers=1, prior_heads=2)
        train = CodecTrainConfig(tokenizer_steps=40, prior_steps=40, crop=64, prior_crop=128, batch_size=4,
                                 prior_crops=16, threads=1)
        save_codec(train_codec(model, train, list(images.values()), progress=False), folder / "ck", sorted(images))
        export_codec(folder / "ck", folder / "repo", "codec")
    return folder / "repo" / "codec" / "1"


@pytest.fixture(scope="session")
def codec_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_codec(tmp_path_factory.getbasetemp())


@pytest.fixture(scope="session")
def runtime(codec_dir: Path):
    from veil.codec.runtime import CodecRuntime

    return CodecRuntime(codec_dir)


@pytest.fixture(scope="session")
def images() -> types.SimpleNamespace:
    """crop: a 96x136 held-out photo crop (sides not multiples of 16); digit: an sklearn digit upscaled to 64x64 RGB."""
    from sklearn.datasets import load_digits

    digit = load_digits().images[3]
    digit = np.kron(digit / 16.0 * 255.0, np.ones((8, 8))).astype(np.uint8)
    return types.SimpleNamespace(crop=np.ascontiguousarray(skimage.data.astronaut()[40:136, 180:316]),
                                 digit=np.repeat(digit[..., None], 3, axis=2))
