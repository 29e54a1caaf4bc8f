"""veil.training.optim: optimizers that follow the torch.optim contract, and one registry to build them.

```
build_optimizer("adamw" | "racs" | "alice" | "adams" | "lracs", model_or_params, lr=..., **kwargs)
    racs / alice   (Gong et al., ICLR 2026)   matrices get the structured-FIM update, the rest Adam(W)
    adams / lracs  (Zheng & Wu, ICLR 2026)    LoRA (A, B) pairs get the horizontal-lift update, the rest AdamW
```
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from veil.registry import Registry

from .alice import Alice
from .groups import HEAD_NAMES, lora_param_groups, matrix_param_groups
from .lora_s import LRACS, AdamS, AdamSylvester
from .racs import RACS

ParamsLike = nn.Module | Iterable[torch.Tensor] | Iterable[dict[str, Any]]


@dataclass(frozen=True)
class OptimizerEntry:
    """One registered optimizer: its class, how to build it from a model or params, and its paper."""

    name: str
    cls: type[torch.optim.Optimizer]
    build: Callable[..., torch.optim.Optimizer]
    paper: str
    lora_only: bool = False  # updates LoRA (A, B) pairs: needs a model with LoRA adapters


def _trainable(model_or_params: ParamsLike) -> Any:
    """A model's trainable parameters, or the params / param groups as given."""
    if isinstance(model_or_params, nn.Module):
        return [p for p in model_or_params.parameters() if p.requires_grad]
    return list(model_or_params)


def _build_adamw(model_or_params: ParamsLike, lr: float, **kwargs: Any) -> torch.optim.Optimizer:
    return torch.optim.AdamW(_trainable(model_or_params), lr=lr, **kwargs)


def _matrix_builder(cls: type[torch.optim.Optimizer], adam_modules: tuple[str, ...]) -> Callable[..., Any]:
    """RACS/Alice: a model is split by :func:`matrix_param_groups` (``adam_lr``: the Adam group's own lr)."""

    def build(model_or_params: ParamsLike, lr: float, adam_lr: float | None = None, **kwargs: Any) -> Any:
        params = model_or_params
        if isinstance(model_or_params, nn.Module):
            params = matrix_param_groups(model_or_params, adam_modules, rest=_rest(adam_lr))
        return cls(params, lr=lr, **kwargs)

    return build


def _pair_builder(cls: type[torch.optim.Optimizer]) -> Callable[..., Any]:
    """AdamS/LRACS: a model is split by :func:`lora_param_groups` (``adam_lr``: the non-pair group's own lr)."""

    def build(model_or_params: ParamsLike, lr: float, adam_lr: float | None = None, **kwargs: Any) -> Any:
        params = model_or_params
        if isinstance(model_or_params, nn.Module):
            params = lora_param_groups(model_or_params, rest=_rest(adam_lr))
        return cls(params, lr=lr, **kwargs)

    return build


def _rest(adam_lr: float | None) -> dict[str, Any]:
    return {} if adam_lr is None else {"lr": adam_lr}


_GONG = "Gong, Scetbon, Ma, Meeds, Towards Efficient Optimizer Design for LLM via Structured Fisher Approximation " \
        "with a Low-Rank Extension, ICLR 2026, arXiv 2502.07752"
_ZHENG = "Zheng & Wu, LoRA-S: horizontal lift on the quotient manifold (AdamS, LRACS), ICLR 2026, OpenReview Guo2XGgxZA"

OPTIMIZERS: Registry[OptimizerEntry] = Registry("optimizer", ("adamw", "racs", "alice", "adams", "lracs"),
                                                where="OPTIMIZERS in training/optim/__init__.py")
for _entry in (
    OptimizerEntry("adamw", torch.optim.AdamW, _build_adamw,
                   "Loshchilov & Hutter, Decoupled Weight Decay Regularization, ICLR 2019"),
    OptimizerEntry("racs", RACS, _matrix_builder(RACS, HEAD_NAMES), _GONG),
    OptimizerEntry("alice", Alice, _matrix_builder(Alice, ()), _GONG),
    OptimizerEntry("adams", AdamSylvester, _pair_builder(AdamSylvester), _ZHENG, lora_only=True),
    OptimizerEntry("lracs", LRACS, _pair_builder(LRACS), _ZHENG, lora_only=True),
):
    OPTIMIZERS.register(_entry.name, _entry)


def build_optimizer(name: str, model_or_params: ParamsLike, lr: float, **kwargs: Any) -> torch.optim.Optimizer:
    """Build the optimizer registered as ``name`` over a model (its trainable parameters) or params/groups.

    Args:
        name: one of ``OPTIMIZERS`` (``adamw``, ``racs``, ``alice``, ``adams``, ``lracs``).
        model_or_params: an ``nn.Module`` or what ``torch.optim`` accepts (params or param-group dicts). A module
            is split as each method needs: ``racs``/``alice`` by :func:`matrix_param_groups`, ``adams``/``lracs``
            by :func:`lora_param_groups` (the model must carry LoRA adapters); ``adamw`` takes its trainable
            parameters. Those four also accept ``adam_lr``, the lr of the Adam(W)-trained rest.
        lr: the learning rate (every group's ``lr``; schedulers rescale it).
        **kwargs: the optimizer's own hyperparameters (``weight_decay``, ``betas``, ...).

    Raises:
        veil.registry.RegistryError: ``name`` is not registered (a ``ValueError`` listing the known names).
    """
    return OPTIMIZERS[name].build(model_or_params, lr=lr, **kwargs)


def optimizer_state_bytes(opt: torch.optim.Optimizer) -> int:
    """Bytes held by the tensors in ``opt.state`` (the optimizer's memory beyond the parameters)."""
    return sum(v.numel() * v.element_size() for state in opt.state.values()
               for v in state.values() if isinstance(v, torch.Tensor))


__all__ = ["LRACS", "OPTIMIZERS", "RACS", "AdamS", "AdamSylvester", "Alice", "OptimizerEntry", "build_optimizer",
           "lora_param_groups", "matrix_param_groups", "optimizer_state_bytes"]
