"""The LM trainer: schedule, determinism, learning, checkpoint round trip, refused optimizers and sizes."""

from __future__ import annotations

import itertools
import json
import math

import pytest
import torch
from veil.training.lm import (
    PRESETS,
    LMModelConfig,
    LMTrainConfig,
    build_lm,
    evaluate,
    load_lm,
    load_pydoc_topics,
    save_lm,
    train_lm,
)
from veil.training.lm.config import LM_LR, full_model_optimizers
from veil.training.lm.data import eval_blocks
from veil.training.lm.trainer import lr_factor, optimizer_kwargs

from veil.config import ConfigError

MICRO = LMModelConfig(**PRESETS["micro"])
FAST = LMTrainConfig(lr=3e-3, steps=20, batch_size=8, block_size=64, eval_every=10, eval_blocks=16)


@pytest.fixture(scope="module")
def corpus():
    return load_pydoc_topics()


def test_presets_have_the_documented_sizes() -> None:
    sizes = {name: sum(p.numel() for p in build_lm(LMModelConfig(**preset)).parameters())
             for name, preset in PRESETS.items()}
    assert sizes == {"micro": 139_584, "tiny": 918_656, "small": 6_459_648}


def test_lr_schedule_warms_up_then_decays_to_the_floor() -> None:
    cfg = LMTrainConfig(steps=100, warmup=0.1, min_lr_ratio=0.1)
    factors = [lr_factor(s, cfg) for s in range(100)]
    assert factors[0] == pytest.approx(0.1) and factors[9] == pytest.approx(1.0)
    assert all(a >= b for a, b in itertools.pairwise(factors[9:]))
    assert factors[-1] == pytest.approx(0.1, abs=1e-3)


def test_same_seed_gives_the_same_loss_curve(corpus) -> None:
    a, b = train_lm(MICRO, FAST, corpus, progress=False), train_lm(MICRO, FAST, corpus, progress=False)
    c = train_lm(MICRO, FAST.replace(seed=1), corpus, progress=False)
    assert a.train_loss == b.train_loss and a.history == b.history
    assert a.train_loss != c.train_loss
    assert [h["step"] for h in a.history] == [0, 10, 20] and len(a.train_loss) == 20


def test_loss_decreases_in_a_few_dozen_steps(corpus, tmp_path) -> None:
    result = train_lm(MICRO, FAST.replace(steps=60, eval_every=20), corpus, progress=False)
    curve = [h["held_out_loss"] for h in result.history]
    assert curve[0] > math.log(256) - 0.3  # random init: about uniform over the 256 bytes
    assert curve[-1] < curve[0] - 1.5 and curve == sorted(curve, reverse=True)
    m = result.metrics
    assert m["held_out_perplexity"] == pytest.approx(math.exp(m["held_out_loss"]))
    assert m["parameters"] == 139_584 and m["parameter_bytes"] == 4 * 139_584
    assert m["optimizer_state_bytes"] >= 2 * m["parameter_bytes"]  # AdamW: two moments per weight

    save_lm(result, tmp_path / "ck", corpus)
    model, config = load_lm(tmp_path / "ck")
    blocks = eval_blocks(corpus.held_out, FAST.block_size, FAST.eval_blocks)
    assert evaluate(model, blocks) == m["held_out_loss"]
    assert config["kind"] == "lm" and config["model"] == MICRO.to_dict() and config["data"]["tokenizer"] == "bytes"
    saved = json.loads((tmp_path / "ck" / "metrics.json").read_text())
    assert len(saved["train_loss"]) == 60 and [h["step"] for h in saved["history"]] == [0, 20, 40, 60]
    assert not list(tmp_path.glob(".ck*"))  # the temporary folder was renamed into place


def test_tied_embeddings_round_trip(corpus, tmp_path) -> None:
    result = train_lm(MICRO.replace(tie_embeddings=True), FAST.replace(steps=4), corpus, progress=False)
    save_lm(result, tmp_path / "tied", corpus)
    model, _ = load_lm(tmp_path / "tied")
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    x = torch.arange(64)[None]  # (1, T)
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=x).logits, result.model(input_ids=x).logits, rtol=0, atol=0)


@pytest.mark.parametrize("name", ["adams", "lracs"])
def test_lora_only_optimizers_are_refused(name: str) -> None:
    with pytest.raises(ConfigError, match=rf"LMTrainConfig.optimizer: expected one of \[.*'adamw'.*\], "
                                          rf"received '{name}' \(it updates LoRA"):
        LMTrainConfig(optimizer=name)


def test_unknown_optimizer_and_bad_sizes_are_refused(corpus) -> None:
    with pytest.raises(ConfigError, match=r"LMTrainConfig\.optimizer: expected one of .* received 'sgdx'"):
        LMTrainConfig(optimizer="sgdx")
    with pytest.raises(ConfigError, match=r"LMModelConfig\.hidden_size: expected a multiple of 2\*num_heads=8"):
        LMModelConfig(hidden_size=36, num_heads=4)
    with pytest.raises(ValueError, match=r"LMTrainConfig\.block_size: expected <= LMModelConfig\.max_positions=32"):
        train_lm(MICRO.replace(max_positions=32), FAST, corpus, progress=False)


@pytest.mark.parametrize("name", full_model_optimizers())
def test_every_full_model_optimizer_trains_the_lm(name: str, corpus) -> None:
    cfg = FAST.replace(optimizer=name, lr=None, steps=30, eval_every=30)
    result = train_lm(MICRO, cfg, corpus, progress=False)
    assert result.metrics["lr"] == LM_LR[name] and result.metrics["optimizer"] == name
    assert result.history[-1]["held_out_loss"] < result.history[0]["held_out_loss"] - 1.0
    assert result.metrics["optimizer_state_bytes"] > 0
    assert train_lm(MICRO, cfg, corpus, progress=False).train_loss == result.train_loss


def test_optimizer_kwargs_scale_alice_to_the_model_and_user_args_win() -> None:
    alice = LMTrainConfig(optimizer="alice")
    assert optimizer_kwargs(MICRO, alice) == {"weight_decay": 0.0, "rank": 16, "leading": 5, "update_interval": 20}
    assert optimizer_kwargs(MICRO, alice.replace(steps=900))["update_interval"] == 18  # 2 % of the run (paper: 200/10K)
    assert optimizer_kwargs(MICRO, alice.replace(steps=10))["update_interval"] == 1
    tuned = alice.replace(optimizer_args={"rank": 8, "alpha_c": 0.0, "update_interval": 7})
    assert optimizer_kwargs(MICRO, tuned) == {"weight_decay": 0.0, "rank": 8, "leading": 2, "alpha_c": 0.0,
                                              "update_interval": 7}
    assert optimizer_kwargs(MICRO, LMTrainConfig(optimizer="racs", weight_decay=0.1)) == {"weight_decay": 0.1}
    with pytest.raises(ConfigError, match=r"LMTrainConfig\.optimizer_args: expected a JSON object, received 'rank=8'"):
        LMTrainConfig(optimizer_args="rank=8")
    with pytest.raises(ConfigError, match=r"LMTrainConfig\.lr: expected > 0, received -1"):
        LMTrainConfig(lr=-1.0)
