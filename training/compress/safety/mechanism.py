"""The low-rank safety-gradient measurements of spec §3.3 / §5.3, at the attacked model θ*.

- CER(k): cumulative energy Σ_{i<=k} σ_i² / Σ σ_i² of the one-example patch gradient, per weight matrix;
- overlap φ = ||U_kᵀ Ū_k||_F² / k between the top-k left singular subspaces of the one-example gradient and of the
  batch safety gradient (many harmful -> refusal pairs); a random k-subspace of R^d gives about k / d;
- cos(g_safe, θ* − θ0) over all weight matrices: > 0 means the descent step −g_safe moves back towards θ0.
"""

from __future__ import annotations

from collections.abc import Sequence
from statistics import mean
from typing import Any

import torch
from torch import nn

from .data import Example
from .patch import flat_grad


def cer(g: torch.Tensor, k: int) -> float:
    """Cumulative energy ratio of the top ``k`` singular values of matrix ``g``."""
    s2 = torch.linalg.svdvals(g.double()) ** 2
    return float(s2[:k].sum() / s2.sum()) if float(s2.sum()) > 0 else 0.0


def overlap(g: torch.Tensor, g_bar: torch.Tensor, k: int) -> float:
    """φ: shared fraction of the top-``k`` left singular subspaces of ``g`` and ``g_bar`` (1 = identical)."""
    u = torch.linalg.svd(g.double(), full_matrices=False)[0][:, :k]  # (d_out, k)
    u_bar = torch.linalg.svd(g_bar.double(), full_matrices=False)[0][:, :k]
    return float((u.T @ u_bar).norm() ** 2 / k)


def safety_gradient_report(attacked: nn.Module, aligned: nn.Module | None, example: Example,
                           batch: Sequence[Example], ks: Sequence[int] = (4, 8)) -> dict[str, Any]:
    """CER(k) and φ(k) averaged over weight matrices (embedding and head excluded) and the cosine to θ* − θ0."""
    g = flat_grad(attacked, [example])
    g_bar = flat_grad(attacked, batch)
    names = [n for n in g if "embed" not in n and "lm_head" not in n]
    out: dict[str, Any] = {"matrices": len(names)}
    for k in ks:
        out[f"cer_{k}"] = mean(cer(g[n], k) for n in names)
        out[f"overlap_{k}"] = mean(overlap(g[n], g_bar[n], k) for n in names)
        out[f"overlap_{k}_random"] = mean(k / g[n].shape[0] for n in names)
    if aligned is not None:
        ref = dict(aligned.named_parameters())
        current = dict(attacked.named_parameters())
        dot = sum(float(g[n].flatten() @ (current[n] - ref[n]).detach().flatten()) for n in g)
        gn = sum(float(g[n].norm() ** 2) for n in g) ** 0.5
        dn = sum(float((current[n] - ref[n]).detach().norm() ** 2) for n in g) ** 0.5
        out["cos_to_aligned"] = dot / (gn * dn) if gn * dn else 0.0
    return out
