"""Polynomial layers of ULD-Net networks as single kernels (engine.md §3.3).

- ``linear_polyact``: ``poly(x Wᵀ + b)``, a tiled GEMM whose epilogue evaluates the PolyAct polynomial by Horner
  in fp32 registers, with the same coefficient order and degree as the HE plan (so plaintext and ciphertext agree);
- ``polynorm``: PolyNorm in eval mode over the last dim, ``(x − E x) · g(μ v) · sqrt(μ / Var̄) · w + b`` with
  ``g(z) = a (z − b)² + c``, one program per row (the LayerNorm tutorial's shape, no rsqrt of the data).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .lowrank import _horner, coefficient_table


@triton.jit
def _linear_poly_kernel(x_ptr, w_ptr, bias_ptr, c_ptr, y_ptr, M, K, N,
                        sxm, sxk, swn, swk, sym, syn, sc_n, sc_d,
                        HAS_BIAS: tl.constexpr, DEG: tl.constexpr,
                        BM: tl.constexpr, BK: tl.constexpr, BN: tl.constexpr):
    mb, nb = tl.program_id(0), tl.program_id(1)
    rows, cols = mb * BM + tl.arange(0, BM), nb * BN + tl.arange(0, BN)
    row_ok, col_ok = rows < M, cols < N
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        ks = k0 + tl.arange(0, BK)
        xt = tl.load(x_ptr + rows[:, None] * sxm + ks[None, :] * sxk, mask=row_ok[:, None] & (ks[None, :] < K),
                     other=0.0)
        wt = tl.load(w_ptr + cols[None, :] * swn + ks[:, None] * swk, mask=col_ok[None, :] & (ks[:, None] < K),
                     other=0.0)  # (BK, BN) = Wᵀ tile
        acc += tl.dot(xt.to(tl.float32), wt.to(tl.float32), input_precision="ieee")
    if HAS_BIAS:
        acc += tl.load(bias_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    out = _horner(acc, c_ptr, cols, col_ok, DEG, sc_n, sc_d)
    tl.store(y_ptr + rows[:, None] * sym + cols[None, :] * syn, out.to(y_ptr.dtype.element_ty),
             mask=row_ok[:, None] & col_ok[None, :])


def linear_polyact(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                   coeffs: torch.Tensor) -> torch.Tensor:
    """``poly(x Wᵀ + b)``: x (M, K), weight (N, K) as ``nn.Linear``, coeffs (N, D+1) or (D+1,)."""
    (m, k), n = x.shape, weight.shape[0]
    y = torch.empty((m, n), device=x.device, dtype=x.dtype)
    table, degree, sc_n, sc_d = coefficient_table(coeffs, n)
    bm, bn, bk = (16 if m <= 16 else 32), max(16, min(64, triton.next_power_of_2(n))), \
        max(16, min(64, triton.next_power_of_2(k)))
    _linear_poly_kernel[(triton.cdiv(m, bm), triton.cdiv(n, bn))](
        x, weight, bias if bias is not None else y, table, y, m, k, n, *x.stride(), *weight.stride(), *y.stride(),
        sc_n, sc_d, HAS_BIAS=bias is not None, DEG=degree, BM=bm, BK=bk, BN=bn)
    return y


@triton.jit
def _polynorm_kernel(x_ptr, w_ptr, b_ptr, y_ptr, D, sxm, sym, inv_var, scale, qa, qb, qc, mu,
                     HAS_W: tl.constexpr, HAS_B: tl.constexpr, BD: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BD)
    ok = cols < D
    x = tl.load(x_ptr + row * sxm + cols, mask=ok, other=0.0).to(tl.float32)
    centred = tl.where(ok, x - tl.sum(x, axis=0) / D, 0.0)
    v = tl.sum(centred * centred, axis=0) / D * inv_var
    g = qa * (mu * v - qb) * (mu * v - qb) + qc
    y = centred * (g * scale)
    if HAS_W:
        y = y * tl.load(w_ptr + cols, mask=ok, other=0.0).to(tl.float32)
    if HAS_B:
        y = y + tl.load(b_ptr + cols, mask=ok, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * sym + cols, y.to(y_ptr.dtype.element_ty), mask=ok)


def polynorm(x: torch.Tensor, running_var: float, quad: tuple[float, float, float], mu: float,
             weight: torch.Tensor | None = None, bias: torch.Tensor | None = None) -> torch.Tensor:
    """PolyNorm (eval) over the last dim of x (..., D); D ≤ 16384 (one row per program)."""
    d = x.shape[-1]
    if d > 16384:
        raise ValueError(f"x: expected a last dim <= 16384 for the one-row-per-program kernel, received {d}")
    rows = x.reshape(-1, d).contiguous()
    y = torch.empty_like(rows)
    qa, qb, qc = quad
    _polynorm_kernel[(rows.shape[0],)](rows, weight if weight is not None else rows, bias if bias is not None else rows,
                                       y, d, rows.stride(0), y.stride(0), 1.0 / running_var,
                                       (mu / running_var) ** 0.5, qa, qb, qc, mu,
                                       HAS_W=weight is not None, HAS_B=bias is not None,
                                       BD=triton.next_power_of_2(d))
    return y.reshape(x.shape)
