"""mtLoRA (spec §1.7): parameter counts from shapes, zero-init identity, routing invariants, placement, both spectral
modes against numpy, config round trip, registry entry, refusal to merge."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM, LlamaModel
from veil.training.adapters import AdapterModel, inject
from veil.training.adapters.mtlora import MtLoraConfig, MtLoraModel, block_param_count
from veil.training.adapters.mtlora.spectral import official_per_b, paper_cross_expert, spectral_weights
from veil.training.adapters.registry import AdapterMethod, get_method

TINY = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "intermediate_size": 64, "vocab_size": 64}


def tiny_llama(seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(**TINY)).eval()


def ids() -> torch.Tensor:
    return torch.randint(0, TINY["vocab_size"], (2, 6), generator=torch.Generator().manual_seed(1))


def randomize(model: AdapterModel, seed: int = 2) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)


def meta_llama7b_count(**kw) -> int:
    cfg = LlamaConfig(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
                      num_key_value_heads=32, vocab_size=32000)
    with torch.device("meta"):
        model = inject(LlamaModel(cfg), MtLoraConfig(r=16, num_experts=16, **kw))
    return model.trainable_report()["trainable"]


@pytest.mark.parametrize(("kw", "expected"), [
    ({"target_modules": ["q_proj", "v_proj"], "routing_groups": 1}, 75_497_472),  # component-level HydraLoRA
    ({"block_adapter_type": "ffn", "routing_groups": 1}, 37_748_736),  # block-level, scalar routing
    ({"block_adapter_type": "ffn", "routing_groups": 2}, 39_845_888),  # block-level + FGR g = 2
])
def test_parameter_count_llama2_7b_meta(kw, expected) -> None:
    """§1.7.1: the README's 75.5M / 37.7M / 39.8M from shapes only (meta device)."""
    assert meta_llama7b_count(**kw) == expected
    assert block_param_count(4096, 4096, 16, 16, kw["routing_groups"]) * (64 if "target_modules" in kw else 32) \
        == expected


@pytest.mark.parametrize("mode", ["eval", "train"])
def test_zero_init_is_identity(mode: str) -> None:
    base = tiny_llama()
    ref = base(ids()).logits
    model = inject(base, MtLoraConfig(r=4, num_experts=3, lora_dropout=0.0, block_adapter_type="both"))
    getattr(model, mode)()
    assert torch.equal(model(ids()).logits, ref)


def block(**kw) -> tuple[MtLoraModel, nn.Module]:
    cfg = {"r": 4, "num_experts": 3, "lora_dropout": 0.0, "routing_groups": 2, **kw}
    model = inject(tiny_llama(), MtLoraConfig(**cfg))
    randomize(model)
    return model, model.model.model.layers[0].mlp


def test_routing_sums_to_one_per_group() -> None:
    _, layer = block(routing_groups=4)
    pi = layer.routing(torch.randn(2, 5, 32))
    assert pi.shape == (2, 5, 4, 3)
    assert torch.allclose(pi.sum(-1), torch.ones(2, 5, 4))


def test_equal_experts_make_output_router_independent() -> None:
    _, layer = block()
    x = torch.randn(2, 5, 32)
    with torch.no_grad():
        layer.lora_B.copy_(layer.lora_B[:1].expand_as(layer.lora_B))
        first = layer.delta_forward(x)
        layer.lora_router.weight.normal_()
        assert torch.allclose(layer.delta_forward(x), first, atol=1e-6)


def test_g1_is_scalar_routing_and_n1_is_plain_low_rank() -> None:
    _, layer = block(routing_groups=1)
    x = torch.randn(2, 5, 32)
    with torch.no_grad():
        p = layer.lora_router(x).softmax(-1)  # (2, 5, N) scalar weight per expert
        h = layer.lora_A(x)
        manual = layer.scaling * sum(p[..., i:i + 1] * (h @ layer.lora_B[i].T) for i in range(3))
        assert torch.allclose(layer.delta_forward(x), manual, atol=1e-6)
    _, single = block(num_experts=1)
    with torch.no_grad():
        plain = single.scaling * single.lora_A(x) @ single.lora_B[0].T
        assert torch.allclose(single.delta_forward(x), plain, atol=1e-6)


def test_adapter_sees_sublayer_input_and_adds_before_residual() -> None:
    model, layer = block()
    seen = {}
    layer.base_layer.register_forward_pre_hook(lambda m, a: seen.__setitem__("sub", a[0]))
    layer.register_forward_hook(lambda m, a, out: seen.update(block_in=a[0], out=out))
    with torch.no_grad():
        model(ids())
        assert seen["block_in"] is seen["sub"]  # the very same LayerNorm'd tensor
        assert torch.allclose(seen["out"], layer.base_layer(seen["sub"]) + layer.delta_forward(seen["sub"]))


def test_paper_router_is_mean_pooled() -> None:
    _, layer = block(router="mlp_mean_pool")
    x = torch.randn(2, 5, 32)
    pi = layer.routing(x)
    assert pi.shape == (2, 1, 2, 3) and torch.allclose(pi.sum(-1), torch.ones(2, 1, 2))
    assert torch.allclose(layer.routing(x.flip(1)), pi, atol=1e-6)  # order-free: depends on the mean only


def np_weights(s: np.ndarray) -> np.ndarray:
    return np.exp(-s / (s.mean() + 1e-12))


def test_spectral_weights_decrease_in_sigma() -> None:
    w = spectral_weights(torch.tensor([5.0, 3.0, 1.0, 0.0]))
    assert torch.all(w[1:] > w[:-1]) and w[-1] == 1.0


def test_official_per_b_matches_numpy() -> None:
    g = np.random.default_rng(0)
    bs = [g.standard_normal((10, 4)) for _ in range(3)]
    expected = []
    for b in bs:
        w = np_weights(np.linalg.svd(b, compute_uv=False))
        diff = b.T @ b - np.eye(4) * (np.linalg.norm(b) / 2.0) ** 2
        expected.append(((np.outer(w, w) * diff) ** 2).sum())
    got = official_per_b([torch.from_numpy(b) for b in bs])
    assert abs(got.item() - np.mean(expected)) <= 1e-9 * np.mean(expected)


@pytest.mark.parametrize("keep_sigma", [True, False])
def test_paper_cross_expert_matches_numpy(keep_sigma: bool) -> None:
    bs = np.random.default_rng(1).standard_normal((3, 10, 4))
    primes = []
    for b in bs:
        u, s, vh = np.linalg.svd(b, full_matrices=False)
        primes.append(u @ np.diag(np_weights(s) * (s if keep_sigma else 1.0)) @ vh)
    expected = sum(np.linalg.norm(primes[i].T @ primes[j]) ** 2 for i in range(3) for j in range(i + 1, 3))
    got = paper_cross_expert(torch.from_numpy(bs), keep_sigma)
    assert abs(got.item() - expected) <= 1e-9 * expected


def test_paper_mode_zero_for_orthogonal_column_spaces() -> None:
    q, _ = torch.linalg.qr(torch.randn(12, 12, dtype=torch.float64))
    bs = torch.stack([q[:, 4 * i:4 * i + 4] @ torch.randn(4, 4, dtype=torch.float64) for i in range(3)])
    assert paper_cross_expert(bs).item() <= 1e-20


def test_paper_mode_gradient_spares_shared_top_direction() -> None:
    """§1.7.5: two B's sharing a strong direction u1 and a weak one u2: ∂L/∂(top) ≪ ∂L/∂(bottom)."""
    u = torch.linalg.qr(torch.randn(8, 2, dtype=torch.float64))[0]
    b = torch.stack([u @ torch.diag(torch.tensor([5.0, 0.1], dtype=torch.float64)) for _ in range(2)]).requires_grad_()
    paper_cross_expert(b).backward()
    top, bottom = (u[:, 0] @ b.grad[0][:, 0]).abs(), (u[:, 1] @ b.grad[0][:, 1]).abs()
    assert top < 1e-3 * bottom


def test_aux_loss_schedule_and_balance() -> None:
    model, _ = block(spectral_every=3, balance_alpha=0.5, spectral_lambda=2.0)
    model.train()
    model(ids())
    cv2 = []
    for layer in model.adapter_layers().values():  # CV² of the per-expert mean routing weight, in numpy
        p_bar = layer.last_routing.reshape(-1, 3).mean(0).detach().numpy()
        cv2.append(p_bar.var() / (p_bar.mean() ** 2 + 1e-10))
    assert len(cv2) == 2 and abs(model.balance_loss().item() - np.mean(cv2)) < 1e-6
    spectral = model.spectral_loss().item()
    totals = [model.aux_loss().item() for _ in range(4)]
    balance = 0.5 * model.balance_loss().item()
    assert np.allclose(totals, [balance + 2 * spectral, balance, balance, balance + 2 * spectral], rtol=1e-5)


def test_config_json_round_trip_and_checkpoint(tmp_path) -> None:
    cfg = MtLoraConfig(r=4, num_experts=3, spectral_mode="paper_cross_expert", router="mlp_mean_pool")
    assert MtLoraConfig.from_json(cfg.to_json()) == cfg and cfg.target_modules == ["mlp"]
    model, _ = block(spectral_mode="paper_cross_expert")
    model.save_pretrained(tmp_path / "a")
    again = AdapterModel.from_pretrained(tiny_llama(), tmp_path / "a")
    assert isinstance(again, MtLoraModel) and again.config == model.config
    with torch.no_grad():
        assert torch.equal(again(ids()).logits, model(ids()).logits)


def test_registry_entry_and_merge_refused() -> None:
    entry = get_method("mtlora")
    assert entry.method is AdapterMethod.MTLORA and entry.config_cls is MtLoraConfig and entry.model_cls is MtLoraModel
    model, _ = block()
    with pytest.raises(NotImplementedError, match="not mergeable"):
        model.merge_and_unload()


def test_bad_routing_groups_named() -> None:
    with pytest.raises(ValueError, match="routing_groups: expected a divisor of the sub-layer output dim 32, received 3"):
        inject(tiny_llama(), MtLoraConfig(r=4, routing_groups=3))


def test_synthetic_suite_is_seeded_and_shares_a_dominant_component() -> None:
    from veil.training.adapters.mtlora.synthetic import make_suite

    a, b = make_suite(seed=3), make_suite(seed=3)
    xa, _, ya, _ = a.sample(64, torch.Generator().manual_seed(0))
    xb, _, yb, _ = b.sample(64, torch.Generator().manual_seed(0))
    assert torch.equal(xa, xb) and torch.equal(ya, yb) and a.num_tasks == 20
    sigma_shared = torch.linalg.svdvals(a.shared)
    sigma_specific = torch.linalg.svdvals(a.maps - a.shared)[:, 0].median()  # typical top task-specific σ
    assert sigma_shared[1] > 1.5 * sigma_specific and torch.linalg.matrix_rank(a.shared) == 2
