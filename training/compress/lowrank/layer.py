"""FactorizedLinear: a rank-r Linear stored as two real, smaller Linear layers (in -> r -> out).

It saves parameters and FLOPs for real (k(m + n) weights instead of m n), exports to ONNX as two MatMuls, and
reloads from a state dict given only its rank.
"""

from __future__ import annotations

import torch
from torch import nn


class FactorizedLinear(nn.Module):
    """y = second(first(x)) with first: in -> rank (no bias), second: rank -> out (the original bias).

    ``first.weight`` is B (rank, in) and ``second.weight`` is A (out, rank), so the layer computes (A B) x + b.
    """

    def __init__(self, in_features: int, out_features: int, rank: int, bias: bool = True,
                 dtype: torch.dtype | None = None) -> None:
        super().__init__()
        if rank < 1:
            raise ValueError(f"FactorizedLinear.rank: expected >= 1, received {rank}")
        self.in_features, self.out_features, self.rank = in_features, out_features, rank
        self.first = nn.Linear(in_features, rank, bias=False, dtype=dtype)
        self.second = nn.Linear(rank, out_features, bias=bias, dtype=dtype)

    @classmethod
    def from_factors(cls, a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None,
                     dtype: torch.dtype = torch.float32) -> FactorizedLinear:
        """The layer of W' = A B: ``a`` (out, r), ``b`` (r, in), ``bias`` (out,) or None."""
        layer = cls(b.shape[1], a.shape[0], a.shape[1], bias=bias is not None, dtype=dtype)
        with torch.no_grad():
            layer.first.weight.copy_(b)
            layer.second.weight.copy_(a)
            if bias is not None:
                layer.second.bias.copy_(bias)
        return layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., in) -> (..., out)
        return self.second(self.first(x))

    def dense_weight(self) -> torch.Tensor:
        """The (out, in) product A B."""
        return self.second.weight @ self.first.weight

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, rank={self.rank}"


def weight_params(layer: nn.Module) -> int:
    """Weight-matrix parameters (biases excluded): the quantity the ratio convention is defined on."""
    if isinstance(layer, FactorizedLinear):
        return layer.first.weight.numel() + layer.second.weight.numel()
    return layer.weight.numel()


def replace_module(model: nn.Module, name: str, new: nn.Module) -> None:
    """Put ``new`` at dotted path ``name`` inside ``model``."""
    parent_name, _, child = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, child, new)
