"""Attention for PolyViT: ULD-Net's linear attention RoPE(Q) RoPE(K)^T V (no softmax) and the softmax baseline.

Linear attention is evaluated as RoPE(Q) (RoPE(K)^T V) / N, which is linear in the number of tokens N and
costs two ciphertext-ciphertext products; RoPE is plaintext cos/sin products plus a slot permutation.
The attention operators take per-head (B, H, N, hd) queries, keys and values; MultiHeadAttention wraps
them with the qkv and output projections. Reference: ../shared/specs/he.md §1.4.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def rope_tables(num_tokens: int, head_dim: int, base: float = 10000.0) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables, shape (N, head_dim), in the rotate-half convention."""
    inv_freq = 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)  # (hd/2,)
    angles = torch.arange(num_tokens, dtype=torch.float64)[:, None] * inv_freq[None, :]  # (N, hd/2)
    angles = torch.cat([angles, angles], dim=-1)  # (N, hd)
    return angles.cos().float(), angles.sin().float()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (x_i, x_{i+hd/2}) of x (B, H, N, hd) by position-dependent angles."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


class _RoPEAttention(nn.Module):
    """RoPE on queries and keys, then ``mix``; subclasses decide how tokens are mixed."""

    def __init__(self, num_tokens: int, head_dim: int) -> None:
        super().__init__()
        cos, sin = rope_tables(num_tokens, head_dim)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:  # 3 x (B, H, N, hd)
        n = q.shape[-2]
        cos, sin = self.rope_cos[:n], self.rope_sin[:n]
        return self.mix(apply_rope(q, cos, sin), apply_rope(k, cos, sin), v)  # (B, H, N, hd)

    def mix(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


class LinearAttention(_RoPEAttention):
    """ULD-Net attention: RoPE(Q) (RoPE(K)^T V) / N, no softmax (RoPE 1 level + 2 ciphertext products)."""

    def mix(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        kv = k.transpose(-2, -1) @ v  # (B, H, hd, hd)
        return (q @ kv) / k.shape[-2]


class SoftmaxAttention(_RoPEAttention):
    """Baseline: standard scaled dot-product softmax attention with the same RoPE."""

    def mix(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v)


class MultiHeadAttention(nn.Module):
    """qkv projection -> per-head attention (linear or softmax) -> output projection."""

    def __init__(self, dim: int, heads: int, num_tokens: int, linear: bool = True) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.attention = (LinearAttention if linear else SoftmaxAttention)(num_tokens, self.head_dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape[0], x.shape[1], x.shape[2]  # (B, N, D)
        # the batch axis stays first (the HE compiler lowers every node per sample)
        qkv = self.qkv(x).reshape(b, n, 3, self.heads, self.head_dim).permute(0, 2, 3, 1, 4)  # (B, 3, H, N, hd)
        out = self.attention(qkv[:, 0], qkv[:, 1], qkv[:, 2])  # (B, H, N, hd)
        return self.proj(out.transpose(1, 2).reshape(b, n, d))
