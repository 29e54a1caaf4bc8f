"""Param groups the factor- and matrix-aware optimizers need: LoRA (A, B) pairs together, matrices apart."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

HEAD_NAMES = ("lm_head", "classifier", "score")  # output heads the RACS paper trains with Adam


def _pairs(module: nn.Module) -> list[tuple[str, nn.Parameter, nn.Parameter]]:
    """(suffix, A, B) for a module holding ``lora_A``/``lora_B`` as linears (veil) or adapter-name dicts (PEFT)."""
    a, b = getattr(module, "lora_A", None), getattr(module, "lora_B", None)
    if isinstance(a, nn.Linear) and isinstance(b, nn.Linear):
        return [("", a.weight, b.weight)]
    if isinstance(a, nn.ModuleDict) and isinstance(b, nn.ModuleDict):
        return [(f".{k}", a[k].weight, b[k].weight) for k in a if k in b]
    return []


def lora_param_groups(model: nn.Module, rest: dict[str, Any] | None = None, **hyper: Any) -> list[dict[str, Any]]:
    """One param group per LoRA layer with its two factors, ``[A (r, in), B (out, r)]``, and one plain group with
    every other trainable parameter (heads in ``modules_to_save``, biases, norms).

    Works on a model adapted by ``veil.training.adapters`` (``LoraLinear.lora_A``/``lora_B`` are ``nn.Linear``) and
    on PEFT models (``lora_A``/``lora_B`` are ``ModuleDict``\\ s keyed by adapter name). Factors shared by several
    layers (E²LoRA intervals) appear once.

    Args:
        model: the adapted model.
        rest: hyperparameters of the plain group (e.g. its own ``lr``).
        **hyper: hyperparameters of every pair group (e.g. ``damping``).

    Returns:
        ``[{"params": [A, B], "lora_pair": True, "name": "<module path>", **hyper}, ..., {"params": [...],
        "lora_pair": False, **rest}]`` (the plain group only when it has parameters).

    Raises:
        ValueError: the model has no trainable LoRA pair.
    """
    groups, seen = [], set()
    for path, module in model.named_modules():
        for suffix, a, b in _pairs(module):
            if not (a.requires_grad and b.requires_grad) or id(a) in seen:
                continue
            seen.update((id(a), id(b)))
            groups.append({"params": [a, b], "lora_pair": True, "name": path + suffix, **hyper})
    if not groups:
        raise ValueError(f"lora_param_groups: expected a model with trainable LoRA layers (lora_A and lora_B), "
                         f"found none in {type(model).__name__}; adapt it first, e.g. "
                         "inject(model, LoraConfig(r=8, target_modules=[...]))")
    others = [p for p in model.parameters() if p.requires_grad and id(p) not in seen]
    if others:
        groups.append({"params": others, "lora_pair": False, **(rest or {})})
    return groups


def matrix_param_groups(model: nn.Module, adam_modules: tuple[str, ...] = HEAD_NAMES,
                        rest: dict[str, Any] | None = None, **hyper: Any) -> list[dict[str, Any]]:
    """The split the RACS/Alice paper trains with: weights of linear layers (``nn.Linear``, GPT-2 ``Conv1D``) in
    one group, everything else — embeddings, norms, biases and modules named in ``adam_modules`` — in an
    ``algorithm="adam"`` group.

    Args:
        model: any model; only trainable parameters are grouped.
        adam_modules: module-name suffixes trained with Adam (RACS: output heads; Alice: none).
        rest: hyperparameters of the Adam group (e.g. its own ``lr``).
        **hyper: hyperparameters of the matrix group.
    """
    matrices, seen = [], set()
    for path, module in model.named_modules():
        is_linear = isinstance(module, nn.Linear) or type(module).__name__ == "Conv1D"
        weight = getattr(module, "weight", None)
        if (not is_linear or not isinstance(weight, torch.Tensor) or not weight.requires_grad or weight.ndim != 2
                or any(path == h or path.endswith(f".{h}") for h in adam_modules) or id(weight) in seen):
            continue
        seen.add(id(weight))
        matrices.append(weight)
    others = [p for p in model.parameters() if p.requires_grad and id(p) not in seen]
    groups = [{"params": matrices, **hyper}] if matrices else []
    if others:
        groups.append({"params": others, "algorithm": "adam", **(rest or {})})
    return groups
