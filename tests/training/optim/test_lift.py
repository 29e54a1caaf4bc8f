"""LoRA-S (spec §6.4): the Sylvester solve, the horizontal lift, and the invariance AdamS/LRACS are about."""

from __future__ import annotations

import pytest
import torch
from veil.training.optim import LRACS, AdamSylvester, lora_param_groups
from veil.training.optim.lift import horizontal_lift, solve_sylvester, tangent_gradient


def _factors(seed: int = 0, m: int = 7, n: int = 5, r: int = 2) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(*s, generator=g, dtype=torch.float64) for s in ((m, r), (n, r), (m, n)))


def _tangent_projection(m: torch.Tensor, n: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    pm = m @ torch.linalg.solve(m.T @ m, m.T)
    pn = n @ torch.linalg.solve(n.T @ n, n.T)
    return pm @ x + x @ pn - pm @ x @ pn


def test_sylvester_residual() -> None:
    m, n, x = _factors()
    a, b = m.T @ m, n.T @ n
    c = m.T @ x @ n
    k = solve_sylvester(a, b, c)
    assert torch.linalg.norm(a @ b @ k + k @ a @ b - c) <= 1e-10 * torch.linalg.norm(c)


def test_lift_identity_and_horizontality() -> None:
    m, n, xdot = _factors(1)
    m_dot, n_dot = horizontal_lift(m, n, xdot, damping=0.0)
    assert torch.allclose(m_dot @ n.T + m @ n_dot.T, _tangent_projection(m, n, xdot), atol=1e-12)
    # horizontal for the Mishra et al. metric tr(NᵀN ṀᵀṀ) + tr(MᵀM ṄᵀṄ): Ṁᵀ M NᵀN = MᵀM Nᵀ Ṅ
    assert torch.allclose(m_dot.T @ m @ (n.T @ n), (m.T @ m) @ n.T @ n_dot, atol=1e-12)


def test_tangent_gradient_from_factor_gradients() -> None:
    m, n, g = _factors(2)
    riem = tangent_gradient(m, n, g @ n, g.T @ m, damping=0.0)
    assert torch.allclose(riem, _tangent_projection(m, n, g), atol=1e-12)


def test_fixed_k_is_scaled_gd_with_weight_decay() -> None:
    m, n, g = _factors(3)
    eps = 0.01
    m_dot, n_dot = horizontal_lift(m, n, -g, damping=0.0, fixed_k=eps)
    assert torch.allclose(m_dot, -(g @ n) @ torch.linalg.inv(n.T @ n) - eps * m, atol=1e-12)
    assert torch.allclose(n_dot, -(g.T @ m) @ torch.linalg.inv(m.T @ m) - eps * n, atol=1e-12)


def _train_pair(LoraPair, opt_name: str, reparam: torch.Tensor | None, steps: int = 6) -> torch.Tensor:
    """Train one LoRA pair on a fixed regression; return the product B A after ``steps`` steps."""
    g = torch.Generator().manual_seed(5)
    pair = LoraPair(6, 8, 3)
    with torch.no_grad():
        pair.lora_A.weight.copy_(torch.randn(3, 6, generator=g, dtype=torch.float64))
        pair.lora_B.weight.copy_(torch.randn(8, 3, generator=g, dtype=torch.float64))
        if reparam is not None:  # (M, N) -> (M R, N R^{-T}): B -> B R, A -> R^{-1} A
            pair.lora_B.weight.copy_(pair.lora_B.weight @ reparam)
            pair.lora_A.weight.copy_(torch.linalg.solve(reparam, pair.lora_A.weight))
    x = torch.randn(32, 6, generator=g, dtype=torch.float64)
    y = torch.randn(32, 8, generator=g, dtype=torch.float64)
    if opt_name == "adams":
        opt = AdamSylvester(lora_param_groups(pair), lr=0.01, damping=0.0)
    elif opt_name == "lracs":
        opt = LRACS(lora_param_groups(pair), lr=0.05, damping=0.0)
    else:
        opt = torch.optim.AdamW(pair.parameters(), lr=0.01)
    for _ in range(steps):
        opt.zero_grad()
        ((pair(x) - y) ** 2).mean().backward()
        opt.step()
    return (pair.lora_B.weight @ pair.lora_A.weight).detach()


@pytest.mark.parametrize("opt_name", ["adams", "lracs"])
def test_invariance_under_refactoring(pair_factory, opt_name: str) -> None:
    r = torch.tensor([[1.5, 0.3, -0.2], [0.1, 0.7, 0.4], [-0.3, 0.2, 2.0]], dtype=torch.float64)
    base, moved = _train_pair(pair_factory, opt_name, None), _train_pair(pair_factory, opt_name, r)
    start = _train_pair(pair_factory, opt_name, None, steps=0)
    assert torch.linalg.norm(base - start) > 1e-2  # it trained
    assert torch.allclose(base, moved, atol=1e-8, rtol=0)


def test_adamw_is_not_invariant(pair_factory) -> None:
    r = torch.tensor([[1.5, 0.3, -0.2], [0.1, 0.7, 0.4], [-0.3, 0.2, 2.0]], dtype=torch.float64)
    moved = _train_pair(pair_factory, "adamw", r)
    assert torch.linalg.norm(_train_pair(pair_factory, "adamw", None) - moved) > 1e-3


def test_state_sizes(pair_factory) -> None:
    pair = pair_factory(6, 8, 3)
    for opt, expected in ((LRACS(lora_param_groups(pair)), 8 + 6 + 1), (AdamSylvester(lora_param_groups(pair)), 2 * 8 * 6)):
        pair.zero_grad()
        pair(torch.randn(4, 6, dtype=torch.float64)).sum().backward()
        opt.step()
        assert sum(v.numel() for s in opt.state.values() for v in s.values() if torch.is_tensor(v)) == expected
        assert len(opt.state) == 1  # the pair's state lives with A


def test_pair_group_shape_check(pair_factory) -> None:
    pair = pair_factory(6, 8, 3)
    with pytest.raises(ValueError, match="lora_pair"):
        AdamSylvester([{"params": [pair.lora_B.weight, pair.lora_A.weight], "lora_pair": True}])
