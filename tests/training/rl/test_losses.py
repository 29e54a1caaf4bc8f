"""GRPO / AR / Lopti loss pieces against hand-computed values and the spec's laws (§8.1-8.3, §8.6)."""

from __future__ import annotations

import math

import pytest
import torch
from veil.training.rl import GrpoConfig
from veil.training.rl.diagnostics import logit_gradient_bounds
from veil.training.rl.losses import (
    ar_weights,
    clipped_surrogate,
    group_advantages,
    k3_kl,
    lopti_masks,
    masked_mean,
    policy_loss,
)

from veil.config import ConfigError


def test_group_advantages_are_normalised_per_group() -> None:
    rewards = torch.tensor([0.0, 1.0, 1.0, 0.5, 2.0, 2.0, 2.0, 2.0])
    adv = group_advantages(rewards, group_size=4).view(2, 4)
    assert adv[0].mean().abs() < 1e-6 and abs(adv[0].std().item() - 1) < 1e-4
    assert torch.equal(adv[1], torch.zeros(4))  # a group with equal rewards carries no signal
    r0 = rewards[:4]
    assert torch.allclose(adv[0], (r0 - r0.mean()) / (r0.std() + 1e-6))
    with pytest.raises(ValueError, match="prompts"):
        group_advantages(torch.ones(6), group_size=4)


def test_clipped_objective_matches_hand_computation() -> None:
    ratio = torch.tensor([[1.5, 0.5, 1.1, 0.5]])
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0]])
    old = torch.zeros(1, 4)
    loss, clipped = clipped_surrogate(ratio.log(), old, adv, eps_low=0.2, eps_high=0.24)
    # -min(ρA, clip(ρ, 0.8, 1.24)A): 1.5 -> 1.24 (clipped); 0.5 with A>0 -> 0.5; 1.1 with A<0 -> 1.1; 0.5, A<0 -> 0.8
    assert torch.allclose(loss, torch.tensor([[-1.24, -0.5, 1.1, 0.8]]))
    assert clipped.tolist() == [[True, False, False, True]]
    mask = torch.ones(1, 4)
    total, stats = policy_loss(ratio.log(), old, adv, mask, mask, GrpoConfig(kl_coef=0.0))
    assert math.isclose(total.item(), (-1.24 - 0.5 + 1.1 + 0.8) / 4, rel_tol=1e-6)
    assert stats["clip_frac"] == 0.5


def test_loss_aggregation_modes() -> None:
    x = torch.tensor([[1.0, 3.0, 0.0], [6.0, 0.0, 0.0]])
    m = torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert masked_mean(x, m, "token-mean").item() == pytest.approx(10 / 3)
    assert masked_mean(x, m, "seq-mean-token-mean").item() == pytest.approx((2 + 6) / 2)


def test_ar_weights_follow_the_spec_formula() -> None:
    probs = torch.tensor([[0.01, 0.3, 0.9, 1.0]])
    old = probs.log().requires_grad_(True)
    assert torch.allclose(ar_weights(old, 0.0), torch.ones_like(probs))  # α = 0 is plain GRPO
    w = ar_weights(old, 0.3)
    assert torch.allclose(w, 0.3 * probs + 0.7)
    assert w.min() >= 0.7 and w.max() <= 1.0 + 1e-6
    assert not w.requires_grad  # π_old is detached: no gradient through the weight


def test_lopti_masks_partition_the_response() -> None:
    probs = torch.tensor([[0.1, 0.5, 0.7, 0.2], [0.49, 0.9, 0.3, 0.8]])
    resp = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])
    low, high = lopti_masks(probs.log(), resp, eta=0.5)
    assert not (low & high).any() and torch.equal((low | high).long(), resp)
    assert low.tolist() == [[True, False, False, False], [True, False, True, False]]  # strict <: 0.5 is high


def test_k3_kl_is_zero_for_equal_policies_and_positive_otherwise() -> None:
    lp = torch.randn(3, 5).log_softmax(-1)
    assert torch.equal(k3_kl(lp, lp), torch.zeros(3, 5))
    assert (k3_kl(lp, lp + 0.3 * torch.randn(3, 5)) > 0).all()


def test_logit_gradient_norm_lies_in_prop_4_2_bounds() -> None:
    g = torch.Generator().manual_seed(0)
    for n in (2, 8, 16, 256):
        z = (3 * torch.randn(64, n, generator=g)).requires_grad_(True)
        y = torch.randint(0, n, (64,), generator=g)
        logp = z.log_softmax(-1).gather(1, y[:, None])[:, 0]
        (grad,) = torch.autograd.grad(logp.sum(), z)
        lo, hi = logit_gradient_bounds(logp.detach().exp(), n)
        norm = grad.norm(dim=1)
        assert (norm >= lo - 1e-5).all() and (norm <= hi + 1e-5).all()


def test_config_presets_round_trip_and_validation() -> None:
    cfg = GrpoConfig.preset("ar_lopti", lr=1e-3)
    assert (cfg.ar, cfg.ar_alpha, cfg.lopti, cfg.lopti_eta, cfg.lopti_order) == (True, 0.3, True, 0.5, "low_first")
    assert GrpoConfig.from_json(cfg.to_json()) == cfg
    assert GrpoConfig.preset("lopti").lopti_eta == 0.4 and GrpoConfig.preset("lopti_reversed").lopti_order == "high_first"
    with pytest.raises(ConfigError, match="lopti_eta"):
        GrpoConfig(lopti_eta=1.5)
    with pytest.raises(ConfigError, match="preset"):
        GrpoConfig.preset("ppo")
