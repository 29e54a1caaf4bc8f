"""RACS (spec §7.2, §7.6): the fixed point of the row/column scaling, the limiter, state size, the Adam fallback."""

from __future__ import annotations

import itertools

import torch
from torch import nn
from veil.training.optim import RACS, optimizer_state_bytes
from veil.training.optim.racs import racs_scaling


def _rank1_g(m: int = 6, n: int = 9) -> torch.Tensor:
    """G with G ⊙ G = a bᵀ (rank one), magnitudes around 1e-3, random signs."""
    g = torch.Generator().manual_seed(0)
    a = torch.rand(m, generator=g, dtype=torch.float64) + 0.1
    b = torch.rand(n, generator=g, dtype=torch.float64) + 0.1
    sign = torch.randint(0, 2, (m, n), generator=g).double() * 2 - 1
    return 1e-3 * sign * (a[:, None] * b[None, :]).sqrt()


def test_fixed_point_gives_unit_entries() -> None:
    grad = _rank1_g()
    w = nn.Parameter(torch.zeros_like(grad))
    opt = RACS([w], lr=1.0, beta=0.0, alpha=1.0, eps=0.0)
    w.grad = grad.clone()
    opt.step()
    scaled = -w.detach()  # lr = α = η = 1: the update is G̃ itself
    assert torch.allclose(scaled.abs(), torch.ones_like(scaled), atol=1e-8, rtol=0)
    # the row/column-mean shortcut (spec §7.5) is not the fixed point: its entries are off by 1/RMS(G)
    g2 = grad * grad
    shortcut = grad / (g2.mean(1, keepdim=True).sqrt() * g2.mean(0, keepdim=True).sqrt())
    assert shortcut.abs().mean() > 100


def test_scaling_is_the_fixed_point() -> None:
    g2 = torch.rand(5, 7, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    s, q = racs_scaling(g2, 50)
    assert torch.allclose(s, (q @ g2) / (q @ q), rtol=1e-10)
    assert torch.allclose(q, (g2 @ s) / (s @ s), rtol=1e-10)


def test_limiter_caps_growth() -> None:
    w = nn.Parameter(torch.zeros(5, 8, dtype=torch.float64))
    gamma = 1.01
    opt = RACS([w], lr=1.0, beta=0.9, gamma=gamma)
    g = torch.Generator().manual_seed(2)
    norms = []
    for t in range(10):
        before = w.detach().clone()
        scale = 1.0 if t < 5 else 100.0 ** (t - 4)  # a gradient spike the lagging s, q cannot follow
        w.grad = scale * torch.randn(5, 8, generator=g, dtype=torch.float64)
        opt.step()
        norms.append(float(torch.linalg.norm(w.detach() - before)))
    ratios = [b / a for a, b in itertools.pairwise(norms)]
    assert max(ratios) <= gamma * (1 + 1e-12)
    assert any(abs(x - gamma) < 1e-9 for x in ratios)  # the limiter did bind


def test_state_size_is_m_plus_n_plus_1() -> None:
    w = nn.Parameter(torch.zeros(6, 11))
    opt = RACS([w])
    w.grad = torch.randn(6, 11)
    opt.step()
    assert sum(v.numel() for v in opt.state[w].values() if torch.is_tensor(v)) == 6 + 11 + 1
    assert optimizer_state_bytes(opt) == 4 * (6 + 11 + 1)


def test_vectors_fall_back_to_adam() -> None:
    torch.manual_seed(0)
    b1 = nn.Parameter(torch.randn(7))
    b2 = nn.Parameter(b1.detach().clone())
    ours, ref = RACS([b1], lr=0.01), torch.optim.Adam([b2], lr=0.01)
    for _ in range(3):
        grad = torch.randn(7)
        b1.grad, b2.grad = grad.clone(), grad.clone()
        ours.step()
        ref.step()
    assert torch.allclose(b1, b2, atol=1e-7)


def test_bias_correction_option() -> None:
    grad = _rank1_g()
    steps = {}
    for corrected in (False, True):
        w = nn.Parameter(torch.zeros_like(grad))
        opt = RACS([w], lr=1.0, beta=0.9, alpha=1.0, eps=0.0, bias_correction=corrected)
        w.grad = grad.clone()
        opt.step()
        steps[corrected] = -w.detach()
    # Alg. 1 as written: s_1 = 0.1 s, q_1 = 0.1 q, so the first step is 10x the fixed-point one; debiased: 1x
    assert torch.allclose(steps[False].abs(), torch.full_like(grad, 10.0), rtol=1e-8)
    assert torch.allclose(steps[True].abs(), torch.ones_like(grad), rtol=1e-8)
