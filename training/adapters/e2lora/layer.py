"""E²LoRA's layer: a frozen ``nn.Linear`` plus ``(alpha / r_k) · B_k A_k dropout(x)`` with (A_k, B_k) shared by
every layer of interval k."""

from __future__ import annotations

import math

import torch
from torch import nn

from ..layer import AdapterLayer


class SharedLora(nn.Module):
    """One interval's factors ``lora_A`` (r_k, in) and ``lora_B`` (out, r_k); PEFT's init (A Kaiming, B = 0)."""

    def __init__(self, in_features: int, out_features: int, r: int, like: torch.Tensor) -> None:
        super().__init__()
        kw = {"device": like.device, "dtype": like.dtype}
        self.lora_A = nn.Linear(in_features, r, bias=False, **kw)
        self.lora_B = nn.Linear(r, out_features, bias=False, **kw)
        if not like.is_meta:
            nn.init.kaiming_uniform_(self.lora_A.weight, a=math.sqrt(5))
            nn.init.zeros_(self.lora_B.weight)


class E2LoraLinear(AdapterLayer):
    """A linear layer adapted by its interval's shared LoRA (Li et al., "Efficient and Effective LoRA with
    Entropy-Guided Adaptive Sharing", ICLR 2026). ``lora_A`` / ``lora_B`` are the **same** modules (same
    ``nn.Parameter`` objects) in every layer of the interval, so they have one gradient and one optimizer state.

    Args:
        base_layer: the frozen linear, weight (out, in).
        shared: the interval's factors.
        scaling: ``lora_alpha / r_k``.
        dropout: dropout probability on the input of A.
    """

    def __init__(self, base_layer: nn.Linear, shared: SharedLora, scaling: float, dropout: float) -> None:
        super().__init__(base_layer)
        self.lora_A, self.lora_B = shared.lora_A, shared.lora_B
        self.r, self.scaling = shared.lora_A.out_features, scaling
        self.lora_dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()

    def delta_forward(self, x: torch.Tensor) -> torch.Tensor:
        # x (..., in) -> A (..., r_k) -> B (..., out)
        return self.lora_B(self.lora_A(self.lora_dropout(x))) * self.scaling

    def delta_weight(self) -> torch.Tensor:
        return (self.lora_B.weight @ self.lora_A.weight) * self.scaling  # (out, r_k) @ (r_k, in) -> (out, in)

    def extra_repr(self) -> str:
        return f"r={self.r}, scaling={self.scaling:g}, shared"
