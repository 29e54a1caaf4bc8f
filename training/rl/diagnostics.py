"""Measurements behind the paper's claims: how much of an update comes from low-probability tokens, and whether
high-probability tokens move the way their advantage says (the paper's Fig. 3 effect, spec §8.6)."""

from __future__ import annotations

import torch
from torch import nn

from .config import GrpoConfig
from .losses import lopti_masks, masked_mean, token_advantages
from .rollout import completion_log_probs
from .trainer import Batch


def logit_gradient_bounds(probs: torch.Tensor, vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Prop. 4.2 at the logits: ‖∂ log π_y / ∂z‖ ∈ [(1 − π)·√(N/(N−1)), √2·(1 − π)] (spec §8.1)."""
    gap = 1.0 - probs
    return gap * (vocab_size / (vocab_size - 1)) ** 0.5, gap * 2.0 ** 0.5


def gradient_share(model: nn.Module, batch: Batch, cfg: GrpoConfig) -> dict[str, float]:
    """Norms of the policy gradient (at ratio 1, all trainable params) from low- vs high-probability tokens.

    The split is π_old < ``cfg.lopti_eta``; AR's weights apply when ``cfg.ar``. Returns ``low_norm``,
    ``high_norm`` and ``low_share`` = low_norm / (low_norm + high_norm).
    """
    params = [p for p in model.parameters() if p.requires_grad]
    resp = batch.rollout.response_mask
    token_adv = token_advantages(batch.advantages, batch.old_log_probs, resp, cfg)  # (B, L)
    norms = {}
    for name, mask in zip(("low", "high"), lopti_masks(batch.old_log_probs, resp, cfg.lopti_eta), strict=True):
        logp = completion_log_probs(model, batch.rollout, cfg.temperature)  # (B, L)
        surrogate = -masked_mean(token_adv * mask * logp, resp)  # d/dθ of the clipped loss at ratio 1
        grads = torch.autograd.grad(surrogate, params, allow_unused=True)
        norms[name] = float(torch.sqrt(sum((g.float() ** 2).sum() for g in grads if g is not None)))
    total = norms["low"] + norms["high"]
    return {"low_norm": norms["low"], "high_norm": norms["high"], "low_share": norms["low"] / total if total else 0.0}


@torch.no_grad()
def high_prob_direction(model: nn.Module, batch: Batch, cfg: GrpoConfig) -> float:
    """After an update: share of high-probability tokens (π_old ≥ η, advantage ≠ 0) whose log-probability moved
    in the direction of their advantage (up for A > 0, down for A < 0)."""
    new = completion_log_probs(model, batch.rollout, cfg.temperature)  # (B, L)
    _, high = lopti_masks(batch.old_log_probs, batch.rollout.response_mask, cfg.lopti_eta)
    sign = torch.sign(batch.advantages)[:, None].expand_as(new)  # (B, L)
    counted = high & (sign != 0)
    right = counted & (torch.sign(new - batch.old_log_probs) == sign)
    return float(right.sum() / counted.sum().clamp_min(1))
