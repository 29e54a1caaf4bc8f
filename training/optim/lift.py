"""The horizontal lift of LoRA-S (Zheng & Wu, ICLR 2026): a direction Ẋ for X = M Nᵀ becomes factor directions
(Ṁ, Ṅ) on the quotient manifold R*^{m×r} × R*^{n×r} / GL(r), with the Sylvester matrix K in place of weight decay.

```
Ṁ = (Ẋ N − M NᵀN K)(NᵀN)^{-1}          Ṅ = (Ẋᵀ M − N MᵀM Kᵀ)(MᵀM)^{-1}
(MᵀM NᵀN) K + K (MᵀM NᵀN) = Mᵀ Ẋ N      (so that Ṁ Nᵀ + M Ṅᵀ = P_T(Ẋ) and (MR, NR^{-T}) ↦ (ṀR, ṄR^{-T}))
```

All r×r algebra runs in float64. ``damping`` δ adds δI to both Gram matrices: LoRA starts with B = 0, where MᵀM
is singular and the quotient geometry is undefined; δ = 0 gives the exact (invariant) lift.
"""

from __future__ import annotations

import torch


def solve_sylvester(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """K with (A B) K + K (A B) = C, for symmetric positive definite A, B (r×r).

    A B = P Λ P⁻¹ with P = A^{1/2} V, where V Λ Vᵀ is the eigendecomposition of the SPD matrix A^{1/2} B A^{1/2}; in
    that basis the equation is diagonal, K' = (P⁻¹ C P) / (λ_i + λ_j), and K = P K' P⁻¹.
    """
    wa, va = torch.linalg.eigh(a)
    a_half = (va * wa.sqrt()) @ va.T
    a_ihalf = (va / wa.sqrt()) @ va.T
    lam, v = torch.linalg.eigh(a_half @ b @ a_half)
    p, p_inv = a_half @ v, v.T @ a_ihalf
    k_rot = (p_inv @ c @ p) / (lam[:, None] + lam[None, :])
    return p @ k_rot @ p_inv


def grams(m: torch.Tensor, n: torch.Tensor, damping: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(MᵀM + δI, NᵀN + δI) in float64."""
    eye = torch.eye(m.shape[1], dtype=torch.float64, device=m.device)
    m64, n64 = m.double(), n.double()
    return m64.T @ m64 + damping * eye, n64.T @ n64 + damping * eye


def tangent_gradient(m: torch.Tensor, n: torch.Tensor, grad_m: torch.Tensor, grad_n: torch.Tensor,
                     damping: float) -> torch.Tensor:
    """P_T(G) (m×n): the projection of the X-gradient G onto the tangent space of rank-r matrices at M Nᵀ.

    Built from the factor gradients alone (∇_M = G N, ∇_N = Gᵀ M), which is all an optimizer sees:
    ``P_T(G) = M (MᵀM)⁻¹ ∇_Nᵀ + ∇_M (NᵀN)⁻¹ Nᵀ − M (MᵀM)⁻¹ Mᵀ ∇_M (NᵀN)⁻¹ Nᵀ``. It depends on X only, not on
    the factorization — the quantity an invariant preconditioner may act on.
    """
    gm, gn = grams(m, n, damping)
    dt = m.dtype
    left = torch.linalg.solve(gm, m.double().T).to(dt)  # (r, m) = (MᵀM)⁻¹ Mᵀ
    right = torch.linalg.solve(gn, n.double().T).to(dt)  # (r, n) = (NᵀN)⁻¹ Nᵀ
    core = (left @ grad_m) @ right  # (r, n): (MᵀM)⁻¹ Mᵀ ∇_M (NᵀN)⁻¹ Nᵀ
    return left.T @ grad_n.T + grad_m @ right - m @ core


def horizontal_lift(m: torch.Tensor, n: torch.Tensor, xdot: torch.Tensor, damping: float,
                    fixed_k: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(Ṁ, Ṅ) for the direction ``xdot`` = Ẋ (m×n) at X = M Nᵀ (M m×r, N n×r).

    Args:
        fixed_k: None solves the Sylvester equation for K (the paper); a number ε uses K = ε·I, which turns the
            decay term into ordinary weight decay ε·M, ε·N (the approximation the paper replaces).
    """
    gm, gn = grams(m, n, damping)
    xn, xtm = xdot @ n, xdot.T @ m  # (m, r), (n, r)
    if fixed_k is None:
        k = solve_sylvester(gm, gn, m.double().T @ xn.double())
    else:
        k = fixed_k * torch.eye(m.shape[1], dtype=torch.float64, device=m.device)
    # Ṁ = (Ẋ N − M NᵀN K)(NᵀN)⁻¹ ;  Ṅ = (Ẋᵀ M − N MᵀM Kᵀ)(MᵀM)⁻¹   (Grams symmetric: solve on the right)
    m_dot = torch.linalg.solve(gn, (xn.double() - m.double() @ (gn @ k)).T).T
    n_dot = torch.linalg.solve(gm, (xtm.double() - n.double() @ (gm @ k.T)).T).T
    return m_dot.to(m.dtype), n_dot.to(n.dtype)
