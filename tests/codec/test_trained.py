"""Checks on trained codecs: the shipped default (loaded in seconds) and the `veil train codec --quick` setting.

The default model ships in the package (veil/codec/default, trained without the held-out photos), so the
checks that need "a trained model" load it instead of training one; the training path is covered by the
quick setting, the one a user without a model is told to run.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from veil.codec.cli import SHIPPED_MODEL, default_model
from veil.codec.cli import main as codec_main
from veil.codec.images import HELD_OUT, bundled, load_image, png_bytes
from veil.codec.metrics import psnr
from veil.codec.runtime import CodecRuntime

# the quick model must reconstruct its own input: this mean PSNR over two held-out 128x128 crops (the collapsed
# model of the old quick setting decoded one image whatever it was sent: 10.9 dB on these crops; the fixed one
# 15.6 dB), and each crop must come back closer to itself than to the other's decode.
QUICK_FLOOR_DB = 12.5


@pytest.fixture(scope="module")
def shipped() -> CodecRuntime:
    folder, source = default_model(None)
    assert source == "shipped default" and folder.is_relative_to(SHIPPED_MODEL)
    return CodecRuntime(folder)


def test_the_shipped_default_never_trained_on_the_held_out_photos(shipped) -> None:
    manifest = json.loads((shipped.folder.parent / "veil.json").read_text())
    assert manifest["kind"] == "codec" and manifest["training_images"]
    assert not set(manifest["training_images"]) & {*HELD_OUT, "cat"}
    size = sum(p.stat().st_size for p in SHIPPED_MODEL.parent.rglob("*") if p.is_file())
    assert size <= 10 * 2 ** 20, size


def test_package_data_ships_every_file_of_the_default_model() -> None:
    """A non-editable `pip install` copies only what [tool.setuptools.package-data] names."""
    import tomllib

    root = SHIPPED_MODEL.parents[1]  # the veil.codec package folder
    patterns = tomllib.loads((root.parent / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    shipped = {p for pattern in patterns["veil.codec"] for p in root.glob(pattern) if p.is_file()}
    files = {p for p in SHIPPED_MODEL.parent.rglob("*") if p.is_file()}
    assert files and files == shipped, sorted(str(p) for p in files ^ shipped)


def test_lre_beats_raw_bits_on_held_out_photos(shipped) -> None:
    for name, pixels in bundled(("chelsea", "coffee")).items():
        enc = shipped.encode(np.ascontiguousarray(pixels[:192, :256]))
        assert enc.cross_entropy_bits < 0.97 * enc.raw_bits, (name, enc.cross_entropy_bits, enc.raw_bits)


def test_quality_grows_with_scales_sent(shipped) -> None:
    pixels = np.ascontiguousarray(bundled(("chelsea",))["chelsea"][:256, :256])
    K = shipped.geo.K
    scores = {k: psnr(pixels, shipped.decode(shipped.encode(pixels, k=k).data)) for k in (1, K - 2, K)}
    assert scores[K] > scores[K - 2] > scores[1], scores


def test_encode_without_model_uses_the_shipped_default_and_says_so(capsys, tmp_path) -> None:
    pixels = np.ascontiguousarray(bundled(("coffee",))["coffee"][:96, :128])
    (tmp_path / "photo.png").write_bytes(png_bytes(pixels))
    assert codec_main(["encode", str(tmp_path / "photo.png"), "-o", str(tmp_path / "out.bin")]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["model"]["source"] == "shipped default" and "(shipped default, hash " in err
    assert codec_main(["decode", str(tmp_path / "out.bin"), "-o", str(tmp_path / "back.png")]) == 0
    back = load_image((tmp_path / "back.png").read_bytes())
    assert back.shape == pixels.shape and psnr(pixels, back) > QUICK_FLOOR_DB  # 21.8 dB with the shipped model


@pytest.mark.slow
def test_quick_setting_trains_a_model_that_reconstructs_its_input(tmp_path, capsys) -> None:
    """Regression: the old quick setting's model decoded the same image whatever it was sent (8-11 dB)."""
    from veil.export.codec_cli import train_main  # `veil train codec`: train, then export

    assert train_main(["--quick", "--out", str(tmp_path / "run"), "--no-progress"]) == 0
    capsys.readouterr()
    runtime = CodecRuntime(default_model(tmp_path / "run")[0])
    crops = {n: np.ascontiguousarray(im[:128, :128]) for n, im in bundled(("astronaut", "coffee")).items()}
    decoded = {n: runtime.decode(runtime.encode(x).data) for n, x in crops.items()}
    a, b = (decoded[n].astype(np.int16) for n in crops)
    assert float(np.abs(a - b).mean()) > 10.0  # two inputs, two different images
    scores = {n: psnr(x, decoded[n]) for n, x in crops.items()}
    crossed = {n: psnr(x, decoded[m]) for (n, x), m in zip(crops.items(), reversed(crops), strict=True)}
    assert sum(scores.values()) / 2 > QUICK_FLOOR_DB, scores
    assert all(scores[n] > crossed[n] + 1.0 for n in crops), (scores, crossed)
