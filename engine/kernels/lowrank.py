"""Fused low-rank linear ``poly((x U) V + bias)`` for SVD-compressed layers (engine.md §3.2).

Program ``(m-block, n-group)`` accumulates ``T = x[BM, :] · U`` (BM × R, fp32, R ≤ 256 kept on chip) over K
once, then writes ``NT`` consecutive N-tiles ``T · V[:, tile] + bias`` with the polynomial epilogue — so ``x U``
never goes to memory and the dense ``W = U V`` is never rebuilt (the anti-pattern of engine.md §3.2). A group of
``NT`` tiles shares one ``T``; more groups give more parallelism at small M for one extra ``x U`` each.

    cost: 2·M·R·(K + N) FLOPs (+ 2·M·K·R per extra N-group), reads R·(K + N) weights
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

MAX_RANK = 256


@triton.jit
def _horner(z, c_ptr, cols, col_ok, DEG: tl.constexpr, sc_n, sc_d):
    """Σ_i c[col, i] z^i in fp32 (PolyAct's coefficient order, highest first in the loop)."""
    out = tl.load(c_ptr + cols * sc_n + DEG * sc_d, mask=col_ok, other=0.0).to(tl.float32)[None, :] + z * 0.0
    for i in tl.static_range(DEG - 1, -1, -1):
        out = out * z + tl.load(c_ptr + cols * sc_n + i * sc_d, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    return out


@triton.jit
def _lowrank_kernel(x_ptr, u_ptr, v_ptr, bias_ptr, c_ptr, y_ptr, M, K, R, N,
                    sxm, sxk, suk, sur, svr, svn, sym, syn, sc_n, sc_d,
                    HAS_BIAS: tl.constexpr, DEG: tl.constexpr,
                    BM: tl.constexpr, BK: tl.constexpr, BR: tl.constexpr, BN: tl.constexpr, NT: tl.constexpr):
    mb, group = tl.program_id(0), tl.program_id(1)
    rows = mb * BM + tl.arange(0, BM)
    row_ok = rows < M
    rs = tl.arange(0, BR)
    t = tl.zeros((BM, BR), dtype=tl.float32)  # x U for this row block, on chip
    for k0 in range(0, K, BK):
        ks = k0 + tl.arange(0, BK)
        xt = tl.load(x_ptr + rows[:, None] * sxm + ks[None, :] * sxk, mask=row_ok[:, None] & (ks[None, :] < K),
                     other=0.0)
        ut = tl.load(u_ptr + ks[:, None] * suk + rs[None, :] * sur, mask=(ks[:, None] < K) & (rs[None, :] < R),
                     other=0.0)
        t += tl.dot(xt.to(tl.float32), ut.to(tl.float32), input_precision="ieee")
    for j in tl.static_range(NT):
        cols = (group * NT + j) * BN + tl.arange(0, BN)
        col_ok = cols < N
        vt = tl.load(v_ptr + rs[:, None] * svr + cols[None, :] * svn, mask=(rs[:, None] < R) & col_ok[None, :],
                     other=0.0)
        z = tl.dot(t, vt.to(tl.float32), input_precision="ieee")  # (BM, BN)
        if HAS_BIAS:
            z += tl.load(bias_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
        if DEG >= 0:
            z = _horner(z, c_ptr, cols, col_ok, DEG, sc_n, sc_d)
        tl.store(y_ptr + rows[:, None] * sym + cols[None, :] * syn, z.to(y_ptr.dtype.element_ty),
                 mask=row_ok[:, None] & col_ok[None, :])


def coefficient_table(coeffs: torch.Tensor | None, n: int) -> tuple[torch.Tensor | None, int, int, int]:
    """(table, degree, column stride, degree stride): per-column (N, D+1) or shared (D+1,) coefficients."""
    if coeffs is None:
        return None, -1, 0, 0
    if coeffs.dim() == 1:
        return coeffs, coeffs.shape[0] - 1, 0, coeffs.stride(0)
    if coeffs.shape[0] != n:
        raise ValueError(f"coeffs: expected ({n}, degree + 1) or (degree + 1,), received {tuple(coeffs.shape)}")
    return coeffs, coeffs.shape[1] - 1, coeffs.stride(0), coeffs.stride(1)


def lowrank_linear(x: torch.Tensor, u: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None = None,
                   coeffs: torch.Tensor | None = None, tiles_per_program: int = 4) -> torch.Tensor:
    """``poly((x U) V + bias)`` for x (M, K), u (K, R), v (R, N); R ≤ 256."""
    (m, k), r, n = x.shape, u.shape[1], v.shape[1]
    if r > MAX_RANK:
        raise ValueError(f"rank: expected <= {MAX_RANK} (x U stays on chip), received {r}")
    y = torch.empty((m, n), device=x.device, dtype=x.dtype)
    table, degree, sc_n, sc_d = coefficient_table(coeffs, n)
    bm, bn = (16 if m <= 16 else 32), max(16, min(64, triton.next_power_of_2(n)))
    br, bk = max(16, triton.next_power_of_2(r)), max(16, min(64, triton.next_power_of_2(k)))
    nt = max(1, min(tiles_per_program, triton.cdiv(n, bn)))
    grid = (triton.cdiv(m, bm), triton.cdiv(triton.cdiv(n, bn), nt))
    _lowrank_kernel[grid](x, u, v, bias if bias is not None else y, table if table is not None else y, y,
                          m, k, r, n, *x.stride(), *u.stride(), *v.stride(), *y.stride(), sc_n, sc_d,
                          HAS_BIAS=bias is not None, DEG=degree, BM=bm, BK=bk, BR=br, BN=bn, NT=nt)
    return y
