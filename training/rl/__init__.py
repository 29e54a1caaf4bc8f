"""veil.training.rl: GRPO for causal LMs with Advantage Reweighting and Lopti (Yang et al., ICLR 2026).

Example:
    >>> import torch
    >>> from veil.training.rl import GrpoConfig, GrpoTrainer, get_reward
    >>> from veil.training.rl.toy import EOS, PAD, ToySortConfig, build_policy, sample_prompts, warm_start
    >>> task = ToySortConfig(); policy = build_policy(task, seed=0); warm_start(policy, task, seed=0)
    >>> trainer = GrpoTrainer(policy, GrpoConfig.preset("ar_lopti", lr=3e-4, max_new_tokens=7), get_reward("sort"), EOS, PAD)
    >>> trainer.step(sample_prompts(8, task, torch.Generator().manual_seed(0)))["reward_mean"]
"""

from __future__ import annotations

from veil.lazy import lazy_exports

from . import sort_task  # noqa: F401  (registers the "sort" reward)
from .config import PRESETS, GrpoConfig
from .rewards import REWARDS, get_reward, register_reward

# the trainer loads torch on first use: the command's parser and the reward registry need none of it
__getattr__, __dir__ = lazy_exports(__name__, {name: ".trainer" for name in
                                               ("Batch", "GrpoTrainer", "adapters_disabled", "evaluate")})

__all__ = ["PRESETS", "REWARDS", "Batch", "GrpoConfig", "GrpoTrainer", "adapters_disabled", "evaluate",
           "get_reward", "register_reward"]
