"""Ragged experts: exact conversion from fused and unfused layouts, decomposition identity, slicing, save/load."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from veil.training.compress.heapr import (
    RaggedExperts,
    convert_to_ragged,
    count_params,
    layout,
    load_pruned,
    moe_blocks,
    routed_expert_params,
    save_pruned,
)
from veil.training.compress.heapr.experts import expert_triples, set_expert_count


class ExpertMLP(nn.Module):
    """One expert as separate bias-free linear layers (the pre-v5 / custom-model layout)."""

    def __init__(self, gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor, act_fn: nn.Module) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(gate.shape[1], gate.shape[0], bias=False)
        self.up_proj = nn.Linear(up.shape[1], up.shape[0], bias=False)
        self.down_proj = nn.Linear(down.shape[1], down.shape[0], bias=False)
        self.act_fn = act_fn
        with torch.no_grad():
            self.gate_proj.weight.copy_(gate)
            self.up_proj.weight.copy_(up)
            self.down_proj.weight.copy_(down)


class UnfusedExperts(nn.ModuleList):
    """Per-expert modules behind the fused call signature (hidden (N, D), top-k index and weights (N, K))."""

    def forward(self, hidden: torch.Tensor, idx: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        out = torch.zeros_like(hidden)
        for i, expert in enumerate(self):
            token, slot = torch.where(idx == i)
            x = hidden[token]
            y = expert.down_proj(expert.act_fn(expert.gate_proj(x)) * expert.up_proj(x))
            out.index_add_(0, token, y * weights[token, slot, None])
        return out


def unfuse(model: nn.Module) -> nn.Module:
    """Replace every fused expert tensor pair by per-expert linear modules (same weights)."""
    for _, block in moe_blocks(model):
        act = block.experts.act_fn
        block.experts = UnfusedExperts([ExpertMLP(g, u, d, act) for g, u, d in expert_triples(block.experts)])
    return model


def ids(seed: int = 0, shape: tuple[int, int] = (2, 20)) -> torch.Tensor:
    return torch.randint(0, 256, shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("arch", ["qwen2_moe", "mixtral"])
def test_conversion_from_fused_is_exact(arch: str, moe_factory) -> None:
    model = moe_factory(arch)
    assert model.model.layers[0].mlp.experts.gate_up_proj.dim() == 3  # transformers v5 fuses the experts
    x = ids()
    ref, params = model(input_ids=x).logits, count_params(model)
    assert convert_to_ragged(model) == ["model.layers.0.mlp", "model.layers.1.mlp"]
    assert isinstance(model.model.layers[1].mlp.experts, RaggedExperts)
    assert count_params(model) == params
    torch.testing.assert_close(model(input_ids=x).logits, ref, rtol=0, atol=1e-6)


def test_unfused_layout_converts_to_the_same_experts(moe_factory) -> None:
    fused, unfused = moe_factory(), unfuse(moe_factory())
    x = ids()
    torch.testing.assert_close(unfused(input_ids=x).logits, fused(input_ids=x).logits, rtol=0, atol=1e-6)
    convert_to_ragged(fused)
    convert_to_ragged(unfused)
    for (_, a), (_, b) in zip(moe_blocks(fused), moe_blocks(unfused), strict=True):
        for ta, tb in zip(expert_triples(a.experts), expert_triples(b.experts), strict=True):
            for wa, wb in zip(ta, tb, strict=True):
                assert torch.equal(wa, wb)


def test_expert_output_is_the_sum_of_its_atomic_experts(moe_factory) -> None:
    model = moe_factory(seed=3)
    convert_to_ragged(model)
    experts = model.model.layers[0].mlp.experts
    x = torch.randn(10, experts.hidden_dim, generator=torch.Generator().manual_seed(0))  # (n, D)
    for i in range(experts.num_experts):
        a = experts.activations(x, i)  # (n, F)
        atoms = a[:, :, None] * experts.down_proj[i].T[None]  # (n, F, D): e_k(x) = a_k(x) w^down_k
        torch.testing.assert_close(atoms.sum(1), experts.expert_output(x, i), rtol=0, atol=1e-6)


def test_slicing_equals_masking_and_params_drop_exactly(moe_factory) -> None:
    sliced, masked = moe_factory(seed=4), moe_factory(seed=4)
    convert_to_ragged(sliced)
    convert_to_ragged(masked)
    g = torch.Generator().manual_seed(0)
    before, d, removed = count_params(sliced), sliced.config.hidden_size, 0
    for (_, bs), (_, bm) in zip(moe_blocks(sliced), moe_blocks(masked), strict=True):
        keep = [torch.randperm(w, generator=g)[: int(torch.randint(0, w + 1, (1,), generator=g))].sort().values
                for w in bs.experts.widths]
        with torch.no_grad():
            for i, k in enumerate(keep):
                drop = torch.ones(bm.experts.widths[i], dtype=torch.bool)
                drop[k] = False
                bm.experts.gate_proj[i][drop] = 0
                bm.experts.up_proj[i][drop] = 0
                bm.experts.down_proj[i][:, drop] = 0
                removed += int(drop.sum())
        bs.experts.keep_neurons(keep)
    x = ids(1)
    torch.testing.assert_close(sliced(input_ids=x).logits, masked(input_ids=x).logits, rtol=0, atol=1e-6)
    assert before - count_params(sliced) == removed * 3 * d  # gate row + up row + down column per atomic expert
    assert routed_expert_params(sliced) == routed_expert_params(masked) - removed * 3 * d


def test_zero_width_expert_outputs_zero() -> None:
    experts = RaggedExperts([0, 3], 4, nn.SiLU())
    hidden = torch.randn(5, 4)
    idx = torch.tensor([[0, 1]] * 5)
    only_zero = experts(hidden, torch.zeros(5, 1, dtype=torch.long), torch.ones(5, 1))
    assert torch.equal(only_zero, torch.zeros(5, 4))
    assert experts(hidden, idx, torch.ones(5, 2)).shape == (5, 4)


@pytest.mark.parametrize("arch", ["qwen2_moe", "mixtral"])
def test_ragged_model_saves_loads_and_generates(arch: str, tmp_path, moe_factory) -> None:
    model = moe_factory(arch, seed=5)
    convert_to_ragged(model)
    blocks = dict(moe_blocks(model))
    blocks["model.layers.0.mlp"].experts.keep_neurons([torch.arange(w) for w in (16, 3, 0, 9)])
    set_expert_count(blocks["model.layers.1.mlp"], [0, 2, 3])
    blocks["model.layers.1.mlp"].experts.keep_neurons([torch.arange(w) for w in (5, 16, 1)])
    x = ids(2)
    ref = model(input_ids=x).logits
    save_pruned(model, tmp_path / "pruned", {"note": "test"})
    loaded = load_pruned(tmp_path / "pruned")
    assert layout(loaded) == layout(model) == {
        "model.layers.0.mlp": {"experts": 4, "widths": [16, 3, 0, 9]},
        "model.layers.1.mlp": {"experts": 3, "widths": [5, 16, 1]}}
    assert count_params(loaded) == count_params(model)
    torch.testing.assert_close(loaded(input_ids=x).logits, ref, rtol=0, atol=0)
    out = loaded.generate(input_ids=x[:1, :5], max_new_tokens=6, do_sample=False)
    assert out.shape == (1, 11)


def test_unknown_expert_container_is_refused(moe_factory) -> None:
    with pytest.raises(ValueError, match="expected a fused"):
        expert_triples(nn.Linear(2, 2))
    with pytest.raises(ValueError, match="expected at least top_k=2"):
        model = moe_factory()
        convert_to_ragged(model)
        set_expert_count(model.model.layers[0].mlp, [1])
