"""The adapter matrix: every method x every tiny architecture it applies to, through one shared tester
(``tests/common.py:check_adapter``): attach, forward, backward moves adapter parameters only, save/load round trip
(and PEFT parity where PEFT knows the method), merge equals unmerged (or is refused).

Not applicable, so not in the matrix: VAPT on text models (it inserts prompts between a ViT's patch tokens; other
models are refused by ``vit_geometry``, tested below).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

_spec = importlib.util.spec_from_file_location("tests_common", Path(__file__).resolve().parents[2] / "common.py")
assert _spec is not None and _spec.loader is not None
common = sys.modules.setdefault("tests_common", importlib.util.module_from_spec(_spec))  # dataclasses need it there
if not hasattr(common, "check_adapter"):
    _spec.loader.exec_module(common)

# per architecture: the attention projections a per-linear method targets, and the sub-layer mtLoRA wraps
# (GPT-2's c_attn / c_proj are transformers' Conv1D, weight stored (in, out))
PROJECTIONS = {"llama": ["q_proj", "v_proj"], "gpt2": ["c_attn", "attn.c_proj"], "bert": ["query", "value"],
               "vit": ["q_proj", "v_proj"]}
SUBLAYER = {"llama": ["mlp"], "gpt2": ["mlp"], "bert": ["intermediate"], "vit": ["mlp"]}


def lora(arch: str):
    from veil.training.adapters import LoraConfig

    return lambda base: LoraConfig(r=2, lora_alpha=4, target_modules=PROJECTIONS[arch])


def rslora(arch: str):
    from veil.training.adapters import LoraConfig

    return lambda base: LoraConfig(r=4, lora_alpha=4, use_rslora=True, target_modules=PROJECTIONS[arch])


def psoft(arch: str):
    from veil.training.adapters import PsoftConfig

    return lambda base: PsoftConfig(r=2, psoft_alpha=2, target_modules=PROJECTIONS[arch])


def mtlora(arch: str):
    from veil.training.adapters.mtlora import MtLoraConfig

    return lambda base: MtLoraConfig(r=2, num_experts=2, routing_groups=2, lora_dropout=0.0, target_modules=SUBLAYER[arch])


def e2lora(arch: str):
    from veil.training.adapters import E2LoraConfig
    from veil.training.adapters.e2lora import plan_sharing

    inputs = common.ARCHS[arch].inputs()

    def config(base: torch.nn.Module):
        cfg = E2LoraConfig(r=2, lora_alpha=4, target_modules=PROJECTIONS[arch])
        return plan_sharing(base, cfg, lambda m: m(**inputs).logits.pow(2).mean())
    return config


def loramixer(arch: str):
    from veil.training.adapters.loramixer import LoraMixerConfig

    return lambda base: LoraMixerConfig(r=2, num_experts=2, routing="soft", target_modules=PROJECTIONS[arch])


def vapt(arch: str):
    from veil.training.adapters import VaptConfig

    return lambda base: VaptConfig(r=2, num_tokens=2, conv_dropout=0.0, mlp_dropout=0.0, prompt_dropout=0.0)


CASES = [common.AdapterCase("lora", a, lora(a), peft=True) for a in common.ARCHS]
CASES += [common.AdapterCase("rslora", a, rslora(a), peft=True) for a in ("llama", "gpt2")]
# PEFT 0.21's PSOFT wraps nn.Linear only ("minimal PSOFT"): GPT-2's Conv1D checkpoint is veil-only
CASES += [common.AdapterCase("psoft", a, psoft(a), peft=a != "gpt2") for a in common.ARCHS]
CASES += [common.AdapterCase("mtlora", a, mtlora(a), mergeable=False) for a in common.ARCHS]
CASES += [common.AdapterCase("e2lora", a, e2lora(a)) for a in common.ARCHS]
CASES += [common.AdapterCase("loramixer", a, loramixer(a), mergeable=False) for a in common.ARCHS]
CASES += [common.AdapterCase("vapt", "vit", vapt("vit"), mergeable=False, starts_as_base=False)]


@pytest.mark.parametrize("case", CASES, ids=[f"{c.method}-{c.arch}" for c in CASES])
def test_adapter_matrix(case, tmp_path: Path) -> None:
    common.check_adapter(case, tmp_path)


def test_gpt2_lora_checkpoint_says_fan_in_fan_out(tmp_path: Path) -> None:
    """PEFT reads fan_in_fan_out to transpose Conv1D weights at merge; veil writes it when a target is a Conv1D."""
    import json

    from veil.training.adapters import inject

    model = inject(common.ARCHS["gpt2"].model(), lora("gpt2")(None))
    model.save_pretrained(tmp_path / "a")
    assert json.loads((tmp_path / "a" / "adapter_config.json").read_text())["fan_in_fan_out"] is True
    model = inject(common.ARCHS["llama"].model(), lora("llama")(None))
    model.save_pretrained(tmp_path / "b")
    assert json.loads((tmp_path / "b" / "adapter_config.json").read_text())["fan_in_fan_out"] is False


def test_rslora_scaling_is_alpha_over_sqrt_r() -> None:
    from veil.training.adapters import inject

    model = inject(common.ARCHS["llama"].model(), rslora("llama")(None))
    assert {layer.scaling for layer in model.adapter_layers().values()} == {4 / 2.0}  # alpha 4 / sqrt(4)


def test_vapt_refuses_a_text_model() -> None:
    from veil.training.adapters import VaptConfig, inject

    with pytest.raises(ValueError, match="expected a transformers ViT config"):
        inject(common.ARCHS["gpt2"].model(), VaptConfig(target_modules=["h.0"]))


def test_layers_to_transform_peft_semantics(tmp_path: Path) -> None:
    """layers_to_transform / layers_pattern select layers as PEFT does, and a PEFT checkpoint using them loads."""
    import peft
    from veil.training.adapters import AdapterModel, LoraConfig, inject

    arch = common.ARCHS["llama"]
    cfg = LoraConfig(r=2, target_modules=["q_proj", "v_proj"], layers_to_transform=[1], layers_pattern="layers")
    names = sorted(inject(arch.model(), cfg).adapter_layers())
    assert names == ["model.layers.1.self_attn.q_proj", "model.layers.1.self_attn.v_proj"]
    assert sorted(inject(arch.model(), cfg.replace(layers_pattern=None)).adapter_layers()) == names
    assert not inject(arch.model(), cfg.replace(layers_to_transform=0)).adapter_layers().keys() & set(names)

    theirs = peft.get_peft_model(arch.model(), peft.LoraConfig(r=2, target_modules=["q_proj", "v_proj"],
                                                               layers_to_transform=[1], layers_pattern="layers",
                                                               init_lora_weights=False))
    theirs.save_pretrained(tmp_path / "p")
    inputs = arch.inputs()
    ours = AdapterModel.from_pretrained(arch.model(), tmp_path / "p")
    assert sorted(ours.adapter_layers()) == names
    assert torch.allclose(common.output(ours, inputs), common.output(theirs.eval(), inputs), atol=1e-5)


def test_layers_pattern_without_layers_to_transform_is_refused() -> None:
    from veil.training.adapters import LoraConfig

    from veil.config import ConfigError

    with pytest.raises(ConfigError, match="layers_pattern: only used with layers_to_transform"):
        LoraConfig(target_modules=["q_proj"], layers_pattern="layers")
    with pytest.raises(ConfigError, match="layers_to_transform: expected a list of target_modules names"):
        LoraConfig(target_modules=r".*q_proj", layers_to_transform=[0])


def test_rslora_matches_peft(tmp_path: Path) -> None:
    """Same weights, same outputs: a PEFT rsLoRA checkpoint loads in veil as the same function and back."""
    import peft
    from veil.training.adapters import AdapterModel

    arch = common.ARCHS["gpt2"]
    theirs = peft.get_peft_model(arch.model(), peft.LoraConfig(r=4, lora_alpha=8, use_rslora=True,
                                                               target_modules=["c_attn"], init_lora_weights=False))
    theirs.save_pretrained(tmp_path / "p")
    inputs = arch.inputs()
    ours = AdapterModel.from_pretrained(arch.model(), tmp_path / "p")
    expected = common.output(theirs.eval(), inputs)
    assert not torch.allclose(expected, common.output(arch.model(), inputs), atol=1e-4)
    assert torch.allclose(common.output(ours, inputs), expected, atol=1e-5)
