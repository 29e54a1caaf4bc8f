"""`veil train rl`: GRPO (with Advantage Reweighting and Lopti as options) on a causal LM with a rule reward.

Two policies:
  * the bundled toy task (default): a tiny Llama warm-started on noisy sorted targets, reward ``sort``;
  * your own: a `veil train lm` checkpoint (``--model``, byte-level), prompts from a text file (one per
    line, ``--prompts``) and a reward rule registered under a name (``--reward``; ``--reward-module FILE.py``
    imports your file first, so its ``@register_reward("name")`` rules are known).

The policy is trained in full, or only through LoRA adapters (``--lora-r``; the KL reference is then the same
model with its adapters switched off). The result is a checkpoint folder (config.json, model.safetensors,
metrics.json with the reward curve); the metrics JSON also goes to stdout, the progress bar to stderr.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import random
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .config import PRESETS, GrpoConfig
from .rewards import get_reward
from .sort_task import EOS, PAD, ToySortConfig

if TYPE_CHECKING:  # torch is imported once the command runs (the parser needs none of it)
    import torch
    from torch import nn

EXAMPLE = """example:
  veil train rl --method ar_lopti --steps 100 --out runs/rl-sort
  veil train rl --method lopti --lora-r 8 --steps 50 --lr 3e-3 --out runs/rl-sort-lora
  veil train rl --model runs/lm-alice --prompts prompts.txt --reward-module my_rules.py --reward my_rule \\
      --eos-byte 10 --max-new-tokens 32 --out runs/rl-mine
"""
TOY_LR, TOY_LORA_LR = 3e-4, 3e-3  # the toy policy's rates (GrpoConfig's 1e-6 is for 3B-7B policies)


def build_parser(prog: str = "veil train rl") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0], epilog=EXAMPLE,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--method", choices=PRESETS, default="ar_lopti",
                        help="GRPO variant: the spec's settings of AR / Lopti (flags below override them)")
    parser.add_argument("--steps", type=int, default=100, help="RL steps (one sampled batch each)")
    parser.add_argument("--prompts-per-step", type=int, default=16, help="prompts per RL step (x group size samples)")
    parser.add_argument("--lora-r", type=int, default=0, help="train LoRA adapters of this rank on q/v/o only (0: all weights)")
    parser.add_argument("--model", type=Path, default=None, help="a `veil train lm` checkpoint (default: the toy task)")
    parser.add_argument("--prompts", type=Path, default=None, help="with --model: a text file, one prompt per line")
    parser.add_argument("--reward", default=None, help="reward rule name (default: sort for the toy task)")
    parser.add_argument("--reward-module", type=Path, default=None, help="a Python file registering reward rules")
    parser.add_argument("--eos-byte", type=int, default=10, help="with --model: the byte that ends a completion")
    parser.add_argument("--out", type=Path, default=Path("runs/rl"), help="checkpoint folder")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    ToySortConfig.add_arguments(parser, prefix="toy-")
    GrpoConfig.add_arguments(parser, skip=("seed",))
    parser.add_argument("--seed", type=int, default=0, help="seed of the policy, the warm start and the sampling")
    return parser


def _load_reward(args: argparse.Namespace) -> str:
    if args.reward_module is not None:
        if not args.reward_module.is_file():
            raise FileNotFoundError(f"--reward-module: expected a Python file, received {str(args.reward_module)!r}")
        spec = importlib.util.spec_from_file_location("veil_user_rewards", args.reward_module)
        assert spec is not None and spec.loader is not None
        spec.loader.exec_module(importlib.util.module_from_spec(spec))
    name = args.reward or ("sort" if args.model is None else None)
    if name is None:
        raise ValueError("--reward: expected a registered rule name with --model, received none")
    try:
        get_reward(name)
    except KeyError as exc:  # one clear line through `veil`, listing the known rules
        raise ValueError(f"--{exc.args[0]}") from None
    return name


def _policy_and_prompts(args: argparse.Namespace, task: ToySortConfig) -> tuple[nn.Module, Any, int, int, dict]:
    """(policy, prompt sampler(n, generator), eos id, pad id, description of the source)."""
    import torch

    from .toy import build_policy, sample_prompts, warm_start

    if args.model is None:
        policy = build_policy(task, args.seed)
        warm_start(policy, task, args.seed)
        return policy, lambda n, g: sample_prompts(n, task, g), EOS, PAD, {"task": "sort", **task.to_dict()}
    from veil.training.lm.trainer import load_lm

    if args.prompts is None or not args.prompts.is_file():
        raise FileNotFoundError(f"--prompts: expected a text file with one prompt per line, received {args.prompts!r}")
    if not 0 <= args.eos_byte < 256:
        raise ValueError(f"--eos-byte: expected a byte value in [0, 255], received {args.eos_byte}")
    lines = [ln.encode() for ln in args.prompts.read_text().splitlines() if ln.strip()]
    if not lines:
        raise ValueError(f"--prompts: expected at least one non-empty line in {str(args.prompts)!r}, received none")
    policy, config = load_lm(args.model)
    prompts = [list(b) for b in lines]

    def sample(n: int, g: torch.Generator) -> list[list[int]]:
        rows = torch.randint(len(prompts), (n,), generator=g).tolist()
        return [prompts[i] for i in rows]
    return policy, sample, args.eos_byte, 0, {"model": str(args.model), "prompts": str(args.prompts),
                                              "num_prompts": len(prompts), "llama_config": config["llama_config"]}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)  # --help and usage errors exit here, before torch is imported
    import torch
    from veil.training.adapters import LoraConfig, inject
    from veil.training.checkpoint import save_checkpoint

    from veil.progress import progress as progress_bar

    from .trainer import GrpoTrainer

    torch.manual_seed(args.seed)
    random.seed(args.seed)
    task = ToySortConfig.from_args(args, prefix="toy-")
    reward_name = _load_reward(args)
    policy, sample, eos, pad, source = _policy_and_prompts(args, task)
    if args.lora_r > 0:
        policy = inject(policy, LoraConfig(r=args.lora_r, lora_alpha=2 * args.lora_r,
                                           target_modules=["q_proj", "v_proj", "o_proj"]))
    overrides: dict[str, Any] = {"seed": args.seed}
    if args.model is None:
        overrides["max_new_tokens"] = task.length + 1
        overrides["lr"] = TOY_LORA_LR if args.lora_r > 0 else TOY_LR
    base = GrpoConfig.preset(args.method, **overrides)
    cfg = GrpoConfig.from_args(args, base=base.to_dict())
    trainer = GrpoTrainer(policy, cfg, get_reward(reward_name), eos, pad)
    generator = torch.Generator().manual_seed(20_000 + args.seed)
    history = []
    bar = progress_bar(range(1, args.steps + 1), desc=f"grpo[{args.method}]", enabled=not args.no_progress, file=sys.stderr)
    for step in bar:
        m = trainer.step(sample(args.prompts_per_step, generator))
        history.append({"step": step, **{k: round(v, 6) for k, v in m.items()}})
        bar.set_postfix(reward=f"{m['reward_mean']:.3f}", low_prob=f"{m['low_prob_token_frac']:.2f}")
    last = history[-10:]
    metrics = {"reward_first": history[0]["reward_mean"], "reward_last10": sum(h["reward_mean"] for h in last) / len(last),
               "optimizer_steps": sum(h["optimizer_steps"] for h in history), "history": history}
    config = {"kind": "rl", "method": args.method, "grpo": cfg.to_dict(), "reward": reward_name, "source": source,
              "lora_r": args.lora_r}
    state = policy.state_dict()
    if args.model is not None and "lm_head.weight" in state and source["llama_config"].get("tie_word_embeddings"):
        state.pop("lm_head.weight")  # one tensor under two names: safetensors stores it once
    save_checkpoint(args.out, config, state, metrics)
    print(json.dumps({"checkpoint": str(args.out), **{k: v for k, v in metrics.items() if k != "history"}}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
