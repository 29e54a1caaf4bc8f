"""Shared test helpers: tiny random-init transformers models (no hub) and their inputs, and the one adapter tester.

Import with ``from tests.common import ...`` is not available under ``--import-mode=importlib``; test modules load
this file with :func:`load_common` (``tests/training/adapters/test_matrix.py`` shows how).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

# one tiny size for every architecture: 2 layers, hidden 16, 2 heads; weights at std 0.2 (transformers' 0.02 makes
# a 16-wide model's adapters change its logits by ~1e-5, below what a parity test can tell from noise)
HIDDEN, LAYERS, HEADS, VOCAB, INIT = 16, 2, 2, 64, 0.2


@dataclass(frozen=True)
class TinyArch:
    """A tiny architecture: how to build it (seeded), a batch for it, and how to read its output tensor."""

    name: str
    build: Callable[[], nn.Module]
    inputs: Callable[[], dict[str, torch.Tensor]]

    def model(self, seed: int = 0) -> nn.Module:
        """The model at ``seed``: the same seed gives the same weights (eval mode)."""
        torch.manual_seed(seed)
        return self.build().eval()


def _llama() -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=2 * HIDDEN,
                                        num_hidden_layers=LAYERS, num_attention_heads=HEADS, num_key_value_heads=HEADS,
                                        max_position_embeddings=32, initializer_range=INIT))


def _gpt2() -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    return GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_embd=HIDDEN, n_layer=LAYERS, n_head=HEADS, n_positions=32,
                                      initializer_range=INIT))


def _bert() -> nn.Module:
    from transformers import BertConfig, BertForSequenceClassification

    return BertForSequenceClassification(BertConfig(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS,
                                                    num_attention_heads=HEADS, intermediate_size=2 * HIDDEN,
                                                    max_position_embeddings=32, num_labels=3,
                                                    initializer_range=INIT))


def _vit() -> nn.Module:
    from transformers import ViTConfig, ViTForImageClassification

    return ViTForImageClassification(ViTConfig(image_size=8, patch_size=2, num_channels=1, hidden_size=HIDDEN,
                                               num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                                               intermediate_size=2 * HIDDEN, num_labels=3,
                                               initializer_range=INIT))


def _tokens() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return {"input_ids": torch.randint(0, VOCAB, (2, 6), generator=g)}


def _pixels() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return {"pixel_values": torch.randn(2, 1, 8, 8, generator=g)}


ARCHS = {a.name: a for a in (TinyArch("llama", _llama, _tokens), TinyArch("gpt2", _gpt2, _tokens),
                              TinyArch("bert", _bert, _tokens), TinyArch("vit", _vit, _pixels))}


def randomize(model: nn.Module, seed: int = 2, scale: float = 0.3) -> None:
    """Random values for every trainable tensor (a zero-init B would make parity tests vacuous)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.copy_(torch.randn(p.shape, generator=g) * scale)


def output(model: nn.Module, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """The model's logits for ``inputs`` (no grad)."""
    with torch.no_grad():
        return model(**inputs).logits


@dataclass
class AdapterCase:
    """One cell of the adapter matrix: a method's config on a tiny architecture.

    Args:
        config: a function of the base model returning the method's config (E²LoRA plans on the model).
        peft: PEFT knows the method: the saved folder must load in ``peft`` as the same function.
        mergeable: merge() must equal the unmerged output; otherwise merge() must refuse.
        starts_as_base: a fresh adapter leaves the output unchanged (not VAPT: its static prompts are random).
    """

    method: str
    arch: str
    config: Callable[[nn.Module], Any]
    peft: bool = False
    mergeable: bool = True
    starts_as_base: bool = True


def check_adapter(case: AdapterCase, tmp_path: Path, atol: float = 1e-5) -> None:
    """The shared tester: attach, forward, backward touches only adapter parameters, save/load round trip (and
    PEFT parity where PEFT knows the method), merge equals the unmerged output (or is refused)."""
    from veil.training.adapters import AdapterModel, inject

    arch = ARCHS[case.arch]
    inputs = arch.inputs()
    base = arch.model()
    plain = output(base, inputs)
    model = inject(base, case.config(arch.model()))
    layers = model.adapter_layers()
    assert layers, f"{case.method} on {case.arch}: no adapter layer attached"
    if case.starts_as_base:
        assert torch.allclose(output(model, inputs), plain, atol=atol), "a fresh adapter must start as the base model"

    # backward: one SGD step moves adapter parameters only
    frozen = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    trainable = {n: p for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and frozen, "expected trainable adapter parameters and a frozen base"
    randomize(model)
    before = {n: p.detach().clone() for n, p in trainable.items()}
    model.train()
    out = model(**inputs).logits
    (out.float().pow(2).mean() + model.aux_loss()).backward()
    with torch.no_grad():
        for p in trainable.values():
            if p.grad is not None:
                p -= 0.1 * p.grad
    model.eval()
    assert any(not torch.equal(before[n], p) for n, p in trainable.items()), "no adapter parameter moved"
    assert all(torch.equal(frozen[n], p) for n, p in model.named_parameters() if n in frozen), "a frozen weight moved"

    adapted = output(model, inputs)
    assert not torch.allclose(adapted, plain, atol=1e-4), "the randomized adapter does not change the output"

    # save / load round trip (veil), then PEFT parity
    model.save_pretrained(tmp_path / "adapter")
    again = AdapterModel.from_pretrained(arch.model(), tmp_path / "adapter")
    assert torch.allclose(output(again, inputs), adapted, atol=atol), "save/load changed the function"
    if case.peft:
        import peft

        theirs = peft.PeftModel.from_pretrained(arch.model(), str(tmp_path / "adapter")).eval()
        assert torch.allclose(output(theirs, inputs), adapted, atol=1e-4), "PEFT loads a different function"

    # merge
    if case.mergeable:
        model.merge()
        assert torch.allclose(output(model, inputs), adapted, atol=1e-4), "merged output differs from unmerged"
        model.unmerge()
        assert torch.allclose(output(model, inputs), adapted, atol=1e-4), "unmerge did not restore the weights"
    else:
        try:
            model.merge()
        except NotImplementedError:
            pass
        else:
            raise AssertionError(f"{case.method}: merge() of a non-mergeable method must refuse")
