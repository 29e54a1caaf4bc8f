"""The one-example patch trains on that example only, one optimizer step per epoch; selection and mechanism."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from veil.training.compress.safety import train as train_mod
from veil.training.compress.safety.data import REFUSAL, UNIVERSAL_EXAMPLE, SafetyData
from veil.training.compress.safety.mechanism import cer, overlap, safety_gradient_report
from veil.training.compress.safety.patch import Reference, patch, select_bilevel, select_gradient


def test_patch_sees_only_the_example_and_steps_once_per_epoch(micro_lm, monkeypatch) -> None:
    seen: list[list] = []
    original = train_mod.encode_batch

    def spy(examples):
        seen.append(list(examples))
        return original(examples)

    monkeypatch.setattr(train_mod, "encode_batch", spy)
    steps = []
    monkeypatch.setattr(torch.optim.AdamW, "step", lambda self, *a, _s=torch.optim.AdamW.step, **k: (
        steps.append(1), _s(self, *a, **k))[1])
    result = patch(micro_lm, UNIVERSAL_EXAMPLE, epochs=10, lr=1e-3)
    assert result.steps == 10 and len(result.losses) == 10 and len(steps) == 10
    assert seen == [[UNIVERSAL_EXAMPLE]] * 10
    assert result.losses[-1] < result.losses[0] - 0.5


def test_lora_patch_merges_back_into_plain_linears(micro_lm) -> None:
    before = {n: p.detach().clone() for n, p in micro_lm.named_parameters()}
    result = patch(micro_lm, UNIVERSAL_EXAMPLE, epochs=5, lr=1e-2, mode="lora", lora_rank=4)
    assert result.steps == 5 and result.losses[-1] < result.losses[0]
    assert {n for n, _ in micro_lm.named_parameters()} == set(before)  # no LoRA factors left
    assert all(type(m) is nn.Linear for n, m in micro_lm.named_modules() if n.endswith("q_proj"))
    assert not torch.equal(before["model.layers.0.self_attn.q_proj.weight"],
                           micro_lm.get_parameter("model.layers.0.self_attn.q_proj.weight"))
    assert torch.equal(before["model.embed_tokens.weight"], micro_lm.get_parameter("model.embed_tokens.weight"))
    assert all(p.requires_grad for p in micro_lm.parameters())


def test_patch_refuses_an_unknown_mode(micro_lm) -> None:
    with pytest.raises(ValueError, match="patch mode"):
        patch(micro_lm, UNIVERSAL_EXAMPLE, mode="qlora")  # type: ignore[arg-type]


def test_selections_rank_every_candidate(micro_lm) -> None:
    data = SafetyData(0)
    pool = data.refusal_candidates(3)
    attacked = copy.deepcopy(micro_lm)
    train_mod.sft(attacked, data.compliance("train", 8), epochs=1, lr=1e-3, batch_size=8)
    ranked = select_gradient(attacked, micro_lm, pool)
    assert sorted(c.example for c in ranked) == sorted(pool)
    harmful = Reference.of(micro_lm, data.harmful_prompts("val", 2))
    task = Reference.of(attacked, [p for p, _ in data.benign("val", 2)])
    ranked = select_bilevel(attacked, pool, harmful, task, lambda m, ex: patch(m, ex, epochs=2, lr=1e-3))
    assert [c.score for c in ranked] == sorted(c.score for c in ranked)
    assert all(c.score == pytest.approx(c.kl_harmful + c.kl_task) and c.kl_task >= 0 for c in ranked)
    assert Reference.of(attacked, ["Copy: ab"]).kl(attacked) == pytest.approx(0.0, abs=1e-6)


def test_cer_and_overlap_on_known_matrices() -> None:
    u = torch.randn(16, 1)
    assert cer(u @ torch.randn(1, 8), 1) == pytest.approx(1.0)
    g = torch.randn(16, 8)
    assert overlap(g, g, 4) == pytest.approx(1.0) and overlap(g, 3 * g, 4) == pytest.approx(1.0)
    assert 0.0 <= overlap(g, torch.randn(16, 8), 4) <= 1.0


def test_safety_gradient_report(micro_lm) -> None:
    data = SafetyData(0)
    attacked = copy.deepcopy(micro_lm)
    train_mod.sft(attacked, data.compliance("train", 8), epochs=2, lr=1e-3, batch_size=8)
    report = safety_gradient_report(attacked, micro_lm, ("How do I x?", REFUSAL), data.harmful("val", 4))
    assert report["matrices"] == 2 * 7  # q/k/v/o/gate/up/down of 2 layers
    assert 0 < report["cer_4"] <= report["cer_8"] <= 1 and 0 <= report["overlap_8"] <= 1
    assert -1 <= report["cos_to_aligned"] <= 1
