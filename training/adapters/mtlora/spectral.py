"""mtLoRA's spectral-aware regulariser in its two forms (spec §1.4), as plain functions of the B matrices.

Tian, Ledent, Sun, "Scalable Multi-Task Low-Rank Model Adaptation", ICLR 2026 (arXiv 2603.01526).
``official_per_b`` follows ``utils/hydralora_trainer.py::compute_spectral_regularization`` (61dea0d);
``paper_cross_expert`` follows the paper text. Both use w(σ) = exp(−σ/σ̄), detached (no gradient through the SVD).
"""

from __future__ import annotations

import torch

EPS = 1e-12  # guards σ̄ = 0 (zero-initialised B) and division by σ = 0


def spectral_weights(sigma: torch.Tensor) -> torch.Tensor:
    """w = exp(−σ/σ̄) along the last dim (σ̄ = mean singular value); decreasing in σ, 1 at σ = 0."""
    return torch.exp(-sigma / (sigma.mean(dim=-1, keepdim=True) + EPS))


def official_per_b(bs: list[torch.Tensor], max_matrices: int = 64, generator: torch.Generator | None = None
                   ) -> torch.Tensor:
    """Official code: mean over ≤ ``max_matrices`` sampled B (d, r) of ‖(w wᵀ) ⊙ (BᵀB − I·‖B‖²_F / r)‖²_F.

    The sorted singular-value weights w are applied to Gram entries by column index, as the code does.
    """
    if len(bs) > max_matrices:
        idx = torch.randperm(len(bs), generator=generator)[:max_matrices].tolist()
        bs = [bs[i] for i in idx]
    losses = []
    for b in bs:  # (d, r)
        r = b.shape[-1]
        gram = b.T @ b  # (r, r)
        w = spectral_weights(torch.linalg.svdvals(b.detach()))  # (r,)
        target = torch.eye(r, device=b.device, dtype=b.dtype) * b.pow(2).sum() / r  # I·(‖B‖_F/√r)²
        losses.append(((w[:, None] * w[None, :]) * (gram - target)).pow(2).sum())
    return torch.stack(losses).mean()


def reweighted(bs: torch.Tensor, keep_sigma: bool) -> torch.Tensor:
    """B′_i (N, d, r) = U diag(w σ) Vᵀ (``keep_sigma``) or U diag(w) Vᵀ, computed as B V diag(c) Vᵀ with V, c detached."""
    _, s, vh = torch.linalg.svd(bs.detach(), full_matrices=False)  # s (N, r), vh (N, r, r)
    w = spectral_weights(s)
    c = w if keep_sigma else torch.where(s > EPS, w / s.clamp_min(EPS), torch.zeros_like(s))  # (N, r)
    return bs @ (vh.transpose(-1, -2) * c[:, None, :]) @ vh  # (N, d, r)


def paper_cross_expert(bs: torch.Tensor, keep_sigma: bool = False) -> torch.Tensor:
    """Paper: Σ_{i<j} ‖B′_iᵀ B′_j‖²_F over the N experts of one adapter, bs (N, d, r)."""
    bp = reweighted(bs, keep_sigma)  # (N, d, r)
    overlap = torch.einsum("idr,jds->ijrs", bp, bp).pow(2).sum(dim=(-2, -1))  # (N, N)
    return torch.triu(overlap, diagonal=1).sum()
