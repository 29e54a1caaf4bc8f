"""``AdapterLayer``: the base of every adapter that wraps one linear layer (``base_layer`` stays frozen).

A linear layer is an ``nn.Linear`` (weight (out, in)) or GPT-2's ``transformers.pytorch_utils.Conv1D``
(weight stored transposed, (in, out): ``y = x @ W + b``; PEFT's ``fan_in_fan_out``). Adapters see both through
:func:`linear_dims` / :func:`linear_weight` in the (out, in) convention, and merge writes ΔW back transposed
into a ``Conv1D``.

A subclass gives ``delta_forward(x)`` (the adapter's additive output) and, where the method is linear in the
weight, ``delta_weight()`` so that merge / unmerge fold it into the base weight exactly.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers.pytorch_utils import Conv1D

LINEAR_TYPES: tuple[type[nn.Module], ...] = (nn.Linear, Conv1D)  # what a per-linear adapter can wrap


def linear_dims(layer: nn.Module) -> tuple[int, int]:
    """(in_features, out_features) of an ``nn.Linear`` or a GPT-2 ``Conv1D``."""
    if isinstance(layer, Conv1D):
        return layer.weight.shape[0], layer.weight.shape[1]  # weight (in, out)
    return layer.in_features, layer.out_features  # type: ignore[return-value]


def linear_weight(layer: nn.Module) -> torch.Tensor:
    """The weight in the (out, in) convention (a view: ``Conv1D`` stores it transposed)."""
    return layer.weight.T if isinstance(layer, Conv1D) else layer.weight  # type: ignore[return-value]


class AdapterLayer(nn.Module):
    """A linear layer plus an adapter path: ``y = base_layer(x) + delta_forward(x)`` (unless merged).

    Args:
        base_layer: the frozen ``nn.Linear`` (weight (out, in)) or ``Conv1D`` (weight (in, out)) being adapted.
    """

    def __init__(self, base_layer: nn.Linear) -> None:
        super().__init__()
        self.base_layer = base_layer
        self.merged = False

    @property
    def in_features(self) -> int:
        return linear_dims(self.base_layer)[0]

    @property
    def out_features(self) -> int:
        return linear_dims(self.base_layer)[1]

    def delta_forward(self, x: torch.Tensor) -> torch.Tensor:
        """The adapter's additive output for input x (..., in) -> (..., out)."""
        raise NotImplementedError

    def delta_weight(self) -> torch.Tensor:
        """ΔW (out, in) such that the adapted layer equals a linear layer with weight W + ΔW."""
        raise NotImplementedError(f"{type(self).__name__} is not linear in the weight; it cannot be merged")

    def aux_loss(self) -> torch.Tensor:
        """This layer's auxiliary loss (a scalar the trainer adds to the task loss); zero by default."""
        return self.base_layer.weight.new_zeros(())

    def adapter_state(self) -> dict[str, torch.Tensor]:
        """The adapter's own tensors, keyed relative to this layer (e.g. ``lora_A.weight``)."""
        return {k: v for k, v in self.state_dict().items() if not k.startswith("base_layer.")}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base_layer(x)
        return y if self.merged else y + self.delta_forward(x)

    @torch.no_grad()
    def merge(self) -> None:
        """Fold ΔW into the base weight (the layer then runs the base path only)."""
        if not self.merged:
            w = linear_weight(self.base_layer)  # (out, in) view of the stored weight
            w.add_(self.delta_weight().to(w.dtype))
            self.merged = True

    @torch.no_grad()
    def unmerge(self) -> None:
        """Take ΔW back out of the base weight."""
        if self.merged:
            w = linear_weight(self.base_layer)
            w.sub_(self.delta_weight().to(w.dtype))
            self.merged = False
