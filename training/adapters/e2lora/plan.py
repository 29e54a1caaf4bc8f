"""E²LoRA's one-off planning step (spec ``adapters.md`` §2.1): gradient proxy entropy per layer, Local-Similarity
Sharing (intervals by relative mutual information) and Heterogeneity-based Rank Allocation.

Li, Ye, Ye, He, Chen, "Efficient and Effective LoRA with Entropy-Guided Adaptive Sharing", ICLR 2026. All
statistics are float64; std is the population std (ddof = 0) of the flattened tensor.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Sequence

import torch
from torch import nn

from ..targeting import find_targets
from .config import E2LoraConfig

GAUSS_CONST = 0.5 * math.log(2 * math.pi) + 0.5  # ½·log(2π) + ½ ≈ 1.419


def proxy_entropy(g: torch.Tensor) -> float:
    """Gaussian proxy entropy ``H(G) = log σ_G + ½·log(2π) + ½`` of the flattened tensor."""
    return math.log(g.detach().double().flatten().std(correction=0).item()) + GAUSS_CONST


def rmi_matrix(grads: Sequence[torch.Tensor]) -> torch.Tensor:
    """Relative MI ``(H_i + H_j − H(G_i ⊕ G_j)) / min(H_i, H_j)``, joint entropy from the concatenation; (N, N)."""
    flat = [g.detach().double().flatten() for g in grads]
    h = [proxy_entropy(g) for g in flat]
    n = len(flat)
    out = torch.ones(n, n, dtype=torch.float64)
    for i in range(n):
        for j in range(i + 1, n):
            joint = proxy_entropy(torch.cat([flat[i], flat[j]]))
            out[i, j] = out[j, i] = (h[i] + h[j] - joint) / min(h[i], h[j])
    return out


def thresholds(rmi: torch.Tensor) -> torch.Tensor:
    """Adaptive threshold ``τ_m = (1/(N−1)) Σ_{k≠m} RMI(m, k)``; (N,). A single layer gets τ = 1."""
    n = rmi.shape[0]
    if n == 1:
        return torch.ones(1, dtype=rmi.dtype)
    return (rmi.sum(1) - rmi.diagonal()) / (n - 1)


def partition(rmi: torch.Tensor, rule: str = "start") -> list[tuple[int, int]]:
    """Greedy sequential intervals ``[(first, last), ...]``: extend from the start layer while
    ``RMI(start, candidate) >= τ`` (τ of the start layer, or of the candidate for ``rule="candidate"``)."""
    tau, n, out, start = thresholds(rmi), rmi.shape[0], [], 0
    while start < n:
        end = start
        while end + 1 < n and rmi[start, end + 1] >= tau[start if rule == "start" else end + 1]:
            end += 1
        out.append((start, end))
        start = end + 1
    return out


def allocate_ranks(interval_entropy: Sequence[float], r: int, total: int, weight: str = "abs") -> list[int]:
    """``r_k = max(1, round(F_k · total))`` with ``F_k = w_k / Σ w``, ``w = |H_k|`` or ``exp(H_k)``.

    Args:
        interval_entropy: max proxy entropy of each interval's layers.
        r: ``r_vanilla`` (used when every weight is zero).
        total: the rank budget (``K·r`` or ``N·r``).
        weight: ``"abs"`` or ``"entropy_power"``.
    """
    w = [abs(h) if weight == "abs" else math.exp(h) for h in interval_entropy]
    if sum(w) == 0:
        return [r] * len(w)
    return [max(1, round(wk / sum(w) * total)) for wk in w]


def probe_gradients(model: nn.Module, config: E2LoraConfig, loss_fn: Callable[[nn.Module], torch.Tensor]
                    ) -> dict[str, torch.Tensor]:
    """One forward + backward of ``loss_fn(model)``; the gradient of every targeted base weight (out, in).
    Only the targeted weights require grad during the probe; every ``requires_grad`` flag is restored."""
    names = find_targets(model, config)
    flags = {p: p.requires_grad for p in model.parameters()}
    model.requires_grad_(False)
    weights = {n: model.get_submodule(n).weight for n in names}
    for w in weights.values():
        w.grad = None
        w.requires_grad_(True)
    try:
        loss_fn(model).backward()
        unused = [n for n, w in weights.items() if w.grad is None]
        if unused:
            raise ValueError(f"target_modules: expected modules the loss depends on, received {unused} with no "
                             "gradient; add them to exclude_modules")
        grads = {n: _out_in(model.get_submodule(n), w.grad.detach().clone()) * config.grad_scale
                 for n, w in weights.items()}
    finally:
        for p, flag in flags.items():
            p.requires_grad_(flag)
            p.grad = None
    return grads


def plan_from_gradients(grads: dict[str, torch.Tensor], config: E2LoraConfig) -> dict[str, list[list[int]]]:
    """The sharing plan (``share_intervals``) from per-module gradients, following ``config``'s options."""
    by_template: dict[str, dict[int, torch.Tensor]] = defaultdict(dict)
    for name, g in grads.items():
        template, layer = config.split_name(name)
        by_template[template][layer] = g.flatten()
    groups = {t: [t] for t in by_template} if config.gradient_scope == "module" else {"*": list(by_template)}
    plan: dict[str, list[list[int]]] = {}
    for members in groups.values():
        layers = sorted(by_template[members[0]])
        if any(sorted(by_template[t]) != layers for t in members):
            raise ValueError("E2LoraConfig.gradient_scope: expected every target type in the same layers for "
                             "'layer', received differing layer sets; use gradient_scope='module'")
        per_layer = [torch.cat([by_template[t][lay] for t in members]) for lay in layers]  # G_l, flattened
        h = [proxy_entropy(g) for g in per_layer]
        spans = partition(rmi_matrix(per_layer), config.threshold_rule)
        total = config.r * (len(spans) if config.rank_budget == "intervals" else len(layers))
        ranks = allocate_ranks([max(h[a:b + 1]) for a, b in spans], config.r, total, config.allocation_weight)
        for t in members:
            plan[t] = [[layers[a], layers[b], rank] for (a, b), rank in zip(spans, ranks, strict=True)]
    return plan


def plan_sharing(model: nn.Module, config: E2LoraConfig, loss_fn: Callable[[nn.Module], torch.Tensor]
                 ) -> E2LoraConfig:
    """``config`` with ``share_intervals`` computed from one gradient probe of ``loss_fn(model)`` (run once,
    before :func:`inject`; the plan fixes every shape, nothing changes during training)."""
    return config.replace(share_intervals=plan_from_gradients(probe_gradients(model, config, loss_fn), config))


def _out_in(module: nn.Module, grad: torch.Tensor) -> torch.Tensor:
    """A weight gradient in the (out, in) convention (GPT-2's ``Conv1D`` stores its weight as (in, out))."""
    from ..layer import Conv1D

    return grad.T if isinstance(module, Conv1D) else grad
