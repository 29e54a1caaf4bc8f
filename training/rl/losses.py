"""GRPO's loss pieces as pure tensor functions: group advantages, AR weights, Lopti masks, the clipped
surrogate and the k3 KL. Shapes: B completions (= prompts × group), L response positions."""

from __future__ import annotations

import torch

from .config import GrpoConfig


def group_advantages(rewards: torch.Tensor, group_size: int, eps: float = 1e-6, unbiased: bool = True) -> torch.Tensor:
    """GRPO's outcome advantage: each reward normalised by its group's mean and std.

    Args:
        rewards: (B,) with B = prompts × group_size, groups contiguous.
    Returns:
        (B,) ``(r − mean_group) / (std_group + eps)``; a group whose rewards are all equal gets zeros.
    """
    if rewards.ndim != 1 or rewards.numel() % group_size:
        raise ValueError(f"rewards: expected shape (prompts * {group_size},), received {tuple(rewards.shape)}")
    r = rewards.float().view(-1, group_size)  # (prompts, G)
    std = r.std(dim=1, keepdim=True, unbiased=unbiased)
    return ((r - r.mean(dim=1, keepdim=True)) / (std + eps)).view(-1)


def ar_weights(old_log_probs: torch.Tensor, alpha: float) -> torch.Tensor:
    """Advantage Reweighting's per-token factor ``α·π_old + 1 − α`` ∈ [1 − α, 1], from detached π_old (spec §8.2)."""
    return alpha * old_log_probs.detach().exp() + (1.0 - alpha)


def lopti_masks(old_log_probs: torch.Tensor, response_mask: torch.Tensor, eta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Lopti's split of the response tokens: (low, high) with low = π_old < η (strict, as the code), both (B, L) bool.

    The two masks partition ``response_mask``: disjoint, and their union is every response token.
    """
    resp = response_mask.bool()
    low = (old_log_probs.detach().exp() < eta) & resp
    return low, resp & ~low


def masked_mean(x: torch.Tensor, mask: torch.Tensor, mode: str = "token-mean") -> torch.Tensor:
    """Mean of ``x`` over ``mask`` (B, L): over all tokens, or per completion then over completions."""
    m = mask.to(x.dtype)
    if mode == "token-mean":
        return (x * m).sum() / m.sum().clamp_min(1.0)
    per_seq = (x * m).sum(dim=1) / m.sum(dim=1).clamp_min(1.0)  # (B,)
    has = (m.sum(dim=1) > 0).to(x.dtype)
    return (per_seq * has).sum() / has.sum().clamp_min(1.0)


def clipped_surrogate(log_probs: torch.Tensor, old_log_probs: torch.Tensor, advantages: torch.Tensor,
                      eps_low: float, eps_high: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token PPO-clip loss ``−min(ρ·A, clip(ρ, 1−ε_low, 1+ε_high)·A)`` with ρ = exp(log π − log π_old).

    Args:
        log_probs: (B, L) under the current policy (with grad); old_log_probs: (B, L) rollout policy;
        advantages: (B, L) token advantages (already reweighted / masked).
    Returns:
        (loss (B, L), clipped (B, L) bool: where the clipped branch was taken).
    """
    ratio = (log_probs - old_log_probs.detach()).exp()
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - eps_low, 1.0 + eps_high)
    return torch.maximum(unclipped, clipped), clipped > unclipped


def k3_kl(log_probs: torch.Tensor, ref_log_probs: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(π‖π_ref): ``exp(q − p) − (q − p) − 1`` (≥ 0; 0 when equal), clamped to [−10, 10]
    as verl's "low_var_kl"."""
    d = ref_log_probs.detach() - log_probs
    return (d.exp() - d - 1.0).clamp(-10.0, 10.0)


def token_advantages(advantages: torch.Tensor, old_log_probs: torch.Tensor, response_mask: torch.Tensor,
                     cfg: GrpoConfig) -> torch.Tensor:
    """Broadcast sequence advantages (B,) to response tokens (B, L), reweighted by AR when ``cfg.ar``."""
    adv = advantages[:, None] * response_mask.to(old_log_probs.dtype)  # (B, L)
    return adv * ar_weights(old_log_probs, cfg.ar_alpha) if cfg.ar else adv


def policy_loss(log_probs: torch.Tensor, old_log_probs: torch.Tensor, token_adv: torch.Tensor,
                response_mask: torch.Tensor, kl_mask: torch.Tensor, cfg: GrpoConfig,
                ref_log_probs: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """GRPO's loss for one update: clipped surrogate aggregated over ``response_mask`` + kl_coef · KL over ``kl_mask``.

    As in the official Lopti code, a pass zeroes the other tokens' advantages but keeps the full response mask
    for the surrogate's mean, and masks only the KL with its own token set (``kl_mask``).
    """
    pg, clipped = clipped_surrogate(log_probs, old_log_probs, token_adv, cfg.clip_eps_low, cfg.clip_eps_high)
    loss = masked_mean(pg, response_mask, cfg.loss_agg)
    stats = {"pg_loss": loss.item(), "clip_frac": masked_mean(clipped.float(), response_mask).item()}
    if ref_log_probs is not None and cfg.kl_coef > 0:
        kl = masked_mean(k3_kl(log_probs, ref_log_probs), kl_mask, cfg.loss_agg)
        loss = loss + cfg.kl_coef * kl
        stats["kl"] = kl.item()
    return loss, stats
