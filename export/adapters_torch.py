"""The torch side of an adapter export: the LoRA Linear (fixed or per-call A/B), applying an adapter unmerged or
merged (``W + s B A``) to a base, and the classifier head of a ``veil finetune`` run."""

from __future__ import annotations

import copy

import torch
from torch import nn

from .adapters_peft import LoraWeights
from .errors import ExportError


def resolve_module(model: nn.Module, path: str, adapter_id: str) -> str:
    """The name in ``model`` of the Linear that PEFT calls ``path`` (equal, or ending in ``.path``)."""
    names = [n for n, m in model.named_modules() if (n == path or n.endswith("." + path)) and isinstance(m, nn.Linear)]
    if len(names) != 1:
        raise ExportError(f"adapter {adapter_id!r}: module {path!r} expected to match exactly one nn.Linear of "
                          f"{type(model).__name__}, received {len(names)} matches {names[:4]}")
    return names[0]


class ExportLoraLinear(nn.Module):
    """``base(x) + (x A^T) B^T`` where (A (R, in), B (out, R), scale folded in) are fixed or set per call."""

    def __init__(self, base: nn.Linear, a: torch.Tensor | None = None, b: torch.Tensor | None = None) -> None:
        super().__init__()
        self.base = base
        self.params: tuple[torch.Tensor, torch.Tensor] | None = None if a is None else (a, b)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = self.params  # set by the owner: fixed, or AdapterInputs.forward for this call
        return self.base(x) + (x @ a.T) @ b.T  # (..., in) -> (..., R) -> (..., out)


def replace_module(model: nn.Module, name: str, module: nn.Module) -> None:
    """Put ``module`` at the dotted ``name`` inside ``model`` (in place)."""
    parent, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, child, module)


def with_adapter(model: nn.Module, lora: LoraWeights) -> nn.Module:
    """The torch reference: a copy of ``model`` with the adapter applied unmerged (base + s (x A^T) B^T)."""
    model = copy.deepcopy(model).eval()
    for path, (a, b, scale) in lora.modules.items():
        name = resolve_module(model, path, lora.adapter_id)
        replace_module(model, name, ExportLoraLinear(model.get_submodule(name), a, b * scale))
    return model


def merged(model: nn.Module, lora: LoraWeights) -> nn.Module:
    """A copy of ``model`` with ``W' = W + s B A`` folded into every targeted Linear."""
    model = copy.deepcopy(model).eval()
    with torch.no_grad():
        for path, (a, b, scale) in lora.modules.items():
            linear = model.get_submodule(resolve_module(model, path, lora.adapter_id))
            if linear.weight.shape != (b.shape[0], a.shape[1]):
                raise ExportError(f"adapter {lora.adapter_id!r}: module {path!r} expected B A of shape "
                                  f"{tuple(linear.weight.shape)}, received {(b.shape[0], a.shape[1])}")
            linear.weight += scale * (b @ a)  # (out, r) @ (r, in) -> (out, in)
    return model


HEAD_INPUTS = ("head.weight", "head.bias")


class WithHead(nn.Module):
    """A sentence encoder plus a linear head on its masked mean before normalisation (``MeanPoolClassifier``):
    ``(input_ids, attention_mask[, weight, bias]) -> (sentence_embedding, logits)``.

    ``weight`` (labels, H) / ``bias`` (labels,) given per call override the fixed ones (the adapter-as-input graph).
    """

    def __init__(self, sentence: nn.Module, weight: torch.Tensor, bias: torch.Tensor) -> None:
        super().__init__()
        self.sentence, self.weight, self.bias = sentence, weight, bias

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, weight: torch.Tensor | None = None,
                bias: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        hidden = self.sentence.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state  # (B, T, H)
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)  # (B, T, 1)
        pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)  # (B, H); every row has a token
        embedding = nn.functional.normalize(pooled, dim=-1) if self.sentence.normalize else pooled
        weight, bias = (self.weight, self.bias) if weight is None else (weight, bias)
        return embedding, pooled @ weight.T + bias  # (B, H), (B, labels)


def empty_head(model: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    """The default head of a graph with heads: 0 labels (``logits`` (B, 0) with no adapter active)."""
    hidden = model.encoder.config.hidden_size
    return torch.zeros(0, hidden), torch.zeros(0)


def with_head(model: nn.Module, lora: LoraWeights | None) -> WithHead:
    """``model`` with ``lora``'s head (or the empty one) on the pooled output."""
    weight, bias = lora.head if lora is not None and lora.head is not None else empty_head(model)
    return WithHead(model, weight, bias).eval()
