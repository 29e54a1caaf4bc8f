"""torch custom ops for veil's layers, used only while exporting (``veil::poly_norm`` and friends).

During export, PolyNorm / PolyAct / LinearAttention modules are swapped for thin wrappers that call
these ops, so ``torch.export`` keeps each layer as one node; the ONNX translation (functions.py) turns
each node into a single ``veil``-domain node backed by an ONNX function of standard ops. The eager
implementations are the eval-mode maths of the training modules (tests check they match).
"""

from __future__ import annotations

import torch


@torch.library.custom_op("veil::poly_norm", mutates_args=())
def poly_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, axes: list[int], a: float, b: float,
              c: float, mu: float, running_var: float) -> torch.Tensor:
    """Eval-mode PolyNorm: (x - E[x]) g(mu v) sqrt(mu / Var_bar) * weight + bias, v = Var[x] / Var_bar."""
    centred = x - x.mean(dim=axes, keepdim=True)
    v = (centred * centred).mean(dim=axes, keepdim=True) / running_var
    return centred * (a * (mu * v - b) ** 2 + c) * (mu / running_var) ** 0.5 * weight + bias


@poly_norm.register_fake
def _poly_norm_fake(x, weight, bias, axes, a, b, c, mu, running_var):
    return torch.empty_like(x)


@torch.library.custom_op("veil::poly_act", mutates_args=())
def poly_act(x: torch.Tensor, coeffs: torch.Tensor) -> torch.Tensor:
    """sum_i coeffs[i] * x^i, coeffs of shape (n + 1, 1, *broadcastable to x.shape[1:])."""
    y = coeffs[-1, 0]
    for i in range(coeffs.shape[0] - 2, -1, -1):  # Horner
        y = y * x + coeffs[i, 0]
    return (y * torch.ones_like(x)).contiguous()


@poly_act.register_fake
def _poly_act_fake(x, coeffs):
    return torch.empty_like(x)


@torch.library.custom_op("veil::linear_attention", mutates_args=())
def linear_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor,
                     sin: torch.Tensor) -> torch.Tensor:
    """RoPE(Q) (RoPE(K)^T V) / N for (B, H, N, hd) inputs and (N, hd) rotation tables."""
    def rope(t: torch.Tensor) -> torch.Tensor:
        half = t.shape[-1] // 2
        return t * cos + torch.cat([-t[..., half:], t[..., :half]], dim=-1) * sin

    kv = rope(k).transpose(-2, -1) @ v  # (B, H, hd, hd)
    return (rope(q) @ kv) / k.shape[-2]


@linear_attention.register_fake
def _linear_attention_fake(q, k, v, cos, sin):
    return torch.empty_like(q)
