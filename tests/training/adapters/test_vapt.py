"""VAPT (spec §5.4): zero adaptive prompts at init, input-adaptivity, the prompt formula against a direct computation,
parameter counts, trainable set, config/registry/checkpoint round trips, merge refused, digits workload (slow)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from transformers import ViTConfig, ViTForImageClassification
from veil.training.adapters import AdapterMethod, AdapterModel, get_method, inject
from veil.training.adapters.vapt import VaptBlock, VaptConfig, VaptModel, vapt_param_count

from veil.config import ConfigError

TINY = {"image_size": 8, "patch_size": 2, "num_channels": 1, "hidden_size": 16, "num_hidden_layers": 3,
        "num_attention_heads": 2, "intermediate_size": 32, "num_labels": 3}
GRID, D = (4, 4), 16
KW = {"num_tokens": 4, "modules_to_save": ["classifier"]}


def make_vit(seed: int = 0) -> ViTForImageClassification:
    torch.manual_seed(seed)
    return ViTForImageClassification(ViTConfig(**TINY)).eval()


def images(n: int = 2, seed: int = 1) -> torch.Tensor:
    return torch.randn(n, 1, 8, 8, generator=torch.Generator().manual_seed(seed))


def blocks(model: VaptModel) -> list[VaptBlock]:
    return list(model.adapter_layers().values())


def hidden_inputs(model: VaptModel, x: torch.Tensor) -> list[torch.Tensor]:
    """The input (B, 1+N, d) of every adapted block, captured by forward pre-hooks."""
    seen: list[torch.Tensor] = []
    hooks = [b.register_forward_pre_hook(lambda _m, args: seen.append(args[0])) for b in blocks(model)]
    model(pixel_values=x)
    for h in hooks:
        h.remove()
    return seen


def test_init_adaptive_prompts_zero_and_output_is_zero_prompt_vpt() -> None:
    """§5.4.1: adaptive prompts are exactly 0 at init; the output equals VPT with zero prompts in those blocks."""
    base, x = make_vit(), images()
    ref = copy.deepcopy(base)
    model = inject(base, VaptConfig(**KW)).eval()
    with torch.no_grad():
        out = model(pixel_values=x).logits
        for block, h in zip(blocks(model)[1:], hidden_inputs(model, x)[1:], strict=True):
            assert torch.equal(block.prompts(h), torch.zeros(2, 4, D))
        h = ref.vit.embeddings(x)  # (B, 1+N, d)
        for i, layer in enumerate(ref.vit.layers):
            prompts = blocks(model)[0].prompt_embeddings.expand(2, -1, -1) if i == 0 else torch.zeros(2, 4, D)
            h = layer(torch.cat([h[:, :1], prompts, h[:, 1:]], dim=1))
            h = torch.cat([h[:, :1], h[:, 5:]], dim=1)
        direct = ref.classifier(ref.vit.layernorm(h)[:, 0])
    assert torch.allclose(out, direct, atol=1e-6)


def test_prompts_depend_on_input_after_one_step() -> None:
    """§5.4.2: after one step, two images get different adaptive prompts; the static layer-0 prompts are shared."""
    model = inject(make_vit(), VaptConfig(**KW)).train()
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.5)
    F.cross_entropy(model(pixel_values=images(8, seed=2)).logits, torch.arange(8) % 3).backward()
    opt.step()
    model.eval()
    with torch.no_grad():
        hs = hidden_inputs(model, images())
        static = blocks(model)[0].prompts(hs[0])
        assert static.shape == (2, 4, D) and torch.equal(static[0], static[1])
        for block, h in zip(blocks(model)[1:], hs[1:], strict=True):
            p = block.prompts(h)
            assert p.shape == (2, 4, D)  # (B, N_p, d)
            assert (p[0] - p[1]).abs().max() > 1e-4


@pytest.mark.parametrize("residual", [True, False])
def test_prompt_equals_formula(residual: bool) -> None:
    """P = [G +] W2 ReLU(W1 G), G = TokenWise(conv_k(LN(X))) with one kernel for all channels (eval mode)."""
    model = inject(make_vit(), VaptConfig(projector_residual=residual, **KW)).eval()
    torch.manual_seed(3)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.normal_(std=0.3)
        block, proj = blocks(model)[2], model.feature_projector
        x = torch.randn(2, 1 + 16, D)  # (B, 1+N, d)
        ln = F.layer_norm(x[:, 1:], (D,), block.prompt.norm.weight, block.prompt.norm.bias)  # (B, N, d)
        grid = ln.transpose(1, 2).reshape(2, D, 4, 4)
        conv = F.conv2d(grid, block.prompt.kernel.repeat(D, 1, 1, 1), groups=D).flatten(2)  # (B, d, 9)
        g = (conv @ block.prompt.token_wise.weight.T + block.prompt.token_wise.bias).transpose(1, 2)  # (B, N_p, d)
        mlp = torch.relu(g @ proj.down.weight.T) @ proj.up.weight.T
        assert torch.allclose(block.prompts(x), g + mlp if residual else mlp, atol=1e-5)
    assert block.prompt.kernel.shape == (1, 1, 2, 2)  # one k×k kernel shared by all d channels


@pytest.mark.parametrize("extra", [{}, {"conv": False}, {"feature_projector": False}, {"learnable_scale": True},
                                   {"vpt_depth": 0, "kernel_size": 3, "padding": 1}, {"vpt_depth": 2}])
def test_trainable_count_matches_formula(extra: dict) -> None:
    """§5.2/§5.4.3: L·N_p·H'W' + L·k² + 2rd (+ biases, LayerNorms, static prompts), plus the head."""
    cfg = VaptConfig(**KW, **extra)
    model = inject(make_vit(), cfg)
    head = D * 3 + 3
    assert model.trainable_report()["trainable"] == vapt_param_count(cfg, D, GRID, 3) + head
    if extra.get("conv") is False:  # the no-conv ablation: Linear(H·W -> N_p) on the tokens
        assert blocks(model)[1].prompt.token_wise.in_features == 16


def test_spec_example_parameter_count() -> None:
    """The spec's ViT-B/16 example: N_p = 10, 12 blocks (1 static + 11 adaptive) -> 55,608 (+ head)."""
    assert vapt_param_count(VaptConfig(num_tokens=10), 768, (14, 14), 12) == 55_608


def test_only_prompts_and_head_train_and_backbone_stays_eval() -> None:
    model = inject(make_vit(), VaptConfig(**KW)).train()
    names = {n for n, p in model.named_parameters() if p.requires_grad}
    assert names and all("prompt" in n or n.startswith(("model.classifier.", "feature_projector.")) for n in names)
    assert not model.model.vit.embeddings.training and not blocks(model)[1].base_layer.training
    assert blocks(model)[1].prompt.training and model.feature_projector.training


def test_config_json_round_trip_and_validation() -> None:
    cfg = VaptConfig(num_tokens=10, projector_residual=False, conv=False, **{"modules_to_save": ["classifier"]})
    assert VaptConfig.from_json(cfg.to_json()) == cfg
    assert VaptConfig.from_peft_dict(cfg.to_peft_dict()) == cfg
    with pytest.raises(ConfigError, match="num_tokens: expected >= 1, received 0"):
        VaptConfig(num_tokens=0)
    with pytest.raises(ConfigError, match="rank_pattern"):
        VaptConfig(rank_pattern={"x": 2})


def test_registry_entry() -> None:
    entry = get_method("vapt")
    assert entry.method is AdapterMethod.VAPT and entry.config_cls is VaptConfig and entry.model_cls is VaptModel


def test_save_load_round_trip(tmp_path) -> None:
    model = inject(make_vit(), VaptConfig(**KW)).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(0.1 * torch.randn_like(p))
        ref = model(pixel_values=images()).logits
    model.save_pretrained(tmp_path / "vapt")
    again = AdapterModel.from_pretrained(make_vit(), tmp_path / "vapt").eval()
    assert isinstance(again, VaptModel)
    with torch.no_grad():
        assert torch.allclose(again(pixel_values=images()).logits, ref, atol=1e-6)


def test_merge_refused_and_polyvit_refused() -> None:
    model = inject(make_vit(), VaptConfig(**KW))
    with pytest.raises(NotImplementedError, match="not mergeable"):
        model.merge_and_unload()
    from veil.training.uldnet.config import ModelConfig
    from veil.training.uldnet.models import build_model

    with pytest.raises(ValueError, match="PolyViT is not supported"):
        inject(build_model(ModelConfig(arch="vit", baseline=True)), VaptConfig(target_modules=["blocks.0"]))


@pytest.mark.slow
def test_digits_vapt_beats_linear_probe() -> None:
    """Issue §3 workload: tiny ViT pre-trained on digits 0-4, adapted to 5-9; VAPT beats a linear probe."""
    from veil.training.adapters.vapt.digits import run_digits

    result = run_digits()
    assert result["vapt_accuracy"] > result["probe_accuracy"], result


@pytest.mark.parametrize("dtype", [torch.bool, torch.float32])
def test_block_widens_an_attention_mask_over_the_prompts(dtype: torch.dtype) -> None:
    """An encoder mask covers 1+N tokens; the block opens the N_p prompt rows/columns and keeps the rest."""
    model = inject(make_vit(), VaptConfig(**KW)).eval()
    block, n = blocks(model)[0], 1 + GRID[0] * GRID[1]
    mask = torch.rand(2, 1, n, n, generator=torch.Generator().manual_seed(0)) > 0.3  # (B, 1, Q, K), True = attend
    mask = mask if dtype == torch.bool else torch.where(mask, 0.0, float("-inf"))
    wide = block.with_prompt_positions(mask)  # (B, 1, Q+N_p, K+N_p)
    p, n_p, open_value = 1, KW["num_tokens"], True if dtype == torch.bool else 0.0
    assert wide.shape == (2, 1, n + n_p, n + n_p)
    keep = torch.cat([torch.arange(p), torch.arange(p + n_p, n + n_p)])
    assert torch.equal(wide[:, :, keep][:, :, :, keep], mask)
    assert (wide[:, :, p:p + n_p] == open_value).all() and (wide[:, :, :, p:p + n_p] == open_value).all()
    # an all-attend mask of the encoder's length gives the same logits as no mask
    x = images()
    with torch.no_grad():
        ones = model(pixel_values=x, attention_mask=torch.ones(2, n)).logits
        assert torch.allclose(ones, model(pixel_values=x).logits, atol=1e-6)
