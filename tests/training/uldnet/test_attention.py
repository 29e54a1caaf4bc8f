"""Linear attention RoPE(Q) RoPE(K)^T V: equals its quadratic form, RoPE is relative, no softmax."""

from __future__ import annotations

import torch
from veil.training.uldnet import LinearAttention, MultiHeadAttention
from veil.training.uldnet.attention import apply_rope, rope_tables


def test_linear_attention_equals_quadratic_form() -> None:
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 5, 8, dtype=torch.float64) for _ in range(3))
    attn = LinearAttention(5, 8).double()
    cos, sin = attn.rope_cos.double(), attn.rope_sin.double()
    scores = apply_rope(q, cos, sin) @ apply_rope(k, cos, sin).transpose(-2, -1)  # (B, H, N, N), no softmax
    torch.testing.assert_close(attn(q, k, v), scores @ v / 5)


def test_rope_preserves_norms_and_depends_on_relative_position() -> None:
    torch.manual_seed(0)
    cos, sin = rope_tables(16, 8)
    q, k = torch.randn(8), torch.randn(8)
    rq = apply_rope(q.expand(16, 8), cos, sin)
    rk = apply_rope(k.expand(16, 8), cos, sin)
    torch.testing.assert_close(rq.norm(dim=-1), q.norm().expand(16))
    dots = rq @ rk.T  # (16, 16): <R_m q, R_n k>
    torch.testing.assert_close(dots[3, 1], dots[10, 8])
    torch.testing.assert_close(dots[0, 5], dots[7, 12])


def test_multihead_is_linear_in_values() -> None:
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 4, num_tokens=6)
    with torch.no_grad():
        mha.qkv.bias.zero_()
        mha.proj.bias.zero_()
    x = torch.randn(2, 6, 16)
    out = mha(x)
    assert out.shape == (2, 6, 16)
    with torch.no_grad():
        mha.qkv.weight[32:] *= 2  # scale V only
    torch.testing.assert_close(mha(x), 2 * out)
