"""`veil export codec`: the repository entry, ONNX vs torch parity, the artifact hash, the CLI."""

from __future__ import annotations

import json

import numpy as np
import onnxruntime as ort
import pytest
import torch
from veil.codec.runtime import artifact_hash
from veil.export.codec_cli import main
from veil.training.codec.config import CodecModelConfig, CodecTrainConfig
from veil.training.codec.data import skimage_images
from veil.training.codec.trainer import load_codec, save_codec, train_codec

TINY = CodecModelConfig(d=8, bits=[4, 4, 4, 4, 6, 6, 6, 8, 8, 8], channels=[8, 8, 8, 8], prior_width=16,
                        prior_layers=1, prior_heads=2)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    images = skimage_images(("camera",))
    train = CodecTrainConfig(tokenizer_steps=2, prior_steps=2, crop=64, prior_crop=64, batch_size=2, prior_crops=2)
    out = tmp_path_factory.mktemp("codec") / "ck"
    save_codec(train_codec(TINY, train, list(images.values()), progress=False), out, sorted(images))
    return out


def test_export_writes_a_servable_entry(checkpoint, tmp_path, capsys) -> None:
    assert main([str(checkpoint), "--repo", str(tmp_path), "--name", "tiny"]) == 0
    summary = json.loads(capsys.readouterr().out)
    folder = tmp_path / "tiny"
    assert 'backend: "veil_codec"' in (folder / "config.pbtxt").read_text()
    assert 'default_model_filename: "codec.json"' in (folder / "config.pbtxt").read_text()
    manifest = json.loads((folder / "veil.json").read_text())
    assert manifest["kind"] == "codec" and manifest["model_hash"] == artifact_hash(folder / "1") == summary["model_hash"]
    assert all(v <= 1e-4 for k, v in manifest["validation"].items() if k != "tolerance")
    spec = json.loads((folder / "1" / "codec.json").read_text())
    assert spec["bits"] == TINY.bits and len(spec["alphas"]) == 10 and spec["stride"] == 16

    tok, _prior, _ = load_codec(checkpoint)
    x = torch.rand(1, 3, 112, 64) - 0.5  # a shape the export never saw
    enc = ort.InferenceSession(str(folder / "1" / "encoder.onnx")).run(None, {"image": x.numpy()})[0]
    with torch.no_grad():
        want = tok.encoder(x).numpy()
    assert np.abs(enc - want).max() < 1e-4


def test_bad_name_is_refused(checkpoint, tmp_path) -> None:
    with pytest.raises(ValueError, match="--name"):
        main([str(checkpoint), "--repo", str(tmp_path), "--name", "../x"])


def test_a_failed_export_publishes_no_half_model(checkpoint, tmp_path, monkeypatch) -> None:
    # issue 19 item 14: the version folder used to be visible before config.pbtxt and veil.json
    from veil.export import codec as export_codec_module

    real = export_codec_module.write_atomic

    def fail_on_config(path, data, *args, **kwargs):
        if str(path).endswith("config.pbtxt"):
            raise OSError("killed before config.pbtxt")
        return real(path, data, *args, **kwargs)

    monkeypatch.setattr(export_codec_module, "write_atomic", fail_on_config)
    with pytest.raises(OSError, match="killed"):
        export_codec_module.export_codec(checkpoint, tmp_path / "repo", "codec")
    assert not (tmp_path / "repo" / "codec").exists()
