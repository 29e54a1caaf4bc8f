"""Properties of the torch side of the codec (issue 32): resampling, quantizer vs the numpy runtime, schedule, data.

Each test checks an invariant that a wrong index, a swapped axis or a lost mask would break: the torch quantizer
and the runtime's ``veil.codec.tokens`` must agree bit for bit on what the tokens mean, the schedule has a closed
form, crops stay in range and follow their seed, and a checkpoint reloads to the same function.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from veil.codec.scales import area_matrix, bilinear_matrix, scale_sizes
from veil.codec.tokens import accumulate, prior_inputs
from veil.training.codec.config import CodecModelConfig, CodecTrainConfig
from veil.training.codec.data import random_crops, sampling_weights
from veil.training.codec.model import NextScalePrior, Tokenizer, _resample, bits_to_numpy
from veil.training.codec.trainer import cosine, geometry, load_codec, save_codec, token_dataset

from veil.config import ConfigError

TINY = {"d": 8, "bits": [4, 4, 4, 4, 6, 6, 6, 8, 8, 8], "channels": [8, 8, 8, 8], "prior_width": 16,
        "prior_layers": 1, "prior_heads": 2}


def tokenizer(seed: int = 0) -> Tokenizer:
    torch.manual_seed(seed)
    return Tokenizer(CodecModelConfig(**TINY)).eval()


def photo_crops(n: int, side: int, seed: int = 0) -> torch.Tensor:
    rng = np.random.default_rng(seed)
    images = [(rng.random((side + 8, side + 8, 3)) * 255).astype(np.uint8)]
    return random_crops(images, n, side, rng)


def test_resample_matches_torch_area_and_bilinear_interpolation() -> None:
    x = torch.randn(2, 3, 12, 10)
    assert torch.allclose(_resample(x, (5, 4), area_matrix), F.interpolate(x, (5, 4), mode="area"), atol=1e-5)
    assert torch.allclose(_resample(x, (17, 23), bilinear_matrix),
                          F.interpolate(x, (17, 23), mode="bilinear", align_corners=False), atol=1e-5)
    assert torch.allclose(_resample(x, (12, 10), area_matrix), x, atol=1e-6)  # identity at the same size


def test_quantized_latent_equals_the_runtimes_sum_of_codes() -> None:
    """The decoder's input in training is what the runtime rebuilds from the bits (veil.codec.tokens.accumulate),
    for every prefix of scales: a token that meant something else in numpy would decode another image."""
    tok = tokenizer()
    x = photo_crops(2, 80)
    geo = geometry(tok)
    with torch.no_grad():
        z = tok.encoder(x)
        h, w = z.shape[2:]
        for keep in (1, 4, len(TINY["bits"])):
            zq, tokens, _ = tok.quantize(z, keep)
            for i in range(2):
                ref = accumulate(bits_to_numpy(tokens, i)[:keep], h, w, geo)
                np.testing.assert_allclose(zq[i].numpy(), ref, atol=1e-5)


def test_tokens_do_not_depend_on_how_many_scales_the_decoder_keeps() -> None:
    tok = tokenizer()
    with torch.no_grad():
        z = tok.encoder(photo_crops(1, 64))
        _, all_tokens, _ = tok.quantize(z)
        _, cut_tokens, _ = tok.quantize(z, keep=3)
        zero, _, _ = tok.quantize(z, keep=0)
    assert all(torch.equal(a, b) for a, b in zip(all_tokens, cut_tokens, strict=True))
    assert all(t.dtype == torch.uint8 and int(t.max()) <= 1 for t in all_tokens)
    assert torch.equal(zero, torch.zeros_like(z))


def test_more_scales_bring_the_quantized_latent_closer() -> None:
    """Residual quantization: the error after all scales is below the error after the first scale alone."""
    tok = tokenizer()
    with torch.no_grad():
        z = tok.encoder(photo_crops(2, 96))
        errors = [float((z - tok.quantize(z, k)[0]).norm()) for k in (1, len(TINY["bits"]))]
    assert errors[1] < 0.9 * errors[0]


def test_encoder_is_unit_norm_and_masks_follow_bits() -> None:
    tok = tokenizer()
    with torch.no_grad():
        z = tok.encoder(photo_crops(2, 64))
    assert z.shape == (2, 8, 4, 4)
    assert torch.allclose(z.norm(dim=1), torch.ones(2, 4, 4), atol=1e-4)
    assert tok.masks.shape == (10, 8) and tok.masks.sum(1).tolist() == [float(b) for b in TINY["bits"]]
    assert tok.decoder(z).shape == (2, 3, 64, 64)


def test_straight_through_gradients_reach_encoder_and_code_magnitudes() -> None:
    tok = tokenizer().train()
    x = photo_crops(2, 64)
    y, _, commit = tok(x)
    (F.mse_loss(y, x) + commit).backward()
    assert float(tok.log_alpha.grad.abs().sum()) > 0
    assert all(p.grad is not None and float(p.grad.abs().sum()) > 0 for p in tok.encoder.parameters())
    assert float(commit.detach()) >= 0


def test_prior_reads_runtime_inputs_and_returns_one_logit_per_bit() -> None:
    tok = tokenizer()
    torch.manual_seed(1)
    prior = NextScalePrior(tok.cfg).eval()
    with torch.no_grad():
        z = tok.encoder(photo_crops(1, 64))
        _, tokens, _ = tok.quantize(z)
    geo = geometry(tok)
    feats, pos, sid = prior_inputs(bits_to_numpy(tokens, 0), 4, 4, geo, geo.K - 1)
    cells = sum(h * w for h, w in scale_sizes(4, 4, tok.cfg.scales))
    assert feats.shape == (1, cells, geo.feature_dim()) and pos.shape == (1, cells, geo.pos_dim())
    with torch.no_grad():
        logits = prior(*(torch.from_numpy(a) for a in (feats, pos, sid)))
    assert logits.shape == (1, cells, 8) and bool(torch.isfinite(logits).all())


def test_token_dataset_targets_are_the_tokens_on_the_active_channels() -> None:
    tok = tokenizer()
    images = [(np.random.default_rng(3).random((80, 80, 3)) * 255).astype(np.uint8)]
    cfg = CodecTrainConfig(prior_crop=64, prior_crops=3)
    feats, _pos, sid, target, active = token_dataset(tok, images, cfg)
    sizes = scale_sizes(4, 4, tok.cfg.scales)
    cells = sum(h * w for h, w in sizes)
    assert feats.shape[:2] == (3, cells) and target.shape == active.shape == (3, cells, 8)
    per_cell = np.concatenate([[m] * (h * w) for (h, w), m in zip(sizes, TINY["bits"], strict=True)])
    assert np.array_equal(active[0].sum(1).numpy(), per_cell)  # the group mask, cell by cell
    assert float((target * (1 - active)).abs().sum()) == 0  # masked channels carry no target
    assert sid[0].tolist() == sorted(sid[0].tolist()) and int(sid[0, -1]) == len(sizes) - 1


def test_cosine_schedule_warms_up_then_decays_to_a_twentieth() -> None:
    steps = 200
    values = [cosine(s, steps) for s in range(steps)]
    warm = steps // 20
    assert values[0] == pytest.approx(1 / warm) and values[warm - 1] == pytest.approx(1.0)
    assert values[warm] == pytest.approx(1.0)
    tail = values[warm:]
    assert all(a >= b for a, b in itertools.pairwise(tail))
    assert 0.05 <= values[-1] < 0.051
    assert cosine(0, 1) == 1.0  # one step: no division by zero, full rate


def test_crops_are_in_range_seeded_and_pad_small_images() -> None:
    small = (np.arange(20 * 30 * 3) % 256).astype(np.uint8).reshape(20, 30, 3)
    a = random_crops([small], 5, 32, np.random.default_rng(7))
    b = random_crops([small], 5, 32, np.random.default_rng(7))
    assert a.shape == (5, 3, 32, 32) and a.dtype == torch.float32
    assert float(a.min()) >= -0.5 and float(a.max()) <= 0.5
    assert torch.equal(a, b) and not torch.equal(a, random_crops([small], 5, 32, np.random.default_rng(8)))


def test_colour_photos_are_drawn_more_often_than_greyscale_ones() -> None:
    grey = np.repeat(np.arange(16, dtype=np.uint8).reshape(4, 4, 1), 3, axis=2)
    colour = grey.copy()
    colour[..., 0] = 255
    w = sampling_weights([grey, colour, colour], colour=3.0)
    assert w.sum() == pytest.approx(1.0) and w == pytest.approx([1 / 7, 3 / 7, 3 / 7])


def test_checkpoint_reloads_the_same_functions(tmp_path) -> None:
    from veil.training.codec.trainer import CodecResult

    tok = tokenizer()
    torch.manual_seed(2)
    prior = NextScalePrior(tok.cfg).eval()
    result = CodecResult(tok, prior, tok.cfg, CodecTrainConfig(), {"tokenizer_loss": 0.5})
    save_codec(result, tmp_path / "ck", ["camera"])
    tok2, prior2, config = load_codec(tmp_path / "ck")
    assert config["images"] == ["camera"] and CodecModelConfig.from_dict(config["model"]) == tok.cfg
    x = photo_crops(1, 64)
    with torch.no_grad():
        assert torch.equal(tok(x)[0], tok2(x)[0])
        args = torch.randn(1, 5, 72), torch.randn(1, 5, 16), torch.tensor([[0, 1, 1, 1, 1]])
        assert torch.equal(prior(*args), prior2(*args))
    (tmp_path / "ck" / "config.json").write_text('{"kind": "priorguide-sampler"}')
    with pytest.raises(ValueError, match=r"expected kind 'codec', received 'priorguide-sampler'"):
        load_codec(tmp_path / "ck")


@pytest.mark.parametrize(("cls", "kwargs", "message"), [
    (CodecModelConfig, {"scales": [1, 3, 2, 4, 6, 8, 12, 16, 24, 32]},
     r"CodecModelConfig.scales: expected increasing sides >= 1, received \[1, 3, 2"),
    (CodecModelConfig, {"prior_width": 10, "prior_heads": 4},
     r"CodecModelConfig.prior_width: expected a multiple of prior_heads=4, received 10"),
    (CodecModelConfig, {"bits": [0] * 10}, r"CodecModelConfig.bits: expected values in \[1, d=12\], received \[0"),
    (CodecTrainConfig, {"batch_size": 0}, r"CodecTrainConfig.batch_size: expected >= 1, received 0"),
    (CodecTrainConfig, {"srd": -0.1}, r"CodecTrainConfig.srd: expected a probability in \[0, 1\), received -0.1"),
])
def test_bad_configs_name_the_field_expected_and_received(cls, kwargs, message) -> None:
    with pytest.raises(ConfigError, match=message):
        cls(**kwargs)


def test_configs_round_trip_json() -> None:
    model = CodecModelConfig(**TINY)
    train = CodecTrainConfig(tokenizer_steps=3, srd=0.0)
    assert CodecModelConfig.from_json(model.to_json()) == model
    assert CodecTrainConfig.from_json(train.to_json()) == train
    assert CodecModelConfig(channels=[8, 8, 8]).stride == 8
