"""GRPO with Advantage Reweighting and Lopti on the toy sort task: a tiny Llama (optionally with LoRA adapters).

    python examples/grpo_toy.py                                   # GRPO+AR+Lopti, 100 steps (~35 s on one core)
    python examples/grpo_toy.py --method grpo --steps 20 --lora   # plain GRPO on LoRA adapters only
"""

from __future__ import annotations

import argparse

import torch
from veil.training.adapters import LoraConfig, inject
from veil.training.rl import PRESETS, GrpoConfig, GrpoTrainer, evaluate, get_reward
from veil.training.rl.toy import EOS, PAD, ToySortConfig, build_policy, sample_prompts, warm_start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--method", choices=PRESETS, default="ar_lopti")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--warm-steps", type=int, default=300, help="supervised warm start on noisy targets")
    parser.add_argument("--lora", action="store_true", help="train LoRA adapters on q/v/o instead of all weights")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)

    task = ToySortConfig(warm_steps=args.warm_steps)
    policy = build_policy(task, args.seed)
    warm_start(policy, task, args.seed)
    if args.lora:  # the base is frozen; the KL reference is the same model with its adapters switched off
        policy = inject(policy, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj", "o_proj"]))
    lr = 3e-3 if args.lora else 3e-4
    cfg = GrpoConfig.preset(args.method, lr=lr, max_new_tokens=task.length + 1, seed=args.seed)
    trainer = GrpoTrainer(policy, cfg, get_reward("sort"), EOS, PAD)

    held_out = sample_prompts(128, task, torch.Generator().manual_seed(10_000 + args.seed))
    print(f"held-out reward before: {evaluate(policy, held_out, get_reward('sort'), cfg, EOS, PAD, 0, 2):.3f}")
    prompts = torch.Generator().manual_seed(20_000 + args.seed)
    for step in range(1, args.steps + 1):
        m = trainer.step(sample_prompts(16, task, prompts))
        if step % 20 == 0 or step == args.steps:
            print(f"step {step}: train reward {m['reward_mean']:.3f}, low-prob tokens {m['low_prob_token_frac']:.2f}, "
                  f"optimizer steps {m['optimizer_steps']:.0f}")
    print(f"held-out reward after: {evaluate(policy, held_out, get_reward('sort'), cfg, EOS, PAD, 0, 2):.3f}")


if __name__ == "__main__":
    main()
