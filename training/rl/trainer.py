"""``GrpoTrainer``: one RL step = sample groups -> rule rewards -> group advantages -> clipped-surrogate updates.

```
prompts --make_batch--> Batch(rollout, rewards, advantages, old_log_probs, ref_log_probs)
        --update-->     plain GRPO: ppo_epochs × mini_batches AdamW steps on every response token
                        Lopti:      the same on low-probability tokens (π_old < η), then again on the rest,
                                    both against the same old_log_probs (pass 2 sees pass 1's parameters)
```
AR multiplies each token's advantage by ``α·π_old + 1 − α`` before either. Only parameters with
``requires_grad`` are optimised, so a veil ``AdapterModel`` (LoRA, ...) trains its adapters alone. Dropout is
not used: the model stays in eval mode so that the first ratio of every update is exactly 1.
"""

from __future__ import annotations

import contextlib
import copy
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch import nn

from .config import GrpoConfig
from .losses import group_advantages, lopti_masks, policy_loss, token_advantages
from .rewards import RewardFn
from .rollout import Rollout, completion_log_probs, pad_prompts, sample_groups


@dataclass
class Batch:
    """One RL step's data. rewards, advantages: (B,); old_log_probs, ref_log_probs: (B, L) detached."""

    rollout: Rollout
    rewards: torch.Tensor
    advantages: torch.Tensor
    old_log_probs: torch.Tensor
    ref_log_probs: torch.Tensor | None


@contextlib.contextmanager
def adapters_disabled(model: nn.Module) -> Iterator[None]:
    """Run a veil ``AdapterModel`` as its base model: every adapter layer returns its frozen base layer's output."""
    from veil.training.adapters import AdapterModel

    if not isinstance(model, AdapterModel):
        raise TypeError(f"reference='adapters_off': expected a veil AdapterModel, received {type(model).__name__}")
    layers = list(model.adapter_layers().values())
    if any(layer.merged for layer in layers):
        raise ValueError("reference='adapters_off': the adapters are merged into the base weights; unmerge() first")
    hooks = [layer.register_forward_hook(lambda m, inputs, _out: m.base_layer(inputs[0])) for layer in layers]
    try:
        yield
    finally:
        for h in hooks:
            h.remove()


class GrpoTrainer:
    """GRPO on a causal LM with Advantage Reweighting and Lopti as options (see :class:`GrpoConfig`).

    Args:
        model: a ``transformers`` causal LM, or a veil ``AdapterModel`` around one (only trainable params move).
        cfg: the GRPO settings.
        reward_fn: ``reward(prompt_ids, completion_ids) -> float`` (see ``veil.training.rl.rewards``).
        eos_id, pad_id: token ids ending a completion and filling after it.

    Example:
        >>> trainer = GrpoTrainer(policy, GrpoConfig.preset("ar_lopti", lr=1e-3), get_reward("sort"), EOS, PAD)
        >>> metrics = trainer.step(prompts)   # prompts: list of token-id lists
    """

    def __init__(self, model: nn.Module, cfg: GrpoConfig, reward_fn: RewardFn, eos_id: int, pad_id: int) -> None:
        self.model, self.cfg, self.reward_fn, self.eos_id, self.pad_id = model, cfg, reward_fn, eos_id, pad_id
        params = [p for p in model.parameters() if p.requires_grad]
        if not params:
            raise ValueError("model: no parameter has requires_grad=True; nothing to train")
        self.params = params
        self.optimizer = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
        self.generator = torch.Generator().manual_seed(cfg.seed)
        self.reference = self._build_reference() if cfg.kl_coef > 0 else None
        self.model.eval()

    def _build_reference(self) -> Callable[[Rollout], torch.Tensor]:
        """The reference policy's log-probs: a frozen copy of the initial policy, or the model with adapters off."""
        from veil.training.adapters import AdapterModel

        mode = self.cfg.reference
        if mode == "auto":
            mode = "adapters_off" if isinstance(self.model, AdapterModel) else "copy"
        if mode == "adapters_off":
            with adapters_disabled(self.model):  # fail now, not at the first step
                pass

            def ref_off(rollout: Rollout) -> torch.Tensor:
                with adapters_disabled(self.model):
                    return completion_log_probs(self.model, rollout, self.cfg.temperature)
            return ref_off
        frozen = copy.deepcopy(self.model).requires_grad_(False).eval()
        return lambda rollout: completion_log_probs(frozen, rollout, self.cfg.temperature)

    @torch.no_grad()
    def make_batch(self, prompts: list[list[int]]) -> Batch:
        """Sample the groups, score them and compute advantages and the old / reference log-probs."""
        cfg = self.cfg
        ids, mask = pad_prompts(prompts, self.pad_id)
        rollout = sample_groups(self.model, ids, mask, cfg.group_size, cfg.max_new_tokens, cfg.temperature,
                                self.eos_id, self.pad_id, self.generator)
        rewards = torch.tensor([float(self.reward_fn(p, c)) for p, c in zip(rollout.prompts(), rollout.completions(),
                                                                           strict=True)])
        adv = group_advantages(rewards, cfg.group_size, cfg.adv_eps, cfg.adv_std == "unbiased")
        old = completion_log_probs(self.model, rollout, cfg.temperature)
        ref = self.reference(rollout) if self.reference is not None else None
        return Batch(rollout, rewards, adv, old, ref)

    def passes(self, batch: Batch) -> list[torch.Tensor]:
        """The token masks (B, L) of this step's update passes, in order: one for GRPO, two for Lopti."""
        resp = batch.rollout.response_mask.bool()
        if not self.cfg.lopti:
            return [resp]
        low, high = lopti_masks(batch.old_log_probs, resp, self.cfg.lopti_eta)
        return [low, high] if self.cfg.lopti_order == "low_first" else [high, low]

    def update(self, batch: Batch) -> dict[str, float]:
        """All update passes of one RL step; returns their averaged loss statistics and counts."""
        cfg = self.cfg
        token_adv = token_advantages(batch.advantages, batch.old_log_probs, batch.rollout.response_mask, cfg)  # (B, L)
        stats: dict[str, list[float]] = {}
        steps = 0
        for mask in self.passes(batch):
            for _ in range(cfg.ppo_epochs):
                order = torch.randperm(batch.advantages.numel(), generator=self.generator)
                for rows in order.chunk(cfg.mini_batches):
                    st = self._optimizer_step(batch, token_adv * mask, mask, rows)
                    steps += 1
                    for k, v in st.items():
                        stats.setdefault(k, []).append(v)
        out = {k: sum(v) / len(v) for k, v in stats.items()}
        out["optimizer_steps"] = float(steps)
        return out

    def _optimizer_step(self, batch: Batch, token_adv: torch.Tensor, kl_mask: torch.Tensor,
                        rows: torch.Tensor) -> dict[str, float]:
        """One AdamW step on the completions ``rows`` of the batch."""
        r = batch.rollout
        sub = Rollout(r.prompt_ids[rows], r.prompt_mask[rows], r.completion_ids[rows], r.response_mask[rows])
        logp = completion_log_probs(self.model, sub, self.cfg.temperature)  # (b, L)
        ref = batch.ref_log_probs[rows] if batch.ref_log_probs is not None else None
        loss, stats = policy_loss(logp, batch.old_log_probs[rows], token_adv[rows], sub.response_mask,
                                  kl_mask[rows], self.cfg, ref)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        limit = self.cfg.max_grad_norm if self.cfg.max_grad_norm > 0 else float("inf")
        stats["grad_norm"] = float(torch.nn.utils.clip_grad_norm_(self.params, limit))
        self.optimizer.step()
        return stats

    def step(self, prompts: list[list[int]]) -> dict[str, float]:
        """One RL step on ``prompts``: sample, score, update. Returns reward and loss statistics."""
        t0 = time.perf_counter()
        batch = self.make_batch(prompts)
        metrics = self.update(batch)
        resp = batch.rollout.response_mask.bool()
        low = (batch.old_log_probs.exp() < self.cfg.lopti_eta) & resp
        metrics.update(reward_mean=float(batch.rewards.mean()), reward_std=float(batch.rewards.std()),
                       response_length=float(resp.sum(1).float().mean()),
                       low_prob_token_frac=float(low.sum() / resp.sum().clamp_min(1)),
                       seconds=time.perf_counter() - t0)
        return metrics


@torch.no_grad()
def evaluate(model: nn.Module, prompts: list[list[int]], reward_fn: RewardFn, cfg: GrpoConfig, eos_id: int,
             pad_id: int, seed: int, samples: int = 1) -> float:
    """Mean reward of ``samples`` temperature samples per prompt, from a generator seeded with ``seed``."""
    ids, mask = pad_prompts(prompts, pad_id)
    rollout = sample_groups(model.eval(), ids, mask, samples, cfg.max_new_tokens, cfg.temperature, eos_id, pad_id,
                            torch.Generator().manual_seed(seed))
    scores = [reward_fn(p, c) for p, c in zip(rollout.prompts(), rollout.completions(), strict=True)]
    return sum(scores) / len(scores)
