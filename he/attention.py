"""Linear attention under CKKS: ``veil.LinearAttention`` lowered to two ciphertext-ciphertext products.

ULD-Net's attention RoPE(Q) (RoPE(K)^T V) / N (training/uldnet/attention.py) is bilinear in its inputs. A
matrix product of two ciphertext tensors is lowered as two replications (affine maps that copy each
factor onto a common index space), one elementwise product, and a sum over the contracted index (affine,
left pending so it folds into whatever follows, e.g. the output projection):

    KV[h, a, c] = sum_t RK[h, t, a] V[h, t, c]         index space (h, t, a, c)
    Y[h, t, c]  = sum_a RQ[h, t, a] KV[h, a, c] / N     index space (h, t, a, c)

RoPE is a plaintext affine map (cos/sin factors and the rotate-half permutation) that folds into the
replications, so it costs no level of its own. Cost: 4 levels (replicate + product, twice) over
H·N·hd² features per sample; the per-head qkv projection folds into the first replication.
"""

from __future__ import annotations

import numpy as np
from veil.he.errors import CompileError
from veil.he.lowering import Affine, Builder


def rope_matrix(cos: np.ndarray, sin: np.ndarray, heads: int) -> np.ndarray:
    """RoPE on a flattened (H, N, hd) sample: x * cos + rotate_half(x) * sin as a (F, F) matrix."""
    tokens, dim = cos.shape
    half = dim // 2
    one = np.diag(cos.reshape(-1).astype(np.float64))  # (N·hd, N·hd)
    t, i = np.divmod(np.arange(tokens * dim), dim)
    partner = t * dim + (i + half) % dim  # rotate_half reads x[i + hd/2] (negated) or x[i - hd/2]
    sign = np.where(i < half, -1.0, 1.0)
    one[np.arange(tokens * dim), partner] += sign * sin.reshape(-1)
    return np.kron(np.eye(heads), one)


def _select(shape: tuple[int, ...], keep: tuple[int, ...]) -> np.ndarray:
    """0/1 matrix copying a tensor over axes ``keep`` of ``shape`` onto every index of ``shape``: (prod, prod(keep))."""
    index = np.indices(shape).reshape(len(shape), -1)  # (axes, F)
    source = np.ravel_multi_index(tuple(index[a] for a in keep), tuple(shape[a] for a in keep))
    out = np.zeros((index.shape[1], int(np.prod([shape[a] for a in keep]))))
    out[np.arange(index.shape[1]), source] = 1.0
    return out


def bilinear(builder: Builder, a: Affine, b: Affine, space: tuple[int, ...], keep_a: tuple[int, ...],
             keep_b: tuple[int, ...], keep_out: tuple[int, ...], scale: float, node: str) -> Affine:
    """``out[keep_out] = scale * sum over the other axes of a[keep_a] * b[keep_b]`` on the index ``space``.

    ``a`` and ``b`` are replicated onto ``space`` (one linear op each, 1 level), multiplied elementwise
    (1 level); the contraction stays a pending affine map.
    """
    ra, rb = _select(space, keep_a), _select(space, keep_b)
    va = builder.linear(a.then(ra, np.zeros(len(ra)), space), node)
    vb = builder.linear(b.then(rb, np.zeros(len(rb)), space), node)
    product = builder.mul(va, vb, node)
    contract = scale * _select(space, keep_out).T  # (prod(keep_out), prod(space))
    out_shape = tuple(space[i] for i in keep_out)
    return Affine({product: contract}, np.zeros(len(contract)), out_shape)


def lower_linear_attention(builder: Builder, q: Affine, k: Affine, v: Affine, cos: np.ndarray, sin: np.ndarray,
                           node: str) -> Affine:
    """``veil.LinearAttention(q, k, v, cos, sin)`` for per-sample (H, N, hd) tensors -> pending (H, N, hd)."""
    if not (q.shape == k.shape == v.shape) or len(q.shape) != 3:
        raise CompileError(f"node {node!r} (veil.LinearAttention): expected q, k, v of one per-sample shape (H, N, hd), "
                      f"received {q.shape}, {k.shape}, {v.shape}")
    heads, tokens, dim = q.shape
    cos, sin = (np.asarray(t, dtype=np.float64).reshape(-1, dim)[:tokens] for t in (cos, sin))
    if cos.shape != (tokens, dim) or sin.shape != (tokens, dim) or dim % 2:
        raise CompileError(f"node {node!r} (veil.LinearAttention): expected RoPE tables ({tokens}, {dim}) with an even "
                      f"head dim, received {cos.shape} and {sin.shape}")
    rope = rope_matrix(cos, sin, heads)
    zeros = np.zeros(rope.shape[0])
    rq, rk = q.then(rope, zeros, q.shape), k.then(rope, zeros, k.shape)
    space = (heads, tokens, dim, dim)  # (h, t, a, c)
    kv = bilinear(builder, rk, v, space, (0, 1, 2), (0, 1, 3), (0, 2, 3), 1.0, node)  # (h, a, c)
    return bilinear(builder, rq, kv, space, (0, 1, 2), (0, 2, 3), (0, 1, 3), 1.0 / tokens, node)  # (h, t, c)
