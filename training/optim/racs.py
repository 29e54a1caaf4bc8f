"""RACS — Row And Column Scaled SGD (Gong, Scetbon, Ma, Meeds, "Towards Efficient Optimizer Design for LLM via
Structured Fisher Approximation with a Low-Rank Extension", ICLR 2026, arXiv 2502.07752, Algorithm 1).

The empirical Fisher of a matrix gradient G (m×n) is approximated by ``S ⊗ Q`` with S (n×n) and Q (m×m) positive
diagonal; the Frobenius-optimal pair is the fixed point ``s = Diag(E[Gᵀ Q G])/‖Q‖²``,
``q = Diag(E[G S Gᵀ])/‖S‖²`` (Prop. 3). The update is ``W ← W − λ η α Diag(q)^{-1/2} G Diag(s)^{-1/2}`` with
a norm-growth limiter η; the state is m + n + 1 numbers per matrix.
"""

from __future__ import annotations

from typing import Any, Literal

import torch

from .base import Closure, adamw_update, as_matrix, check_range, limiter, run_closure


def racs_scaling(g2: torch.Tensor, iters: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The fixed point (s, q) of RACS's row/column scaling for a one-sample estimate ``g2 = G ⊙ G`` (m×n).

    Starts from q = 1 and alternates ``s = qᵀ g2 / ‖q‖²``, ``q = g2 s / ‖s‖²`` ``iters`` times (the paper uses 5).
    For rank-one ``g2 = a bᵀ`` one iteration already lands on q ∝ a, s ∝ b, so ``G / √(q sᵀ)`` has |entries| = 1.

    Returns:
        s (n,), q (m,).
    """
    tiny = torch.finfo(g2.dtype).tiny
    q = torch.ones(g2.shape[0], dtype=g2.dtype, device=g2.device)
    s = torch.zeros(g2.shape[1], dtype=g2.dtype, device=g2.device)
    for _ in range(iters):
        s = (q @ g2) / (q @ q).clamp(min=tiny)  # (n,)
        q = (g2 @ s) / (s @ s).clamp(min=tiny)  # (m,)
    return s, q


def racs_direction(grad: torch.Tensor, state: dict[str, Any], group: dict[str, Any]) -> torch.Tensor:
    """Advance RACS's state (s, q, φ) with the matrix gradient ``grad`` (m×n) and return η α G̃ (m×n).

    Shared by :class:`RACS` (on a weight's gradient) and LRACS (on a LoRA pair's Riemannian gradient); the caller
    has advanced ``state["step"]``.
    """
    m, n = grad.shape
    first = "s" not in state
    if first:
        state["s"] = grad.new_zeros(n)  # s_0 = q_0 = 0, no bias correction (Alg. 1)
        state["q"] = grad.new_zeros(m)
        state["phi"] = grad.new_zeros(())
    s, q = racs_scaling(grad * grad, group["iters"])
    state["s"].lerp_(s, 1 - group["beta"])
    state["q"].lerp_(q, 1 - group["beta"])
    # Adam-style debiasing of the product q_i s_j (an option; Alg. 1 has none, so its first steps are larger)
    debias = (1 - group["beta"] ** state["step"]) ** 2 if group["bias_correction"] else 1.0
    scale = (state["q"][:, None] * state["s"][None, :] / debias).sqrt()  # (m, n)
    scaled = grad / (scale + group["eps"])  # (m, n)
    norm = torch.linalg.vector_norm(scaled)
    eta = limiter(norm, state["phi"], group["gamma"], first)
    state["phi"] = eta * norm
    return scaled * (eta * group["alpha"])


class RACS(torch.optim.Optimizer):
    """Row And Column Scaled SGD (Gong et al., ICLR 2026, arXiv 2502.07752, Algorithm 1).

    Every parameter with ndim >= 2 (viewed as ``(d0, rest)``) in a group with ``algorithm="racs"`` gets::

        s, q  = fixed point of s = Diag(Gᵀ Q G)/‖Q‖², q = Diag(G S Gᵀ)/‖S‖²  (from q = 1, ``iters`` rounds)
        s_t   = β s_{t−1} + (1−β) s ;  q_t = β q_{t−1} + (1−β) q        (s_0 = q_0 = 0, no bias correction)
        G̃_t   = Diag(q_t)^{-1/2} G_t Diag(s_t)^{-1/2}
        η_t   = γ / max(‖G̃_t‖/φ_{t−1}, γ) (1 at t = 1) ;  φ_t = η_t ‖G̃_t‖
        W    ← W − λ η_t α G̃_t

    State per matrix: s (n), q (m), φ (1) — m + n + 1 numbers (plus an int step counter).
    Everything else (biases, norms, 1-D tensors) and whole groups with ``algorithm="adam"`` are trained with
    Adam — AdamW when ``weight_decay > 0`` — as the paper trains non-matrix parameters and the last layer
    (``matrix_param_groups`` puts output heads in such a group).

    Args:
        params: parameters or param-group dicts.
        lr: λ (paper: 0.02).
        beta: β of the s/q moving averages (0.9).
        alpha: α, the RACS step scale (0.05 at 60M–350M, 0.02 at 1.3B).
        gamma: γ of the norm-growth limiter (1.01).
        iters: fixed-point iterations per step (5).
        eps: added to √(q_i s_j) (not in the paper; keeps all-zero rows finite).
        weight_decay: decoupled weight decay on every parameter (not in the paper; default 0).
        adam_betas: Adam's betas for the fallback parameters.
        bias_correction: divide s_t and q_t by 1 − β^t as Adam does (not in the paper, default False). Without it
            the first step is 1/(1−β) = 10× the steady-state size, which the paper's warm-up absorbs.
        algorithm: ``"racs"`` or ``"adam"`` (the whole group with Adam, e.g. the lm_head).

    Example:
        >>> opt = RACS(model.parameters(), lr=0.02)
        >>> loss.backward(); opt.step(); opt.zero_grad()
    """

    def __init__(self, params: Any, lr: float = 0.02, beta: float = 0.9, alpha: float = 0.05, gamma: float = 1.01,
                 iters: int = 5, eps: float = 1e-8, weight_decay: float = 0.0,
                 adam_betas: tuple[float, float] = (0.9, 0.999), bias_correction: bool = False,
                 algorithm: Literal["racs", "adam"] = "racs") -> None:
        check_range("lr", lr, 0.0)
        check_range("beta", beta, 0.0, 1.0)
        check_range("alpha", alpha, 0.0, open_low=True)
        check_range("gamma", gamma, 1.0)
        check_range("iters", iters, 1)
        check_range("eps", eps, 0.0)
        check_range("weight_decay", weight_decay, 0.0)
        for i, b in enumerate(adam_betas):
            check_range(f"adam_betas[{i}]", b, 0.0, 1.0)
        if algorithm not in ("racs", "adam"):
            raise ValueError(f"algorithm: expected 'racs' or 'adam', received {algorithm!r}")
        super().__init__(params, {"lr": lr, "beta": beta, "alpha": alpha, "gamma": gamma, "iters": iters,
                                  "eps": eps, "weight_decay": weight_decay, "adam_betas": tuple(adam_betas),
                                  "bias_correction": bias_correction, "algorithm": algorithm})

    @torch.no_grad()
    def step(self, closure: Closure = None) -> Any:
        """One RACS step on every matrix with a gradient, Adam(W) on the rest; returns the closure's loss."""
        loss = run_closure(closure)
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError("RACS: sparse gradients are not supported")
                state = self.state[p]
                if p.ndim < 2 or group["algorithm"] == "adam":
                    adamw_update(p, state, group, group["adam_betas"])
                    continue
                state["step"] = state.get("step", 0) + 1
                if group["weight_decay"]:
                    p.mul_(1 - group["lr"] * group["weight_decay"])
                direction = racs_direction(as_matrix(p.grad), state, group)
                p.sub_(group["lr"] * direction.view_as(p))
        return loss
