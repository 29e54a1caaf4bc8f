"""Alice — Adaptive Low-dimensional Subspace Estimation (Gong, Scetbon, Ma, Meeds, ICLR 2026, arXiv 2502.07752,
Algorithms 2–4): Eigen-Adam restricted to a tracked rank-r eigenbasis of E[G Gᵀ], with subspace switching and
the optimal compensation of the discarded complement.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import torch

from .base import Closure, adamw_update, as_matrix, check_range, limiter, run_closure


def leading_eigvecs(q: torch.Tensor, r: int) -> torch.Tensor:
    """The r eigenvectors of the symmetric ``q`` (m×m) with the largest eigenvalues, largest first (m×r)."""
    _, vecs = torch.linalg.eigh(q)  # ascending eigenvalues
    return vecs[:, -r:].flip(-1)


def switch_subspace(q: torch.Tensor, u_prev: torch.Tensor, leading: int, generator: torch.Generator) -> torch.Tensor:
    """Alice's ``Switch`` (Alg. 4): one subspace-iteration step on ``q`` from ``u_prev`` (m×r), keep its top
    ``leading`` Ritz vectors, and fill the other r − l columns with basis vectors drawn uniformly (without
    replacement) from an orthonormal basis of their orthogonal complement (a complete QR of the kept columns).

    Returns:
        U (m×r) with orthonormal columns; its first ``leading`` columns are the kept eigenvectors.
    """
    m, r = u_prev.shape
    u, _ = torch.linalg.qr(q @ u_prev)  # (m, r): one step of subspace iteration
    _, ritz = torch.linalg.eigh(u.T @ q @ u)  # (r, r), ascending
    u1 = (u @ ritz.flip(-1))[:, :leading]  # (m, l): leading Ritz vectors, largest first
    if leading == r:
        return u1
    full, _ = torch.linalg.qr(u1, mode="complete")  # (m, m); columns l: span the complement of u1
    pick = torch.randperm(m - leading, generator=generator)[: r - leading] + leading
    return torch.cat([u1, full[:, pick]], dim=1)


class Alice(torch.optim.Optimizer):
    """Alice (Gong et al., ICLR 2026, arXiv 2502.07752, Algorithms 2–4).

    A matrix gradient G (m×n, transposed first when m > n so that the basis lives on the smaller side) gets::

        at t = 1 and every K steps:  Q = β3 U Q̃ Uᵀ + (1−β3) G Gᵀ
                                     U = top-r eigenvectors of Q (t = 1) or Switch(Q, r, l, U)   (Alg. 4)
        σ = Uᵀ G ;  Q̃ = β3 Q̃ + (1−β3) σ σᵀ ;  m = β1 m + (1−β1) σ ;  v = β2 v + (1−β2) σ⊙σ ;  ω = m / √v
        p = β1 p + (1−β1)(1ᵀ G⊙G − 1ᵀ σ⊙σ) ;  C = √(m−r) (G − U σ) Diag(p)^{-1/2} ;  C ← η C  (limiter, Alg. 3)
        W ← W − λ α (U ω + α_c C)

    State per matrix: U (m·r), Q̃ (r²), m and v (r·n each), p (n), φ (1) = m·r + r² + 2rn + n + 1 numbers
    (float32 for 16-bit parameters, whose eigendecompositions run in float32).
    Ablations are settings: Alice-0 (no tracking) is ``betas[2] = 0``; no switching is ``leading = rank``
    (GaLore-like top-r refreshes); no compensation is ``alpha_c = 0``. Parameters with ndim < 2 and groups with
    ``algorithm="adam"`` are trained with Adam (AdamW when ``weight_decay > 0``); the paper trains the last
    layer with Alice too.

    Args:
        params: parameters or param-group dicts.
        lr: λ (0.02).
        betas: (β1, β2, β3) = (0.9, 0.9, 0.999).
        alpha: α (0.3; 0.25 at 1.3B).
        alpha_c: α_c, the compensation scale (0.4; 0.2 at 1.3B).
        rank: r (128–512 in the paper; clipped to the smaller matrix side).
        leading: l, eigenvectors kept at a switch (40; clipped to r).
        update_interval: K, steps between subspace refreshes (200).
        gamma: γ of the compensation limiter (1.01).
        eps: added to √v and √p (the paper's formulas have none).
        weight_decay: decoupled weight decay on every parameter (not in the paper; default 0).
        adam_betas: Adam's betas for the fallback parameters.
        seed: seeds the complement sampling (with the step and parameter index, so a resumed run draws the same).
        rotate_tracking: express Q̃ in the new basis at a switch (``Uₜᵀ U_{t−1} Q̃ U_{t−1}ᵀ Uₜ``). The algorithm as
            written (default False) adds ``σσᵀ`` of the new basis to Q̃ of the old one.
        algorithm: ``"alice"`` or ``"adam"`` (the whole group with Adam).

    Example:
        >>> opt = Alice(model.parameters(), lr=0.02, rank=64, leading=16)
        >>> loss.backward(); opt.step(); opt.zero_grad()
    """

    def __init__(self, params: Any, lr: float = 0.02, betas: tuple[float, float, float] = (0.9, 0.9, 0.999),
                 alpha: float = 0.3, alpha_c: float = 0.4, rank: int = 256, leading: int = 40,
                 update_interval: int = 200, gamma: float = 1.01, eps: float = 1e-8, weight_decay: float = 0.0,
                 adam_betas: tuple[float, float] = (0.9, 0.999), seed: int = 0, rotate_tracking: bool = False,
                 algorithm: Literal["alice", "adam"] = "alice") -> None:
        check_range("lr", lr, 0.0)
        for i, b in enumerate(betas):
            check_range(f"betas[{i}]", b, 0.0, 1.0)
        for i, b in enumerate(adam_betas):
            check_range(f"adam_betas[{i}]", b, 0.0, 1.0)
        check_range("alpha", alpha, 0.0, open_low=True)
        check_range("alpha_c", alpha_c, 0.0)
        check_range("rank", rank, 1)
        check_range("leading", leading, 1)
        if leading > rank:
            raise ValueError(f"leading: expected <= rank ({rank}), received {leading}")
        check_range("update_interval", update_interval, 1)
        check_range("gamma", gamma, 1.0)
        check_range("eps", eps, 0.0)
        check_range("weight_decay", weight_decay, 0.0)
        if algorithm not in ("alice", "adam"):
            raise ValueError(f"algorithm: expected 'alice' or 'adam', received {algorithm!r}")
        super().__init__(params, {"lr": lr, "betas": tuple(betas), "alpha": alpha, "alpha_c": alpha_c,
                                  "rank": rank, "leading": leading, "update_interval": update_interval,
                                  "gamma": gamma, "eps": eps, "weight_decay": weight_decay,
                                  "adam_betas": tuple(adam_betas), "seed": seed,
                                  "rotate_tracking": rotate_tracking, "algorithm": algorithm})

    @torch.no_grad()
    def step(self, closure: Closure = None) -> Any:
        """One Alice step on every matrix with a gradient, Adam(W) on the rest; returns the closure's loss."""
        loss = run_closure(closure)
        index = 0
        for group in self.param_groups:
            for p in group["params"]:
                index += 1
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError("Alice: sparse gradients are not supported")
                state = self.state[p]
                if p.ndim < 2 or group["algorithm"] == "adam":
                    adamw_update(p, state, group, group["adam_betas"])
                    continue
                if group["weight_decay"]:
                    p.mul_(1 - group["lr"] * group["weight_decay"])
                g = as_matrix(p.grad)
                if g.dtype in (torch.float16, torch.bfloat16):
                    g = g.float()  # eigh/QR need float32; the state is then float32 too
                transposed = g.shape[0] > g.shape[1]
                update = self._direction(g.T if transposed else g, state, group, index)
                p.sub_((group["lr"] * group["alpha"]) * (update.T if transposed else update).reshape(p.shape))
        return loss

    @staticmethod
    def _direction(g: torch.Tensor, state: dict[str, Any], group: dict[str, Any], index: int) -> torch.Tensor:
        """Advance the state with ``g`` (m×n, m <= n) and return ``U ω + α_c C`` (m×n)."""
        beta1, beta2, beta3 = group["betas"]
        m, n = g.shape
        r = min(group["rank"], m)
        if "U" not in state:
            state["step"] = 0
            state["U"] = g.new_zeros(m, r)
            state["Q"] = g.new_zeros(r, r)  # Q̃: the tracked E[σσᵀ] in the basis U
            state["exp_avg"] = g.new_zeros(r, n)
            state["exp_avg_sq"] = g.new_zeros(r, n)
            state["p"] = g.new_zeros(n)
            state["phi"] = g.new_zeros(())
        state["step"] += 1
        t, u_old = state["step"], state["U"]
        if t == 1 or t % group["update_interval"] == 0:
            q = beta3 * (u_old @ state["Q"] @ u_old.T) + (1 - beta3) * (g @ g.T)  # (m, m)
            if t == 1:
                u = leading_eigvecs(q, r)
            else:
                gen = torch.Generator().manual_seed(hash((group["seed"], index, t)) & (2**63 - 1))
                u = switch_subspace(q, u_old, min(group["leading"], r), gen)
            if group["rotate_tracking"]:
                rot = u.T @ u_old  # (r, r)
                state["Q"] = rot @ state["Q"] @ rot.T
            state["U"] = u
        u = state["U"]
        sigma = u.T @ g  # (r, n)
        state["Q"].mul_(beta3).add_(sigma @ sigma.T, alpha=1 - beta3)
        state["exp_avg"].lerp_(sigma, 1 - beta1)
        state["exp_avg_sq"].mul_(beta2).addcmul_(sigma, sigma, value=1 - beta2)
        omega = state["exp_avg"] / (state["exp_avg_sq"].sqrt() + group["eps"])  # (r, n)
        # compensation (Alg. 3): the residual outside U, each column scaled by its tracked energy
        energy = ((g * g).sum(0) - (sigma * sigma).sum(0)).clamp(min=0)  # (n,)
        state["p"].lerp_(energy, 1 - beta1)
        comp = math.sqrt(m - r) * (g - u @ sigma) / (state["p"].sqrt() + group["eps"])  # (m, n)
        norm = torch.linalg.vector_norm(comp)
        eta = limiter(norm, state["phi"], group["gamma"], t == 1)
        state["phi"] = eta * norm
        return u @ omega + (group["alpha_c"] * eta) * comp
