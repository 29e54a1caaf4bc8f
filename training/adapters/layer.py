"""``AdapterLayer``: the base of every adapter that wraps one ``nn.Linear`` (``base_layer`` stays frozen).

A subclass gives ``delta_forward(x)`` (the adapter's additive output) and, where the method is linear in the
weight, ``delta_weight()`` so that merge / unmerge fold it into the base weight exactly.
"""

from __future__ import annotations

import torch
from torch import nn


class AdapterLayer(nn.Module):
    """An ``nn.Linear`` plus an adapter path: ``y = base_layer(x) + delta_forward(x)`` (unless merged).

    Args:
        base_layer: the frozen linear layer being adapted, weight (out, in).
    """

    def __init__(self, base_layer: nn.Linear) -> None:
        super().__init__()
        self.base_layer = base_layer
        self.merged = False

    @property
    def in_features(self) -> int:
        return self.base_layer.in_features

    @property
    def out_features(self) -> int:
        return self.base_layer.out_features

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
            w = self.base_layer.weight
            w.add_(self.delta_weight().to(w.dtype))
            self.merged = True

    @torch.no_grad()
    def unmerge(self) -> None:
        """Take ΔW back out of the base weight."""
        if self.merged:
            w = self.base_layer.weight
            w.sub_(self.delta_weight().to(w.dtype))
            self.merged = False
