"""LoRA's layer: a frozen ``nn.Linear`` plus ``(alpha / r) · B A dropout(x)``."""

from __future__ import annotations

import math

import torch
from torch import nn

from ..layer import AdapterLayer, linear_dims


class LoraLinear(AdapterLayer):
    """LoRA on one linear layer (Hu et al., "LoRA: Low-Rank Adaptation of Large Language Models", ICLR 2022).

    Parameter names match PEFT's (``lora_A.weight`` (r, in), ``lora_B.weight`` (out, r)) so that the saved keys
    are PEFT's keys.

    Args:
        base_layer: the frozen ``nn.Linear`` or GPT-2 ``Conv1D``.
        r: rank.
        scaling: ``alpha / r`` (``alpha / √r`` with rsLoRA).
        dropout: dropout probability on the input of A.
    """

    def __init__(self, base_layer: nn.Module, r: int, scaling: float, dropout: float) -> None:
        super().__init__(base_layer)
        self.r, self.scaling = r, scaling
        self.lora_dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        kw = {"device": base_layer.weight.device, "dtype": base_layer.weight.dtype}
        d_in, d_out = linear_dims(base_layer)
        self.lora_A = nn.Linear(d_in, r, bias=False, **kw)
        self.lora_B = nn.Linear(r, d_out, bias=False, **kw)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """PEFT's default init: A Kaiming-uniform with a = √5, B zero (so the layer starts as the base)."""
        if self.lora_A.weight.is_meta:
            return
        nn.init.kaiming_uniform_(self.lora_A.weight, a=math.sqrt(5))
        nn.init.zeros_(self.lora_B.weight)

    def delta_forward(self, x: torch.Tensor) -> torch.Tensor:
        # x (..., in) -> A (..., r) -> B (..., out)
        return self.lora_B(self.lora_A(self.lora_dropout(x))) * self.scaling

    def delta_weight(self) -> torch.Tensor:
        return (self.lora_B.weight @ self.lora_A.weight) * self.scaling  # (out, r) @ (r, in) -> (out, in)

    def extra_repr(self) -> str:
        return f"r={self.r}, scaling={self.scaling:g}"
