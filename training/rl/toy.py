"""A toy rule-reward task a tiny causal LM learns with GRPO in minutes on one CPU core: sort the symbols.

Prompt ``BOS s_1 … s_k SEP`` (k symbols drawn uniformly from ``num_symbols``); the rewarded completion is the
same symbols in ascending order, then EOS. Reward ``sort``: the share of positions that match the sorted list
(extra or missing tokens count as wrong), so partial credit gives GRPO a dense signal.

The policy is a random-init ``LlamaForCausalLM`` warm-started by a short supervised pass on a *noisy* version of
the task (each target symbol replaced by a uniform random symbol with probability ``noise``), the stand-in for the
paper's instruct model: the policy starts with the skill half-learned and many low-probability tokens in its
samples, the regime where the paper's (1 − π) gradient law matters. Everything is deterministic by seed.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .config import GrpoConfig
from .rollout import pad_prompts
from .sort_task import (
    BOS,
    EOS,
    FIRST_SYMBOL,
    PAD,
    SEP,
    ToySortConfig,
    prompt_symbols,
    sort_reward,
)

LOW_PROB = 0.5  # the probability below which run_toy counts a token as low-probability, whatever the method's η


def sample_prompts(n: int, cfg: ToySortConfig, generator: torch.Generator) -> list[list[int]]:
    """``n`` prompts ``BOS s_1 … s_k SEP`` with symbols drawn from ``generator``."""
    sym = torch.randint(FIRST_SYMBOL, cfg.vocab_size, (n, cfg.length), generator=generator)  # (n, k)
    return [[BOS, *row, SEP] for row in sym.tolist()]


def build_policy(cfg: ToySortConfig, seed: int) -> nn.Module:
    """A random-init tiny ``LlamaForCausalLM`` for the task's vocabulary (no download), seeded."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=2 * cfg.hidden_size,
                         num_hidden_layers=cfg.layers, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=2 * cfg.length + 8, pad_token_id=PAD, bos_token_id=BOS,
                         eos_token_id=EOS, tie_word_embeddings=False)
    return LlamaForCausalLM(config)


def warm_start(model: nn.Module, cfg: ToySortConfig, seed: int) -> float:
    """Supervised pass on noisy sorted targets (loss on completion tokens and EOS); returns the last loss."""
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=cfg.warm_lr)
    model.train()
    loss = torch.zeros(())
    for _ in range(cfg.warm_steps):
        prompts = sample_prompts(cfg.warm_batch, cfg, g)
        target = torch.tensor([sorted(prompt_symbols(p)) for p in prompts])  # (N, k)
        flip = torch.rand(target.shape, generator=g) < cfg.noise
        noisy = torch.where(flip, torch.randint(FIRST_SYMBOL, cfg.vocab_size, target.shape, generator=g), target)
        ids, _ = pad_prompts(prompts, PAD)  # all prompts have one length: no padding
        seq = torch.cat([ids, noisy, torch.full((len(prompts), 1), EOS)], dim=1)  # (N, k + 2 + k + 1)
        labels = seq.clone()
        labels[:, :ids.shape[1]] = -100  # learn the completion only
        loss = model(input_ids=seq, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    return float(loss.detach())


def run_toy(task: ToySortConfig, cfg: GrpoConfig, steps: int, prompts_per_step: int, seed: int,
            eval_prompts: int = 128, eval_every: int = 20, eval_samples: int = 2,
            policy_state: dict[str, torch.Tensor] | None = None) -> dict[str, Any]:
    """Train a warm-started toy policy with ``cfg`` for ``steps`` RL steps and record the reward curve.

    Args:
        policy_state: the warm-started weights to start from (so several methods share one start); built and
            warm-started from ``seed`` when None.
    Returns:
        ``history`` (per step: training reward, low-probability token share, high-prob direction agreement),
        ``eval`` (step, held-out reward) pairs, ``initial_gradient_share`` (plain vs AR weights on the first
        batch), and the policy.
    """
    from .diagnostics import gradient_share, high_prob_direction
    from .trainer import GrpoTrainer, evaluate

    policy = build_policy(task, seed)
    if policy_state is None:
        warm_start(policy, task, seed)
    else:
        policy.load_state_dict(policy_state)
    held_out = sample_prompts(eval_prompts, task, torch.Generator().manual_seed(10_000 + seed))  # never trained on
    reward = sort_reward
    trainer = GrpoTrainer(policy, cfg.replace(seed=seed, max_new_tokens=task.length + 1), reward, EOS, PAD)
    prompt_gen = torch.Generator().manual_seed(20_000 + seed)  # the same training prompts for every method
    evals = [(0, evaluate(policy, held_out, reward, trainer.cfg, EOS, PAD, seed, eval_samples))]
    history, share = [], {}
    for step in range(1, steps + 1):
        batch = trainer.make_batch(sample_prompts(prompts_per_step, task, prompt_gen))
        if step == 1:
            share = {name: gradient_share(policy, batch, trainer.cfg.replace(ar=ar, lopti_eta=LOW_PROB))["low_share"]
                     for name, ar in (("plain", False), ("ar", True))}
        stats = trainer.update(batch)
        history.append({"step": step, "reward": float(batch.rewards.mean()),
                        "low_prob_token_frac": float(((batch.old_log_probs.exp() < LOW_PROB)
                                                      & batch.rollout.response_mask.bool()).sum()
                                                     / batch.rollout.response_mask.sum()),
                        "high_prob_direction": high_prob_direction(policy, batch, trainer.cfg.replace(lopti_eta=LOW_PROB)),
                        "optimizer_steps": stats["optimizer_steps"]})
        if step % eval_every == 0 or step == steps:
            evals.append((step, evaluate(policy, held_out, reward, trainer.cfg, EOS, PAD, seed, eval_samples)))
    return {"history": history, "eval": evals, "initial_gradient_share": share, "policy": policy}
