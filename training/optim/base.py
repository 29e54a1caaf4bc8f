"""Pieces every veil optimizer shares: the Adam(W) fallback for parameters a method does not precondition, the
norm-growth limiter of Gong et al. and argument checks that name the argument.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

Closure = Callable[[], Any] | None


def check_range(name: str, value: float, low: float, high: float | None = None, *, open_low: bool = False) -> None:
    """Raise ``ValueError`` naming ``name`` unless ``low <= value`` (``<`` with ``open_low``) and ``value < high``."""
    bad = (value <= low) if open_low else (value < low)
    if bad or (high is not None and value >= high):
        bound = f"{'>' if open_low else '>='} {low}" + ("" if high is None else f" and < {high}")
        raise ValueError(f"{name}: expected {bound}, received {value!r}")


def run_closure(closure: Closure) -> Any:
    """Evaluate ``closure`` with gradients enabled (``step`` itself runs under ``no_grad``)."""
    if closure is None:
        return None
    with torch.enable_grad():
        return closure()


@torch.no_grad()
def adamw_update(p: torch.Tensor, state: dict[str, Any], group: dict[str, Any], betas: tuple[float, float]) -> None:
    """One AdamW step on ``p`` (Kingma & Ba, with bias correction; Loshchilov & Hutter decoupled decay).

    Uses the group's ``lr``, ``eps`` and ``weight_decay`` (0 makes it plain Adam). State keys: ``step`` (int),
    ``exp_avg``, ``exp_avg_sq``.
    """
    grad = p.grad
    if "exp_avg" not in state:
        state["step"] = 0
        state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
    beta1, beta2 = betas
    state["step"] += 1
    t = state["step"]
    lr = group["lr"]
    if group["weight_decay"]:
        p.mul_(1 - lr * group["weight_decay"])
    state["exp_avg"].lerp_(grad, 1 - beta1)
    state["exp_avg_sq"].mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    denom = (state["exp_avg_sq"] / (1 - beta2 ** t)).sqrt_().add_(group["eps"])
    p.sub_(lr * (state["exp_avg"] / (1 - beta1 ** t)) / denom)


def limiter(norm: torch.Tensor, phi: torch.Tensor, gamma: float, first: bool) -> torch.Tensor:
    """Norm-growth limiter η = γ / max(‖x_t‖/φ_{t−1}, γ), 1 at the first step (Gong et al., Alg. 1 and 3).

    It caps the update norm at γ times the previous (limited) one. A zero previous norm (an all-zero gradient)
    also gives 1, where the paper's formula would divide by zero.
    """
    if first or float(phi) == 0.0:
        return torch.ones_like(norm)
    return gamma / torch.clamp(norm / phi, min=gamma)


def as_matrix(t: torch.Tensor) -> torch.Tensor:
    """View a parameter of ndim >= 2 as the matrix (d0, d1·d2·...) the matrix optimizers work on."""
    return t.reshape(t.shape[0], -1)
