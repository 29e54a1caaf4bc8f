"""Drop-in layers on the custom ops: the engine's torch path uses the fused kernels on CUDA, references on CPU.

- :class:`MultiLoraLinear`: one base ``nn.Linear`` plus a stack of LoRA adapters; ``forward(x, index)`` applies
  each row's adapter (-1: base only) in one gathered launch — a mixed-tenant batch is one batch;
- :class:`LowRankLinear`: ``(x U) V + b`` for SVD-compressed layers (from a dense layer with :meth:`from_linear`);
- :class:`LinearPolyAct` and :class:`PolyNormEval`: a linear layer + polynomial activation, and PolyNorm, for
  polynomial (HE-ready) networks served in plaintext.
"""

from __future__ import annotations

import torch
from torch import nn

from . import ops


class MultiLoraLinear(nn.Module):
    """``y = x Wᵀ + b + s_a (x A_a) B_a`` with ``a`` chosen per row.

    Args:
        base: the frozen base layer (weight (N, K)).
        lora_a: (L, K, R) stacked down-projections (PEFT's ``lora_A.weight`` transposed); lora_b: (L, R, N).
        scales: (L,) ``lora_alpha / r`` per adapter (ranks are padded to the largest with zeros).
    """

    def __init__(self, base: nn.Linear, lora_a: torch.Tensor, lora_b: torch.Tensor, scales: torch.Tensor) -> None:
        super().__init__()
        n, k = base.weight.shape
        if lora_a.dim() != 3 or lora_a.shape[1] != k or lora_b.shape[0] != lora_a.shape[0] or lora_b.shape[2] != n \
                or lora_b.shape[1] != lora_a.shape[2] or scales.shape != (lora_a.shape[0],):
            raise ValueError(f"adapters: expected A (L, {k}, R), B (L, R, {n}), scales (L,); received A "
                             f"{tuple(lora_a.shape)}, B {tuple(lora_b.shape)}, scales {tuple(scales.shape)}")
        self.base = base
        self.register_buffer("lora_a", lora_a)
        self.register_buffer("lora_b", lora_b)
        self.register_buffer("scales", scales.float())

    def forward(self, x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        """x (..., K), index (rows of x flattened to (M,)) -> (..., N)."""
        flat = x.reshape(-1, x.shape[-1])
        if index.shape != (flat.shape[0],):
            raise ValueError(f"index: expected shape ({flat.shape[0]},) (one adapter id per row), received "
                             f"{tuple(index.shape)}")
        y = ops.lora_apply(flat, self.base(flat), self.lora_a, self.lora_b, self.scales, index.to(torch.int32))
        return y.reshape(*x.shape[:-1], y.shape[-1])


class LowRankLinear(nn.Module):
    """``(x U) V + b`` with U (K, R), V (R, N): the fused kernel on CUDA."""

    def __init__(self, u: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        super().__init__()
        self.u, self.v = nn.Parameter(u), nn.Parameter(v)
        self.bias = nn.Parameter(bias) if bias is not None else None

    @classmethod
    def from_linear(cls, layer: nn.Linear, rank: int) -> LowRankLinear:
        """The rank-``rank`` truncated SVD of a dense layer (W ≈ (U √S)(√S Vᵀ))."""
        u, s, vh = torch.linalg.svd(layer.weight.detach().float().t(), full_matrices=False)  # Wᵀ (K, N)
        root = s[:rank].sqrt()
        bias = layer.bias.detach().clone() if layer.bias is not None else None
        return cls((u[:, :rank] * root).contiguous(), (root[:, None] * vh[:rank]).contiguous(), bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        return ops.lowrank_linear(flat, self.u, self.v, self.bias).reshape(*x.shape[:-1], self.v.shape[1])


class LinearPolyAct(nn.Module):
    """``poly(x Wᵀ + b)``: an ``nn.Linear`` and a PolyAct (coefficients (N, D+1) or (D+1,), lowest degree first)."""

    def __init__(self, linear: nn.Linear, coeffs: torch.Tensor) -> None:
        super().__init__()
        self.linear = linear
        self.register_buffer("coeffs", coeffs.detach().float().contiguous())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        y = ops.linear_polyact(flat, self.linear.weight, self.linear.bias, self.coeffs)
        return y.reshape(*x.shape[:-1], y.shape[-1])


class PolyNormEval(nn.Module):
    """PolyNorm over the last dim in eval mode (frozen Var̄), ``g(z) = a (z − b)² + c``."""

    def __init__(self, running_var: float, quad: tuple[float, float, float], mu: float,
                 weight: torch.Tensor | None = None, bias: torch.Tensor | None = None) -> None:
        super().__init__()
        self.running_var, self.quad, self.mu = float(running_var), tuple(float(q) for q in quad), float(mu)
        self.weight = nn.Parameter(weight) if weight is not None else None
        self.bias = nn.Parameter(bias) if bias is not None else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ops.polynorm(x, self.running_var, *self.quad, self.mu, self.weight, self.bias)
