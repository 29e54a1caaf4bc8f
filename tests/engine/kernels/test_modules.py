"""The drop-in layers give their unfused PyTorch equivalents' outputs (CPU: the reference path of the ops)."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from veil.engine.kernels.modules import LinearPolyAct, LowRankLinear, MultiLoraLinear, PolyNormEval


def test_multi_lora_linear_equals_per_adapter_loop() -> None:
    torch.manual_seed(0)
    base = nn.Linear(16, 12)
    a, b = torch.randn(4, 16, 3) * 0.2, torch.randn(4, 3, 12) * 0.2
    scales = torch.tensor([2.0, 1.0, 0.5, 4.0])
    layer = MultiLoraLinear(base, a, b, scales)
    x = torch.randn(2, 5, 16)
    index = torch.tensor([0, 1, 2, 3, -1, 3, 2, 1, 0, -1], dtype=torch.int32)
    with torch.no_grad():
        out = layer(x, index)
        flat = x.reshape(-1, 16)
        expected = torch.stack([base(row) + (scales[i] * (row @ a[i]) @ b[i] if i >= 0 else 0)
                                for row, i in zip(flat, index.tolist(), strict=True)]).reshape(2, 5, 12)
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=1e-5)
    with pytest.raises(ValueError, match=r"index: expected shape \(10,\)"):
        layer(x, index[:3])
    with pytest.raises(ValueError, match="adapters: expected A"):
        MultiLoraLinear(base, a[:, :8], b, scales)


def test_lowrank_from_linear_full_rank_is_exact_and_truncation_is_the_svd() -> None:
    torch.manual_seed(1)
    dense = nn.Linear(10, 6)
    x = torch.randn(7, 10)
    with torch.no_grad():
        torch.testing.assert_close(LowRankLinear.from_linear(dense, 6)(x), dense(x), atol=1e-5, rtol=1e-5)
        low = LowRankLinear.from_linear(dense, 2)
        w2 = (low.u @ low.v).t()
        s = torch.linalg.svdvals(dense.weight)
        assert abs(torch.linalg.matrix_norm(dense.weight - w2).item() - s[2:].norm().item()) < 1e-5  # Eckart–Young


def test_linear_polyact_and_polynorm_modules() -> None:
    torch.manual_seed(2)
    lin = nn.Linear(8, 5)
    coeffs = torch.randn(5, 3)
    x = torch.randn(4, 8)
    with torch.no_grad():
        z = lin(x)
        expected = coeffs[:, 0] + coeffs[:, 1] * z + coeffs[:, 2] * z * z
        torch.testing.assert_close(LinearPolyAct(lin, coeffs)(x), expected, atol=1e-5, rtol=1e-5)
        norm = PolyNormEval(1.0, (0.0, 0.0, 1.0), 1.0)  # g ≡ 1, Var̄ = μ = 1: plain centring
        torch.testing.assert_close(norm(x), x - x.mean(-1, keepdim=True), atol=1e-6, rtol=1e-6)


def test_parity_with_the_training_layers() -> None:
    """The fused layers compute ULD-Net's PolyAct(Linear) and PolyNorm (eval) exactly as training defines them."""
    from veil.training.uldnet.config import PolyActConfig, PolyNormConfig
    from veil.training.uldnet.polyact import PolyAct
    from veil.training.uldnet.polynorm import PolyNorm

    torch.manual_seed(3)
    lin, act = nn.Linear(12, 9), PolyAct(9, PolyActConfig(degree=3))
    norm = PolyNorm(9, PolyNormConfig(), layout="tokens")
    with torch.no_grad():
        act.alpha.normal_(0, 0.3)
        norm.running_var.fill_(1.7)
        norm.weight.uniform_(0.5, 1.5)
        norm.bias.normal_()
    norm.eval()
    x = torch.randn(3, 4, 12)
    with torch.no_grad():
        fused = LinearPolyAct(lin, act.coefficients())(x)
        torch.testing.assert_close(fused, act(lin(x)), atol=1e-5, rtol=1e-5)
        cfg = norm.config
        layer = PolyNormEval(float(norm.running_var), cfg.quadratic(), cfg.mu, norm.weight, norm.bias)
        torch.testing.assert_close(layer(fused), norm(fused), atol=1e-5, rtol=1e-5)
