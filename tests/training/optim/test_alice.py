"""Alice (spec §7.3, §7.6): state sizes, Eigen-Adam at r = m, compensation in the complement, switching."""

from __future__ import annotations

import torch
from torch import nn
from veil.training.optim import Alice
from veil.training.optim.alice import leading_eigvecs


def _grad(m: int, n: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(m, n, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _state_numel(opt: torch.optim.Optimizer, p: torch.Tensor) -> int:
    return sum(v.numel() for v in opt.state[p].values() if torch.is_tensor(v))


def test_state_size() -> None:
    for shape in ((6, 10), (10, 6)):  # the basis lives on the smaller side
        w = nn.Parameter(torch.zeros(*shape, dtype=torch.float64))
        opt = Alice([w], rank=4, leading=2)
        w.grad = _grad(*shape)
        opt.step()
        m, n, r = 6, 10, 4
        assert _state_numel(opt, w) == m * r + r * r + 2 * r * n + n + 1


def test_full_rank_is_eigen_adam() -> None:
    m, n = 5, 8
    grad = _grad(m, n)
    w = nn.Parameter(torch.zeros(m, n, dtype=torch.float64))
    opt = Alice([w], lr=1.0, alpha=1.0, rank=m, leading=m)
    w.grad = grad.clone()
    opt.step()
    _, u = torch.linalg.eigh(grad @ grad.T)  # eigenbasis of G Gᵀ
    sigma = u.T @ grad
    b1, b2, _ = opt.defaults["betas"]
    omega = (1 - b1) * sigma / (((1 - b2) * sigma * sigma).sqrt() + opt.defaults["eps"])
    assert torch.allclose(-w.detach(), u @ omega, atol=1e-10)  # compensation is 0 when r = m


def test_compensation_lives_in_the_complement() -> None:
    m, n, r = 8, 12, 3
    w = nn.Parameter(torch.zeros(m, n, dtype=torch.float64))
    opt = Alice([w], rank=r, leading=2)
    group = opt.param_groups[0]
    state: dict = {}
    for t in range(3):
        direction = Alice._direction(_grad(m, n, t), state, group, index=1)
        u = state["U"]
        omega = state["exp_avg"] / (state["exp_avg_sq"].sqrt() + group["eps"])
        comp = direction - u @ omega
        assert torch.linalg.norm(comp) > 1e-3
        assert torch.linalg.norm(u.T @ comp) < 1e-10 * torch.linalg.norm(comp)


def test_basis_changes_only_at_refresh_steps() -> None:
    m, n, k = 6, 9, 3
    w = nn.Parameter(torch.zeros(m, n, dtype=torch.float64))
    opt = Alice([w], rank=4, leading=2, update_interval=k)
    previous = None
    for t in range(1, 8):
        w.grad = _grad(m, n, t)
        opt.step()
        u = opt.state[w]["U"].clone()
        assert torch.allclose(u.T @ u, torch.eye(4, dtype=torch.float64), atol=1e-10)
        refresh = t == 1 or t % k == 0
        if previous is not None:
            assert torch.equal(u, previous) != refresh, f"step {t}"
        previous = u


def test_switch_keeps_the_leading_eigenvectors() -> None:
    m, n, r, lead = 10, 20, 5, 3
    g = torch.Generator().manual_seed(4)
    basis, _ = torch.linalg.qr(torch.randn(m, m, generator=g, dtype=torch.float64))
    spectrum = torch.tensor([10.0, 8, 6, 4, 3, 1, 0.5, 0.3, 0.2, 0.1], dtype=torch.float64)
    grad = basis @ torch.diag(spectrum) @ torch.linalg.qr(torch.randn(n, m, generator=g, dtype=torch.float64))[0].T
    w = nn.Parameter(torch.zeros(m, n, dtype=torch.float64))
    opt = Alice([w], rank=r, leading=lead, update_interval=2, betas=(0.9, 0.9, 0.0))  # Alice-0: Q = G Gᵀ
    for _ in range(2):  # t = 1: top-r eigenvectors; t = 2: a switch
        w.grad = grad.clone()
        opt.step()
    u = opt.state[w]["U"]
    top = leading_eigvecs(grad @ grad.T, lead)
    assert torch.allclose(u[:, :lead] @ u[:, :lead].T, top @ top.T, atol=1e-8)  # top-l kept
    assert torch.allclose(u.T @ u, torch.eye(r, dtype=torch.float64), atol=1e-10)
    # the other r − l columns are drawn from the complement, not the next eigenvectors
    assert torch.linalg.norm(top.T @ u[:, lead:]) < 1e-10
