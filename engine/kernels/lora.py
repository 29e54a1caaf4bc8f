"""Gathered multi-adapter LoRA: ``y[i] += s_a · (x[i] A_a) B_a`` with ``a = index[i]`` (-1: no adapter).

Punica's SGMV / vLLM's shrink-expand, with index offsets instead of pointer tables: the adapters are stacked
(``A: (L, K, R)``, ``B: (L, R, N)``), rows are grouped by adapter on the host (a stable argsort, the per-adapter
counts and start offsets), and program ``(a, m-block, n-block)`` gathers its rows by index, exits at once when
adapter ``a`` has fewer rows, and runs a tiled ``tl.dot``. One launch serves a batch that mixes any number of
adapters; rows without one are never read or written.

    shrink: T (M, R) fp32 = X[rows] · A_a          grid (L, cdiv(M, BM), cdiv(R, BR))
    expand: Y[rows] += s_a · T[rows] · B_a           grid (L, cdiv(M, BM), cdiv(N, BN))
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


def group_rows(index: torch.Tensor, num_adapters: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(order, starts, counts): rows sorted by adapter (rows with -1 last), and each adapter's slice of them."""
    if index.numel() and (int(index.max()) >= num_adapters or int(index.min()) < -1):
        raise ValueError(f"index: expected adapter ids in [-1, {num_adapters - 1}], received "
                         f"[{int(index.min())}, {int(index.max())}]")
    keyed = torch.where(index < 0, num_adapters, index.long())
    order = torch.argsort(keyed, stable=True).to(torch.int32)
    counts = torch.bincount(keyed, minlength=num_adapters + 1)[:num_adapters]
    starts = torch.cumsum(counts, 0) - counts
    return order, starts.to(torch.int32), counts.to(torch.int32)


@triton.jit
def _adapter_rows(order_ptr, starts_ptr, counts_ptr, adapter, mb, BM: tl.constexpr):
    """Row block ``mb`` of ``adapter``'s rows: (BM,) row indices gathered through the sorted order, and their mask."""
    local = mb * BM + tl.arange(0, BM)
    row_ok = local < tl.load(counts_ptr + adapter)
    return tl.load(order_ptr + tl.load(starts_ptr + adapter) + local, mask=row_ok, other=0), row_ok


@triton.jit
def _shrink_kernel(x_ptr, a_ptr, t_ptr, order_ptr, starts_ptr, counts_ptr, K, R,
                   sxm, sxk, sal, sak, sar, stm, str_,
                   BM: tl.constexpr, BK: tl.constexpr, BR: tl.constexpr):
    adapter, mb, rb = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    if mb * BM >= tl.load(counts_ptr + adapter):
        return
    rows, row_ok = _adapter_rows(order_ptr, starts_ptr, counts_ptr, adapter, mb, BM)
    rs = rb * BR + tl.arange(0, BR)
    acc = tl.zeros((BM, BR), dtype=tl.float32)
    for k0 in range(0, K, BK):
        ks = k0 + tl.arange(0, BK)
        xt = tl.load(x_ptr + rows[:, None] * sxm + ks[None, :] * sxk, mask=row_ok[:, None] & (ks[None, :] < K),
                     other=0.0)  # (BM, BK)
        at = tl.load(a_ptr + adapter * sal + ks[:, None] * sak + rs[None, :] * sar,
                     mask=(ks[:, None] < K) & (rs[None, :] < R), other=0.0)  # (BK, BR)
        acc += tl.dot(xt.to(tl.float32), at.to(tl.float32), input_precision="ieee")
    tl.store(t_ptr + rows[:, None] * stm + rs[None, :] * str_, acc, mask=row_ok[:, None] & (rs[None, :] < R))


@triton.jit
def _expand_kernel(t_ptr, b_ptr, y_ptr, scale_ptr, order_ptr, starts_ptr, counts_ptr, R, N,
                   stm, str_, sbl, sbr, sbn, sym, syn,
                   BM: tl.constexpr, BR: tl.constexpr, BN: tl.constexpr):
    adapter, mb, nb = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    if mb * BM >= tl.load(counts_ptr + adapter):  # this adapter has fewer rows: nothing to do
        return
    rows, row_ok = _adapter_rows(order_ptr, starts_ptr, counts_ptr, adapter, mb, BM)
    ns = nb * BN + tl.arange(0, BN)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for r0 in range(0, R, BR):
        rs = r0 + tl.arange(0, BR)
        tt = tl.load(t_ptr + rows[:, None] * stm + rs[None, :] * str_, mask=row_ok[:, None] & (rs[None, :] < R),
                     other=0.0)  # (BM, BR) fp32
        bt = tl.load(b_ptr + adapter * sbl + rs[:, None] * sbr + ns[None, :] * sbn,
                     mask=(rs[:, None] < R) & (ns[None, :] < N), other=0.0)  # (BR, BN)
        acc += tl.dot(tt, bt.to(tl.float32), input_precision="ieee")
    y_ptrs = y_ptr + rows[:, None] * sym + ns[None, :] * syn
    mask = row_ok[:, None] & (ns[None, :] < N)
    y = tl.load(y_ptrs, mask=mask, other=0.0).to(tl.float32)
    out = y + tl.load(scale_ptr + adapter).to(tl.float32) * acc
    tl.store(y_ptrs, out.to(y_ptr.dtype.element_ty), mask=mask)


def _block(n: int, low: int = 16, high: int = 64) -> int:
    return max(low, min(high, triton.next_power_of_2(n)))


def lora_apply(x: torch.Tensor, y: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor, scales: torch.Tensor,
               index: torch.Tensor) -> torch.Tensor:
    """``y`` (a new tensor) plus each row's adapter delta; shapes as in :func:`reference.lora_reference`."""
    (m, k), (num_adapters, _, r), n = x.shape, lora_a.shape, lora_b.shape[2]
    order, starts, counts = group_rows(index, num_adapters)
    t = torch.zeros((m, r), device=x.device, dtype=torch.float32)
    out = y.clone()
    bm = 16 if m <= 16 else 32
    br, bk, bn = _block(r), _block(k, 32), _block(n, 32)
    _shrink_kernel[(num_adapters, triton.cdiv(m, bm), triton.cdiv(r, br))](
        x, lora_a, t, order, starts, counts, k, r, *x.stride(), *lora_a.stride(), *t.stride(), BM=bm, BK=bk, BR=br)
    _expand_kernel[(num_adapters, triton.cdiv(m, bm), triton.cdiv(n, bn))](
        t, lora_b, out, scales, order, starts, counts, r, n, *t.stride(), *lora_b.stride(), *out.stride(),
        BM=bm, BR=br, BN=bn)
    return out
