"""LoRA-Mixer (spec §3.6): one-hot routing equals PEFT LoRA, plug-and-play over PEFT folders (router-only training),
∂H/∂p, RSL against numpy in both signs, the entropy sign's direction, top-K routing, config round trip, registry."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from peft import LoraConfig as PeftLoraConfig
from peft import get_peft_model
from torch import nn
from transformers import BertConfig, BertModel
from veil.training.adapters import AdapterModel, LoraConfig, inject
from veil.training.adapters.loramixer import (
    LoraMixer,
    LoraMixerConfig,
    LoraMixerLinear,
    LoraMixerModel,
    routing_entropy,
    rsl,
)
from veil.training.adapters.registry import AdapterMethod, get_method

TINY = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 64, "vocab_size": 64}
QKVO = ["query", "key", "value", "attention.output.dense"]  # BERT's attention input/output projections


def tiny_bert(seed: int = 0) -> BertModel:
    torch.manual_seed(seed)
    return BertModel(BertConfig(**TINY)).eval()


def ids() -> torch.Tensor:
    return torch.randint(0, TINY["vocab_size"], (2, 7), generator=torch.Generator().manual_seed(1))


def randomize(model: nn.Module, seed: int, only: str = "") -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if only in name and (p.requires_grad or only):
                p.copy_(torch.randn(p.shape, generator=g) * 0.2)


def out(model: nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids()).last_hidden_state


@pytest.fixture(scope="module")
def peft_dirs(tmp_path_factory) -> tuple[list, list[torch.Tensor]]:
    """Three PEFT LoRA folders (different ranks/alphas, random B) and each one's reference output on tiny BERT."""
    root, dirs, refs = tmp_path_factory.mktemp("peft"), [], []
    for e, (r, alpha) in enumerate([(4, 8), (2, 2), (3, 12)]):
        peft_model = get_peft_model(tiny_bert(), PeftLoraConfig(r=r, lora_alpha=alpha, target_modules=QKVO))
        randomize(peft_model, seed=10 + e, only="lora_")
        refs.append(out(peft_model))
        peft_model.save_pretrained(root / f"a{e}")
        dirs.append(root / f"a{e}")
    return dirs, refs


def test_plug_and_play_one_hot_reproduces_each_peft_adapter(peft_dirs) -> None:
    dirs, refs = peft_dirs
    mixer = LoraMixer.from_peft_adapters(tiny_bert(), dirs, LoraMixerConfig(routing="hard"))
    assert mixer.config.expert_r == [4, 2, 3] and mixer.config.expert_alpha == [8.0, 2.0, 12.0]
    for e, ref in enumerate(refs):  # hard routing, the same expert for both samples
        mixer.set_domains([e, e])
        torch.testing.assert_close(out(mixer), ref, rtol=1e-5, atol=1e-5)
    mixer.set_domains([2, 0])  # per-sample hard routing: sample b gets expert d_b
    mixed = out(mixer)
    torch.testing.assert_close(mixed[0], refs[2][0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(mixed[1], refs[0][1], rtol=1e-5, atol=1e-5)
    fixed = LoraMixer.from_peft_adapters(tiny_bert(), dirs, LoraMixerConfig(fixed_expert=1))
    torch.testing.assert_close(out(fixed), refs[1], rtol=1e-5, atol=1e-5)


def test_plug_and_play_trains_only_the_router(peft_dirs) -> None:
    dirs, _ = peft_dirs
    mixer = LoraMixer.from_peft_adapters(tiny_bert(), dirs, LoraMixerConfig(routing="soft", rsl_lambda=0.1))
    trainable = [n for n, p in mixer.named_parameters() if p.requires_grad]
    assert trainable and all(n.endswith("lora_router.weight") for n in trainable)
    assert len(trainable) == len(QKVO) * TINY["num_hidden_layers"]
    frozen = {n: p.detach().clone() for n, p in mixer.named_parameters() if not p.requires_grad}
    opt = torch.optim.SGD([p for p in mixer.parameters() if p.requires_grad], lr=0.5)
    mixer.train()
    loss = mixer(input_ids=ids()).last_hidden_state.pow(2).mean() + mixer.aux_loss()
    loss.backward()
    opt.step()
    assert all(torch.equal(p, frozen[n]) for n, p in mixer.named_parameters() if not p.requires_grad)
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in mixer.parameters() if p.requires_grad)


def test_one_expert_constant_router_equals_veil_lora() -> None:
    lora = inject(tiny_bert(), LoraConfig(r=4, lora_alpha=8, target_modules=QKVO))
    mixer = inject(tiny_bert(), LoraMixerConfig(r=4, lora_alpha=8, num_experts=1, top_k=1, target_modules=QKVO))
    randomize(lora, seed=3)
    state = {k.replace(".lora_A.", ".experts.0.lora_A.").replace(".lora_B.", ".experts.0.lora_B."): v
             for k, v in lora.adapter_state_dict().items()}
    state.update({k: v for k, v in mixer.adapter_state_dict().items() if "lora_router" in k})
    mixer.load_adapter_state_dict(state)
    randomize(mixer, seed=4, only="lora_router")  # any router: a softmax over one expert is constant 1
    for mode in ("soft", "topk"):
        mixer.set_routing(mode)
        torch.testing.assert_close(out(mixer), out(lora), rtol=1e-5, atol=1e-5)


def layer(e: int = 4, **kw) -> LoraMixerLinear:
    torch.manual_seed(0)
    cfg = LoraMixerConfig(r=3, num_experts=e, target_modules=["x"], **kw)
    mixer = LoraMixerLinear(nn.Linear(8, 5), cfg, cfg.expert_shapes("x"))
    randomize(mixer, seed=5)
    return mixer


def test_topk_routes_exactly_k_experts_and_soft_weights_sum_to_one() -> None:
    x = torch.randn(3, 6, 8)
    for k in (1, 2, 3):
        weights, evaluated = layer(top_k=k, routing="topk").routing(x)
        assert (evaluated.sum(-1) == k).all() and ((weights > 0) == evaluated).all()
        torch.testing.assert_close(weights.sum(-1), torch.ones(3, 6))
    weights, evaluated = layer(routing="soft").routing(x)
    assert evaluated.all() and (weights > 0).all()
    torch.testing.assert_close(weights.sum(-1), torch.ones(3, 6))


def test_topk_with_k_equal_e_is_soft_and_k_lt_e_evaluates_only_k() -> None:
    x = torch.randn(3, 6, 8)
    soft, full = layer(routing="soft"), layer(routing="topk", top_k=4)
    torch.testing.assert_close(full(x), soft(x))
    sparse, rows = layer(routing="topk", top_k=2), []
    for expert in sparse.experts:
        expert.register_forward_hook(lambda m, inp, o: rows.append(inp[0].shape[0]))
    sparse(x)
    assert sum(rows) == 3 * 6 * 2  # each of the 18 tokens ran exactly K = 2 experts


def test_entropy_gradient_is_minus_log_p_minus_one() -> None:
    p = torch.softmax(torch.randn(5, 4, dtype=torch.float64), -1).requires_grad_(True)
    routing_entropy(p).sum().backward()
    torch.testing.assert_close(p.grad, -p.detach().log() - 1)


@pytest.mark.parametrize("sign", ["as_printed", "specialise"])
def test_rsl_matches_numpy(sign) -> None:
    mixer = layer(routing="topk", top_k=2, rsl_alpha=0.3, rsl_lambda=0.2, rsl_entropy=sign).train()
    mixer(torch.randn(2, 9, 8))
    p, d = mixer.last_probs.detach().double().numpy(), mixer.last_dispatch.numpy()
    f = d.sum(0) / d.sum()
    h = -(p * np.log(p)).sum(-1).mean()
    expected = 0.3 * (p.mean(0) * f).sum() + (-0.2 if sign == "as_printed" else 0.2) * h
    assert mixer.aux_loss().item() == pytest.approx(expected, rel=1e-5)


def test_rsl_lambda_zero_is_load_term_minimal_at_uniform() -> None:
    e, g = 4, torch.Generator().manual_seed(0)
    uniform = torch.full((10, e), 1 / e)
    base = float(rsl(uniform, uniform > 0, 1.0, 0.0))
    assert base == pytest.approx(1 / e)
    for _ in range(20):  # a consistent routing (dispatch = argmax) never has a lower load term than uniform
        probs = torch.softmax(3 * torch.randn(10, e, generator=g), -1)
        dispatch = torch.zeros_like(probs, dtype=torch.bool).scatter(-1, probs.argmax(-1, keepdim=True), True)
        assert float(rsl(probs, dispatch, 1.0, 0.0)) >= base - 1e-6


@pytest.mark.parametrize(("sign", "down"), [("specialise", True), ("as_printed", False)])
def test_entropy_sign_direction(sign, down) -> None:
    """Spec §3.6.4: 2 input clusters, 2 experts; only the RSL entropy term trains the router."""
    mixer = layer(e=2, routing="soft", top_k=1, rsl_alpha=0.0, rsl_lambda=1.0, rsl_entropy=sign).train()
    g = torch.Generator().manual_seed(0)
    centre = torch.randn(1, 8, generator=g)
    x = torch.cat([centre + 0.1 * torch.randn(16, 8, generator=g), -centre + 0.1 * torch.randn(16, 8, generator=g)])
    nn.init.normal_(mixer.lora_router.weight, std=0.3, generator=g)  # mid entropy
    opt = torch.optim.SGD([mixer.lora_router.weight], lr=0.05)

    def entropy() -> float:
        mixer(x)
        return routing_entropy(mixer.last_probs).mean().item()

    before = entropy()
    for _ in range(50):
        opt.zero_grad()
        mixer(x)
        mixer.aux_loss().backward()
        opt.step()
    assert (entropy() < before) == down


def test_joint_regime_hard_then_soft_with_preserve() -> None:
    model = inject(tiny_bert(), LoraMixerConfig(num_experts=2, routing="hard", target_modules=QKVO,
                                                preserve_beta=1.0, preserve_experts=[0]))
    assert model.aux_loss().item() == 0.0  # hard routing has no RSL
    with pytest.raises(ValueError, match="set_domains"):
        out(model)
    model.set_domains([0, 0])  # stage 1: only the domain's expert learns, the router gets no gradient
    model(input_ids=ids()).last_hidden_state.pow(2).mean().backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.requires_grad}
    assert any(g is not None and g.abs().sum() > 0 for n, g in grads.items() if "experts.0.lora_B" in n)
    assert all(g is None for n, g in grads.items() if "experts.1." in n or "lora_router" in n)
    model.begin_soft_stage()
    assert model.config.routing == "soft" and model.preserve_loss().item() == 0.0
    with torch.no_grad():
        next(p for n, p in model.named_parameters() if "experts.0.lora_B" in n).add_(1.0)
    assert model.preserve_loss().item() > 0


def test_merge_refused_unless_fixed(tmp_path) -> None:
    model = inject(tiny_bert(), LoraMixerConfig(num_experts=2, target_modules=QKVO))
    with pytest.raises(NotImplementedError, match="input"):
        model.merge()
    fixed = inject(tiny_bert(), LoraMixerConfig(num_experts=2, fixed_expert=1, target_modules=QKVO))
    randomize(fixed, seed=6)
    before = out(fixed)
    torch.testing.assert_close(out(fixed.merge_and_unload()), before, rtol=1e-5, atol=1e-5)


def test_config_json_and_checkpoint_round_trip(tmp_path) -> None:
    cfg = LoraMixerConfig(r=2, num_experts=3, routing="topk", top_k=2, rsl_lambda=0.1, rsl_entropy="specialise",
                          preserve_experts=[1], expert_r=[2, 3, 4], target_modules=QKVO)
    assert LoraMixerConfig.from_dict(cfg.to_dict()) == cfg
    model = inject(tiny_bert(), cfg)
    randomize(model, seed=7)
    model.save_pretrained(tmp_path / "m")
    again = AdapterModel.from_pretrained(tiny_bert(), tmp_path / "m")
    assert isinstance(again, LoraMixerModel) and again.config == cfg
    torch.testing.assert_close(out(again), out(model))


def test_registry_and_validation() -> None:
    assert AdapterMethod("loramixer") is AdapterMethod.LORAMIXER
    assert get_method("loramixer").model_cls is LoraMixerModel
    assert LoraMixerConfig().target_modules == ["q_proj", "k_proj", "v_proj", "o_proj"]
    with pytest.raises(ValueError, match="top_k"):
        LoraMixerConfig(num_experts=2, top_k=3)
    with pytest.raises(ValueError, match="expert_r"):
        LoraMixerConfig(num_experts=2, expert_r=[4])
