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

ParamsLike = nn.Module | Iterable[torch.Tensor] | Iterable[dict[str, Any]]


@dataclass(frozen=True)
class OptimizerEntry:
    """One registered optimizer: its class, how to build it from a model or params, and its paper."""

    name: str
    cls: type[torch.optim.Optimizer]
    build: Callable[..., torch.optim.Optimizer]
    paper: str


def _trainable(model_or_params: ParamsLike) -> Any:
    """A model's trainable parameters, or the params / param groups as given."""
    if isinstance(model_or_params, nn.Module):
        return [p for p in model_or_params.parameters() if p.requires_grad]
    return list(model_or_params)


def _build_adamw(model_or_params: ParamsLike, lr: float, **kwargs: Any) -> torch.optim.Optimizer:
    return torch.optim.AdamW(_trainable(model_or_params), lr=lr, **kwargs)


OPTIMIZERS: dict[str, OptimizerEntry] = {
    "adamw": OptimizerEntry("adamw", torch.optim.AdamW, _build_adamw,
                            "Loshchilov & Hutter, Decoupled Weight Decay Regularization, ICLR 2019"),
}


def build_optimizer(name: str, model_or_params: ParamsLike, lr: float, **kwargs: Any) -> torch.optim.Optimizer:
    """Build the optimizer registered as ``name`` over a model (its trainable parameters) or params/groups.

    Args:
        name: one of ``OPTIMIZERS`` (``adamw``, ``racs``, ``alice``, ``adams``, ``lracs``).
        model_or_params: an ``nn.Module`` or what ``torch.optim`` accepts (params or param-group dicts).
        lr: the learning rate (every group's ``lr``; schedulers rescale it).
        **kwargs: the optimizer's own hyperparameters (``weight_decay``, ``betas``, ...).

    Raises:
        ValueError: ``name`` is not registered.
    """
    if name not in OPTIMIZERS:
        raise ValueError(f"optimizer: expected one of {sorted(OPTIMIZERS)}, received {name!r}")
    return OPTIMIZERS[name].build(model_or_params, lr=lr, **kwargs)


def optimizer_state_bytes(opt: torch.optim.Optimizer) -> int:
    """Bytes held by the tensors in ``opt.state`` (the optimizer's memory beyond the parameters)."""
    return sum(v.numel() * v.element_size() for state in opt.state.values()
               for v in state.values() if isinstance(v, torch.Tensor))


__all__ = ["OPTIMIZERS", "OptimizerEntry", "build_optimizer", "optimizer_state_bytes"]
