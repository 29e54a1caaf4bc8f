"""LoRA-S optimizers: AdamS (Adam-Sylvester) and LRACS (Zheng & Wu, "LoRA-S: ... horizontal lift on the quotient
manifold", ICLR 2026, OpenReview Guo2XGgxZA).

One step on a LoRA pair (A r×in, B out×r; X = M Nᵀ with M = B, N = Aᵀ, the LoRA scaling folded into X):

```
∇_M = B.grad, ∇_N = A.gradᵀ --> P_T(G) (out×in) --precondition--> Ẋ --horizontal lift (Sylvester K)--> (Ṁ, Ṅ)
B ← B + λ Ṁ ,  A ← A + λ Ṅᵀ
```

Both preconditioners act on P_T(G), an X-space object, so the step does not depend on how X is factored:
(M R, N R^{-T}) and (M, N) reach the same X. Named ``AdamSylvester`` because pytorch-optimizer's ``AdamS`` is a
different method ("Adam with stable weight decay"); ``AdamS`` here is an explicit alias.
"""

from __future__ import annotations

from typing import Any

import torch

from .base import Closure, adamw_update, check_range, run_closure
from .lift import horizontal_lift, tangent_gradient
from .racs import racs_direction


class _LoraSOptimizer(torch.optim.Optimizer):
    """Shared step: LoRA-pair groups (``lora_pair=True``, params ``[A, B]``) through the lift, others AdamW."""

    name = "LoRA-S"

    def __init__(self, params: Any, defaults: dict[str, Any]) -> None:
        check_range("lr", defaults["lr"], 0.0)
        check_range("damping", defaults["damping"], 0.0)
        check_range("weight_decay", defaults["weight_decay"], 0.0)
        super().__init__(params, {**defaults, "lora_pair": False})

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """As torch's, and a ``lora_pair`` group must hold exactly ``[A (r, in), B (out, r)]``."""
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        if group["lora_pair"]:
            ps = group["params"]
            if len(ps) != 2 or ps[0].ndim != 2 or ps[1].ndim != 2 or ps[0].shape[0] != ps[1].shape[1]:
                shapes = [tuple(p.shape) for p in ps]
                raise ValueError(f"{self.name}: a lora_pair group: expected params [A (r, in), B (out, r)], "
                                 f"received shapes {shapes}; build the groups with lora_param_groups(model)")

    def _precondition(self, grad: torch.Tensor, state: dict[str, Any], group: dict[str, Any]) -> torch.Tensor:
        """The preconditioned X-gradient (Ẋ = −this) from P_T(G); advances ``state``."""
        raise NotImplementedError

    def _fallback_betas(self, group: dict[str, Any]) -> tuple[float, float]:
        return group["adam_betas"]

    @torch.no_grad()
    def step(self, closure: Closure = None) -> Any:
        """One lifted step per LoRA pair with a gradient, AdamW on the other params; returns the closure's loss."""
        loss = run_closure(closure)
        for group in self.param_groups:
            if not group["lora_pair"]:
                for p in group["params"]:
                    if p.grad is not None:
                        adamw_update(p, self.state[p], group, self._fallback_betas(group))
                continue
            a, b = group["params"]
            if a.grad is None and b.grad is None:
                continue
            grad_a = torch.zeros_like(a) if a.grad is None else a.grad
            grad_b = torch.zeros_like(b) if b.grad is None else b.grad
            state = self.state[a]  # the pair's state lives with A
            state["step"] = state.get("step", 0) + 1
            m, n = b, a.T  # X = M Nᵀ: M (out, r), N (in, r)
            riem = tangent_gradient(m, n, grad_b, grad_a.T, group["damping"])  # (out, in)
            xdot = -self._precondition(riem, state, group)
            m_dot, n_dot = horizontal_lift(m, n, xdot, group["damping"], group["fixed_k"])
            b.add_(group["lr"] * m_dot)
            a.add_(group["lr"] * n_dot.T)
        return loss


class AdamSylvester(_LoraSOptimizer):
    """AdamS (Adam-Sylvester; Zheng & Wu, ICLR 2026): Adam's preconditioning fed through the horizontal lift.

    Per LoRA pair, Adam's moments (with bias correction) are kept on P_T(G) in X-space (out×in each), so
    Ẋ = −m̂/(√v̂ + ε) is the same for every factorization of X; the lift then gives (Ṁ, Ṅ) with the Sylvester
    matrix K in place of weight decay — there is no weight-decay hyperparameter for the pairs. Where the paper
    keeps the moments is not settled by the sources (spec §6.2, [unverified]); this is the invariant choice, at
    the memory of full-matrix Adam per adapted layer (2·out·in numbers). Non-pair parameters (the head, biases,
    norms) are trained with AdamW (``weight_decay`` applies to them only).

    Args:
        params: param groups from :func:`lora_param_groups` (pairs with ``lora_pair=True``, the rest plain).
        lr: λ (1e-3).
        betas: Adam's (β1, β2), for the pairs and the fallback (0.9, 0.999).
        eps: Adam's ε (1e-8).
        damping: δ added to MᵀM and NᵀN (1e-6); LoRA's B = 0 start makes MᵀM singular. 0 is the exact lift.
        fixed_k: None solves for the Sylvester K (the paper); ε uses K = ε·I (ordinary weight decay in the lift).
        weight_decay: AdamW decay of the non-pair parameters.

    Example:
        >>> opt = AdamSylvester(lora_param_groups(model), lr=1e-3)
    """

    name = "AdamS"

    def __init__(self, params: Any, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, damping: float = 1e-6, fixed_k: float | None = None,
                 weight_decay: float = 0.0) -> None:
        for i, beta in enumerate(betas):
            check_range(f"betas[{i}]", beta, 0.0, 1.0)
        check_range("eps", eps, 0.0)
        super().__init__(params, {"lr": lr, "betas": tuple(betas), "eps": eps, "damping": damping,
                                  "fixed_k": fixed_k, "weight_decay": weight_decay})

    def _fallback_betas(self, group: dict[str, Any]) -> tuple[float, float]:
        return group["betas"]

    def _precondition(self, grad: torch.Tensor, state: dict[str, Any], group: dict[str, Any]) -> torch.Tensor:
        beta1, beta2 = group["betas"]
        if "exp_avg" not in state:
            state["exp_avg"] = torch.zeros_like(grad)
            state["exp_avg_sq"] = torch.zeros_like(grad)
        t = state["step"]
        state["exp_avg"].lerp_(grad, 1 - beta1)
        state["exp_avg_sq"].mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        denom = (state["exp_avg_sq"] / (1 - beta2 ** t)).sqrt_().add_(group["eps"])
        return (state["exp_avg"] / (1 - beta1 ** t)) / denom


AdamS = AdamSylvester


class LRACS(_LoraSOptimizer):
    """LRACS (Zheng & Wu, ICLR 2026): RACS (Gong et al., §7 of the spec) fed through the horizontal lift.

    Per LoRA pair, RACS's row/column scaling (state q (out), s (in), φ — O(out + in) numbers) is fitted to
    P_T(G) ⊙ P_T(G) in X-space: Ẋ = −η α Diag(q)^{-1/2} P_T(G) Diag(s)^{-1/2} with the norm-growth limiter η, then
    lifted with the Sylvester K (no weight-decay hyperparameter for the pairs). Non-pair parameters (the head —
    "applied to the final layer it degrades to Adam" — biases, norms) are trained with AdamW.

    Args:
        params: param groups from :func:`lora_param_groups`.
        lr: λ (0.02, RACS's).
        beta: β of the s/q moving averages (0.9).
        alpha: α (0.05).
        gamma: γ of the limiter (1.01).
        iters: fixed-point iterations (5).
        eps: added to √(q_i s_j), and Adam's ε for the fallback (1e-8).
        damping: δ added to MᵀM and NᵀN (1e-6); 0 is the exact lift.
        fixed_k: None solves for the Sylvester K (the paper); ε uses K = ε·I.
        weight_decay: AdamW decay of the non-pair parameters.
        bias_correction: debias s_t, q_t by 1 − β^t (see :class:`RACS`; not in the paper, default False).
        adam_betas: AdamW's betas for the non-pair parameters (give them their own ``lr`` through
            ``lora_param_groups(model, rest={"lr": ...})``: RACS's λ is far above Adam's usual one).

    Example:
        >>> opt = LRACS(lora_param_groups(model), lr=0.02)
    """

    name = "LRACS"

    def __init__(self, params: Any, lr: float = 0.02, beta: float = 0.9, alpha: float = 0.05, gamma: float = 1.01,
                 iters: int = 5, eps: float = 1e-8, damping: float = 1e-6, fixed_k: float | None = None,
                 weight_decay: float = 0.0, bias_correction: bool = False,
                 adam_betas: tuple[float, float] = (0.9, 0.999)) -> None:
        check_range("beta", beta, 0.0, 1.0)
        check_range("alpha", alpha, 0.0, open_low=True)
        check_range("gamma", gamma, 1.0)
        check_range("iters", iters, 1)
        check_range("eps", eps, 0.0)
        for i, b in enumerate(adam_betas):
            check_range(f"adam_betas[{i}]", b, 0.0, 1.0)
        super().__init__(params, {"lr": lr, "beta": beta, "alpha": alpha, "gamma": gamma, "iters": iters,
                                  "eps": eps, "damping": damping, "fixed_k": fixed_k,
                                  "weight_decay": weight_decay, "bias_correction": bias_correction,
                                  "adam_betas": tuple(adam_betas)})

    def _precondition(self, grad: torch.Tensor, state: dict[str, Any], group: dict[str, Any]) -> torch.Tensor:
        return racs_direction(grad, state, group)
