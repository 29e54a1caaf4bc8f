"""The torch side: configs, the fixed split, quantizer shapes, block-causal prior, deterministic training."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from veil.codec.scales import scale_sizes
from veil.training.codec.config import CodecModelConfig, CodecTrainConfig
from veil.training.codec.data import HELD_OUT, TRAIN, random_crops, skimage_images
from veil.training.codec.model import NextScalePrior, Tokenizer
from veil.training.codec.trainer import train_codec

from veil.config import ConfigError

TINY = {"d": 8, "bits": [4, 4, 4, 4, 6, 6, 6, 8, 8, 8], "channels": [8, 8, 8, 8], "prior_width": 16,
        "prior_layers": 1, "prior_heads": 2}


def test_config_errors_name_the_field() -> None:
    with pytest.raises(ConfigError, match=r"bits: expected one entry per scale \(10\), received 3"):
        CodecModelConfig(bits=[1, 2, 3])
    with pytest.raises(ConfigError, match=r"bits: expected values in \[1, d=12\]"):
        CodecModelConfig(bits=[13] * 10)
    with pytest.raises(ConfigError, match="srd"):
        CodecTrainConfig(srd=1.5)
    assert CodecModelConfig().stride == 16


def test_split_is_fixed_and_held_out_photos_are_refused() -> None:
    assert not set(TRAIN) & {*HELD_OUT, "cat"}
    with pytest.raises(ValueError, match="held out"):
        skimage_images(("rocket", "cat"))
    with pytest.raises(ValueError, match="held out"):
        skimage_images(("astronaut",))


def test_quantizer_tokens_follow_scales_and_masks() -> None:
    torch.manual_seed(0)
    cfg = CodecModelConfig(**TINY)
    tok = Tokenizer(cfg).eval()
    x = random_crops(list(skimage_images(("camera",)).values()), 2, 80, np.random.default_rng(0))
    with torch.no_grad():
        y, tokens, _ = tok(x)
    assert y.shape == x.shape
    sizes = scale_sizes(5, 5, cfg.scales)
    assert [tuple(t.shape) for t in tokens] == [(2, h, w, m) for (h, w), m in zip(sizes, cfg.bits, strict=True)]


def test_prior_is_block_causal() -> None:
    torch.manual_seed(0)
    prior = NextScalePrior(CodecModelConfig(**TINY)).eval()
    sid = torch.tensor([[0, 1, 1, 2, 2, 2, 2]])
    feats, pos = torch.randn(1, 7, 72), torch.randn(1, 7, 16)
    changed = feats.clone()
    changed[:, 3:] += 1.0  # only scale 2's inputs change
    with torch.no_grad():
        a, b = prior(feats, pos, sid), prior(changed, pos, sid)
    assert torch.equal(a[:, :3], b[:, :3]) and not torch.equal(a[:, 3:], b[:, 3:])


def test_training_is_deterministic_for_a_seed() -> None:
    images = list(skimage_images(("camera",)).values())
    cfg = CodecTrainConfig(tokenizer_steps=2, prior_steps=2, crop=64, prior_crop=64, batch_size=2, prior_crops=2)
    a = train_codec(CodecModelConfig(**TINY), cfg, images, progress=False)
    b = train_codec(CodecModelConfig(**TINY), cfg, images, progress=False)
    for m1, m2 in ((a.tokenizer, b.tokenizer), (a.prior, b.prior)):
        assert all(torch.equal(p, q) for p, q in zip(m1.state_dict().values(), m2.state_dict().values(), strict=True))
    assert set(a.metrics) == {"tokenizer_loss", "prior_bits_per_active_bit", "train_seconds"}


def test_train_cli_writes_a_run_usable_by_veil_codec(tmp_path, capsys) -> None:
    import json

    from veil.codec.cli import main as codec_main
    from veil.codec.images import png_bytes
    from veil.export.codec_cli import train_main as main  # `veil train codec`: train, then export

    flags = ["--tokenizer-steps", "2", "--prior-steps", "2", "--crop", "64", "--prior-crop", "64", "--batch-size", "2",
             "--prior-crops", "2", "--channels", "8", "8", "8", "8", "--prior-width", "16", "--prior-layers", "1",
             "--prior-heads", "2", "--no-progress"]
    assert main(["--out", str(tmp_path / "run"), *flags]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["model"].endswith("codec") and summary["validation"]["prior"] <= 1e-4
    (tmp_path / "x.png").write_bytes(png_bytes(np.zeros((40, 50, 3), np.uint8)))
    assert codec_main(["encode", str(tmp_path / "x.png"), "-o", str(tmp_path / "x.vc"), "--model",
                       str(tmp_path / "run")]) == 0


def test_untrained_encoder_depends_on_its_input() -> None:
    """Regression: with torch's default conv init the biases dominate after a few layers, so two photos got the
    same latent (distance 2e-4), the same tokens and the same decoded image; short (--quick) runs never left it."""
    from veil.codec.images import bundled

    torch.manual_seed(0)
    tok = Tokenizer(CodecModelConfig(channels=[16, 32, 32, 48])).eval()
    x = torch.stack([torch.from_numpy(np.ascontiguousarray(im[:128, :128].transpose(2, 0, 1)) / 255.0 - 0.5).float()
                     for im in bundled(("astronaut", "coffee")).values()])
    with torch.no_grad():
        z = tok.encoder(x)
        _, tokens, _ = tok.quantize(z)
    assert float((z[0] - z[1]).norm(dim=0).mean()) > 0.3
    assert float((tokens[-1][0] != tokens[-1][1]).float().mean()) > 0.2


def test_checkpoints_are_written_every_n_steps_and_a_tokenizer_can_be_reused() -> None:
    images = list(skimage_images(("camera",)).values())
    cfg = CodecTrainConfig(tokenizer_steps=4, prior_steps=2, crop=64, prior_crop=64, batch_size=2, prior_crops=2,
                           checkpoint_every=2)
    seen = []
    result = train_codec(CodecModelConfig(**TINY), cfg, images, progress=False,
                         checkpoint=lambda r: seen.append((r.metrics["stage"], r.metrics["step"])))
    assert seen == [("tokenizer", 2), ("tokenizer", 4), ("prior", 2)]
    before = {k: v.clone() for k, v in result.tokenizer.state_dict().items()}
    again = train_codec(CodecModelConfig(**TINY), cfg, images, progress=False, tokenizer=result.tokenizer)
    assert all(torch.equal(before[k], v) for k, v in again.tokenizer.state_dict().items())  # stage 1 skipped
    assert "tokenizer_loss" not in again.metrics and "prior_bits_per_active_bit" in again.metrics
    with pytest.raises(ConfigError, match="checkpoint_every: expected >= 0, received -1"):
        CodecTrainConfig(checkpoint_every=-1)
