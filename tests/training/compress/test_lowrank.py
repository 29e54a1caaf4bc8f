"""Spec §5.1 (a): the exact math of plain SVD, SVD-LLM, CEALC and ACES on random float64 matrices, plus the
FactorizedLinear layer and the ratio -> rank arithmetic."""

from __future__ import annotations

import math

import pytest
import torch
from veil.training.compress.lowrank import solvers
from veil.training.compress.lowrank.layer import FactorizedLinear, weight_params

M, N_IN, TOKENS, RANK = 12, 10, 200, 4


def problem(seed: int = 0, tokens: int = TOKENS) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """W (m, n), anisotropic student inputs X (n, N) and teacher inputs X^f = X + E (correlated error)."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(M, N_IN, generator=g, dtype=torch.float64)
    mix = torch.randn(N_IN, N_IN, generator=g, dtype=torch.float64) * torch.logspace(0, -2, N_IN, dtype=torch.float64)
    x = mix @ torch.randn(N_IN, tokens, generator=g, dtype=torch.float64)
    err = 0.3 * (torch.randn(N_IN, N_IN, generator=g, dtype=torch.float64) @ x) + 0.05 * torch.randn(
        N_IN, tokens, generator=g, dtype=torch.float64)
    return w, x, x + err


def stats(x: torch.Tensor, xf: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(H, H^f, Δ) as the sequential pass accumulates them."""
    return x @ x.T, xf @ xf.T, (xf - x) @ x.T


@pytest.mark.parametrize("beta", [0.0, 0.3, 0.7, 1.0])
def test_cealc_optimal_and_truncation_aware(beta: float) -> None:
    w, x, xf = problem()
    h, hf, delta = stats(x, xf)
    a, b, s = solvers.cealc(w, h, delta, RANK, beta, ridge=0.0)
    obj = solvers.cealc_objective(a @ b, w, x, xf, beta)
    # the unconstrained optimum W* = W (H + βΔ) H⁻¹ gives the irreducible part; truncation adds Σ_{i>r} σ_i²
    w_star = w @ (h + beta * delta) @ torch.linalg.inv(h)
    irreducible = solvers.cealc_objective(w_star, w, x, xf, beta)
    assert obj == pytest.approx(irreducible + float(s[RANK:].pow(2).sum()), rel=1e-8)
    # beats SVD-LLM's and plain SVD's factors on its own objective, and 200 random rank-r perturbations
    a2, b2 = solvers.svd_llm(w, hf, RANK, ridge=0.0)
    a3, b3 = solvers.plain_svd(w, RANK)
    assert obj <= solvers.cealc_objective(a2 @ b2, w, x, xf, beta) + 1e-9
    assert obj <= solvers.cealc_objective(a3 @ b3, w, x, xf, beta) + 1e-9
    g = torch.Generator().manual_seed(1)
    for _ in range(200):
        pa = a + 0.05 * torch.randn(a.shape, generator=g, dtype=torch.float64)
        pb = b + 0.05 * torch.randn(b.shape, generator=g, dtype=torch.float64)
        assert obj <= solvers.cealc_objective(pa @ pb, w, x, xf, beta) + 1e-9


def test_full_rank_and_special_cases() -> None:
    w, x, xf = problem(2)
    h, _, delta = stats(x, xf)
    full = min(M, N_IN)
    a, b, _ = solvers.cealc(w, h, delta, full, 0.5, ridge=0.0)
    torch.testing.assert_close(a @ b, w @ (h + 0.5 * delta) @ torch.linalg.inv(h), rtol=1e-8, atol=1e-8)
    # X^f = X (no upstream compression, Δ = 0): CEALC == SVD-LLM whitening, at any β
    a, b, _ = solvers.cealc(w, h, torch.zeros_like(h), RANK, 0.7, ridge=0.0)
    a2, b2 = solvers.svd_llm(w, h, RANK, ridge=0.0)
    torch.testing.assert_close(a @ b, a2 @ b2, rtol=1e-8, atol=1e-8)
    # H = c I: CEALC (β = 0) == truncated SVD of W
    a, b, _ = solvers.cealc(w, 3.0 * torch.eye(N_IN, dtype=torch.float64), torch.zeros(N_IN, N_IN, dtype=torch.float64),
                            RANK, 0.0, ridge=0.0)
    a3, b3 = solvers.plain_svd(w, RANK)
    torch.testing.assert_close(a @ b, a3 @ b3, rtol=1e-8, atol=1e-8)


def test_beta_one_anchors_better_than_svd_llm() -> None:
    """β = 1 minimises ||W'X − W X^f|| exactly; SVD-LLM optimised ||(W − W') X^f||: CEALC must not lose."""
    for seed in range(3):
        w, x, xf = problem(seed)
        h, hf, delta = stats(x, xf)
        a, b, _ = solvers.cealc(w, h, delta, RANK, 1.0, ridge=0.0)
        a2, b2 = solvers.svd_llm(w, hf, RANK, ridge=0.0)
        assert (a @ b @ x - w @ xf).norm() <= (a2 @ b2 @ x - w @ xf).norm() + 1e-9


def test_aces_closed_form_close_to_exact_search() -> None:
    for seed in range(4):
        w, x, xf = problem(seed)
        h, _, delta = stats(x, xf)
        chol, _ = solvers.cholesky_ridge(h, 0.0)
        g0, gd = solvers.cealc_target(w, h, delta, chol)
        closed = solvers.aces_beta_closed_form(g0, gd, RANK)
        exact = solvers.aces_beta_exact(g0, gd, RANK)
        rho = [solvers.retained_energy(g0 + bb * gd, RANK) for bb in (0.0, closed, exact)]
        assert 0.0 <= closed <= 1.0 and 0.0 <= exact <= 1.0
        assert rho[1] >= rho[0] - 1e-9, "ACES must not be worse than β = 0"
        assert rho[2] >= rho[1] - 1e-9, "the exact search is the upper bound"
        assert rho[2] - rho[1] < 0.02, f"closed form far from the exact optimum: {rho}"
        grid = max(solvers.retained_energy(g0 + bb * gd, RANK) for bb in torch.linspace(0, 1, 101).tolist())
        assert rho[2] >= grid - 1e-6


@pytest.mark.parametrize("m,n,ratio", [(128, 128, 0.2), (384, 128, 0.4), (128, 384, 0.6), (7, 5, 0.5)])
def test_ratio_to_rank_and_budget(m: int, n: int, ratio: float) -> None:
    k = solvers.rank_for_ratio(m, n, ratio)
    assert k == max(1, math.floor(m * n * (1 - ratio) / (m + n)))
    layer = FactorizedLinear(n, m, k)
    assert weight_params(layer) == k * (m + n) <= (1 - ratio) * m * n or k == 1
    with pytest.raises(ValueError, match="ratio"):
        solvers.rank_for_ratio(m, n, 1.0)


def test_factorized_linear_exact_at_full_rank() -> None:
    torch.manual_seed(0)
    dense = torch.nn.Linear(10, 6)
    a, b = solvers.plain_svd(dense.weight.detach(), 6)
    layer = FactorizedLinear.from_factors(a, b, dense.bias.detach())
    x = torch.randn(3, 5, 10)
    torch.testing.assert_close(layer(x), dense(x), rtol=1e-5, atol=1e-5)
    assert isinstance(layer.first, torch.nn.Linear) and layer.first.weight.shape == (6, 10)
    assert layer.second.weight.shape == (6, 6) and layer.second.bias is not None


def test_rank_deficient_inputs_and_bf16() -> None:
    """N < n makes H singular: the ridge retry keeps Cholesky and the factors finite."""
    w, x, xf = problem(3, tokens=4)
    h, hf, delta = stats(x, xf)
    chol, lam = solvers.cholesky_ridge(h, 0.0)
    assert lam > 0 and torch.isfinite(chol).all()
    a, b, _ = solvers.cealc(w, h, delta, RANK, 0.5, ridge=0.0)
    a2, b2 = solvers.svd_llm(w, hf, RANK, ridge=1e-5)
    assert torch.isfinite(a @ b).all() and torch.isfinite(a2 @ b2).all()
    layer = FactorizedLinear.from_factors(a, b, None, dtype=torch.bfloat16)
    assert layer.first.weight.dtype == torch.bfloat16
    assert torch.isfinite(layer(torch.randn(2, N_IN, dtype=torch.bfloat16))).all()
