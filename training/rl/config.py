"""``GrpoConfig``: GRPO's sampling, loss and optimizer settings plus Advantage Reweighting and Lopti.

Defaults follow the official AR-Lopti code (``zhyang2226/AR-Lopti`` @ cbeb333, spec §8.4) where it gives one:
group size 8, temperature 0.7, clip ε_low 0.20 / ε_high 0.24, token-mean loss, k3 ("low_var_kl") KL at 0.001,
AdamW lr 1e-6, one PPO epoch. ``mini_batches`` defaults to 1 (plain GRPO takes one optimizer step per RL step,
Lopti two); the K&K scripts split each rollout into two (64 prompts × 8 = 512 responses, ``ppo_mini_batch_size``
256 responses: the fork comments out verl's ``*= rollout.n``), so ``mini_batches=2`` matches them (GRPO two steps,
Lopti four, the second mini-batch of each pass off-policy). ``lr`` 1e-6 is for 3B–7B policies; a tiny model needs
a far larger one (the toy task uses its own).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from veil.config import Config, ConfigError, field

PRESETS = ("grpo", "ar", "lopti", "ar_lopti", "lopti_reversed")


@dataclass
class GrpoConfig(Config):
    """GRPO for causal LMs, with Advantage Reweighting (AR) and Lopti as options.

    Yang et al., "Do Not Let Low-Probability Tokens Over-Dominate in RL for LLMs", ICLR 2026 (arXiv 2505.12929).

    Args:
        group_size (int): completions sampled per prompt (the GRPO group).
        temperature (float): sampling temperature; log-probabilities are taken at the same temperature (verl).
        max_new_tokens (int): completion length cap; a completion ends at its first EOS.
        clip_eps_low / clip_eps_high (float): the ratio is clipped to [1 − ε_low, 1 + ε_high].
        loss_agg (str): "token-mean" (code: every response token weighs the same) or "seq-mean-token-mean"
            (GRPO paper: mean over each completion's tokens, then over completions).
        kl_coef (float): weight of the k3 KL to the reference policy; 0 turns the KL (and the reference) off.
        reference (str): "auto" (adapters switched off for a veil AdapterModel, else a frozen copy of the
            initial policy), "copy" or "adapters_off".
        ar (bool), ar_alpha (float): Advantage Reweighting Â ← (α·π_old + 1 − α)·Â.
        lopti (bool), lopti_eta (float), lopti_order (str): Lopti's two passes split at π_old < η.

    Example:
        >>> cfg = GrpoConfig.preset("ar_lopti", lr=1e-3, temperature=1.0)
    """

    # sampling
    group_size: int = field(8, "completions sampled per prompt (the GRPO group)")
    temperature: float = field(0.7, "sampling temperature; log-probs use the same temperature (verl)")
    max_new_tokens: int = field(16, "completion length cap; a completion ends at its first EOS")
    # objective
    clip_eps_low: float = field(0.2, "lower clip: ratio >= 1 - clip_eps_low")
    clip_eps_high: float = field(0.24, "upper clip: ratio <= 1 + clip_eps_high (code 0.24; symmetric PPO: 0.2)")
    loss_agg: Literal["token-mean", "seq-mean-token-mean"] = field(
        "token-mean", "token-mean (code) or seq-mean-token-mean (GRPO paper's per-completion normalisation)")
    adv_eps: float = field(1e-6, "added to the group reward std before dividing")
    adv_std: Literal["unbiased", "biased"] = field("unbiased", "group std estimator (verl: torch.std, unbiased)")
    kl_coef: float = field(0.001, "weight of the k3 KL to the reference policy; 0 = no KL, no reference")
    reference: Literal["auto", "copy", "adapters_off"] = field(
        "auto", "reference policy: adapters off for an AdapterModel, else a frozen copy of the initial policy")
    # Advantage Reweighting (spec §8.2)
    ar: bool = field(False, "Advantage Reweighting: token advantage × (alpha·π_old + 1 − alpha)")
    ar_alpha: float = field(0.2, "AR's alpha (0.2 in the AR script, 0.3 in the AR+Lopti script; 0 = GRPO)")
    # Lopti (spec §8.3)
    lopti: bool = field(False, "Lopti: two update passes per RL step, split by old-policy token probability")
    lopti_eta: float = field(0.5, "Lopti threshold η: a token is low-probability when π_old < η (code: strict)")
    lopti_order: Literal["low_first", "high_first"] = field(
        "low_first", "pass order; high_first is the paper's ablation (much worse than GRPO)")
    # optimisation
    lr: float = field(1e-6, "AdamW learning rate (1e-6 for 3B-7B policies in the code; tiny models need more)")
    weight_decay: float = field(0.01, "AdamW weight decay")
    max_grad_norm: float = field(1.0, "gradient-norm clip per optimizer step; 0 = none")
    ppo_epochs: int = field(1, "passes over the rollout batch per update (per Lopti pass)")
    mini_batches: int = field(1, "optimizer steps per epoch: the rollout batch is split into this many parts (K&K scripts: 2)")
    seed: int = field(0, "seed of the sampling generator")

    @classmethod
    def preset(cls, name: str, **overrides: object) -> GrpoConfig:
        """The spec's settings for ``name`` in PRESETS (α, η as in the official scripts), then ``overrides``."""
        table: dict[str, dict[str, object]] = {
            "grpo": {}, "ar": {"ar": True, "ar_alpha": 0.2}, "lopti": {"lopti": True, "lopti_eta": 0.4},
            "ar_lopti": {"ar": True, "ar_alpha": 0.3, "lopti": True, "lopti_eta": 0.5},
            "lopti_reversed": {"lopti": True, "lopti_eta": 0.4, "lopti_order": "high_first"}}
        if name not in table:
            raise ConfigError(f"GrpoConfig.preset: expected one of {list(PRESETS)}, received {name!r}")
        return cls(**{**table[name], **overrides})  # type: ignore[arg-type]

    def validate(self) -> None:
        checks = [("group_size", self.group_size >= 2, ">= 2 (advantages are relative to the group)"),
                  ("temperature", self.temperature > 0, "> 0"), ("max_new_tokens", self.max_new_tokens >= 1, ">= 1"),
                  ("clip_eps_low", 0 <= self.clip_eps_low < 1, "in [0, 1)"), ("clip_eps_high", self.clip_eps_high >= 0, ">= 0"),
                  ("adv_eps", self.adv_eps >= 0, ">= 0"), ("kl_coef", self.kl_coef >= 0, ">= 0"),
                  ("ar_alpha", 0 <= self.ar_alpha <= 1, "in [0, 1]"), ("lopti_eta", 0 < self.lopti_eta < 1, "in (0, 1)"),
                  ("lr", self.lr > 0, "> 0"), ("weight_decay", self.weight_decay >= 0, ">= 0"),
                  ("max_grad_norm", self.max_grad_norm >= 0, ">= 0"), ("ppo_epochs", self.ppo_epochs >= 1, ">= 1"),
                  ("mini_batches", self.mini_batches >= 1, ">= 1")]
        for name, ok, expected in checks:
            if not ok:
                raise ConfigError(f"GrpoConfig.{name}: expected {expected}, received {getattr(self, name)!r}")
