"""PyTorch references of every kernel: the CPU path of the ops and the ground truth of the kernel tests."""

from __future__ import annotations

import torch


def lora_reference(x: torch.Tensor, y: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor,
                   scales: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``y + scale_a · (x A_a) B_a`` per row, ``a = index[row]``; rows with index -1 keep ``y``.

    x: (M, K); y: (M, N); lora_a: (L, K, R); lora_b: (L, R, N); scales: (L,); index: (M,) int.
    """
    out = y.clone()
    for a in index.unique().tolist():
        if a < 0:
            continue
        rows = (index == a).nonzero().squeeze(1)
        delta = (x[rows].float() @ lora_a[a].float()) @ lora_b[a].float()  # (m_a, N)
        out[rows] = (out[rows].float() + scales[a].float() * delta).to(y.dtype)
    return out


def horner(z: torch.Tensor, coeffs: torch.Tensor) -> torch.Tensor:
    """``Σ_i c_i z^i`` per column: z (M, N), coeffs (N, D+1) or (D+1,) in increasing degree (PolyAct's order)."""
    c = coeffs.float()
    out = c[..., -1].expand_as(z).clone() if c.dim() == 1 else c[:, -1].expand_as(z).clone()
    for i in range(c.shape[-1] - 2, -1, -1):
        out = out * z + c[..., i]
    return out


def lowrank_reference(x: torch.Tensor, u: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None = None,
                      coeffs: torch.Tensor | None = None) -> torch.Tensor:
    """``poly((x U) V + bias)``: x (M, K), u (K, R), v (R, N), bias (N,), coeffs (N, D+1) or (D+1,)."""
    z = (x.float() @ u.float()) @ v.float()
    if bias is not None:
        z = z + bias.float()
    return (horner(z, coeffs) if coeffs is not None else z).to(x.dtype)


def linear_poly_reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                          coeffs: torch.Tensor) -> torch.Tensor:
    """``poly(x Wᵀ + b)`` for an ``nn.Linear`` weight (N, K) followed by a PolyAct."""
    z = x.float() @ weight.float().t()
    if bias is not None:
        z = z + bias.float()
    return horner(z, coeffs).to(x.dtype)


def polynorm_reference(x: torch.Tensor, running_var: float, quad: tuple[float, float, float], mu: float,
                       weight: torch.Tensor | None = None, bias: torch.Tensor | None = None) -> torch.Tensor:
    """PolyNorm in eval mode over the last dim: ``(x − E x) · g(μ v) · sqrt(μ / Var̄)``, ``v = Var x / Var̄``."""
    a, b, c = quad
    xf = x.float()
    centred = xf - xf.mean(-1, keepdim=True)
    v = (centred * centred).mean(-1, keepdim=True) / running_var
    y = centred * (a * (mu * v - b) ** 2 + c) * (mu / running_var) ** 0.5
    if weight is not None:
        y = y * weight.float()
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)
