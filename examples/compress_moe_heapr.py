"""Prune a tiny MoE language model with HEAPr: train it, score atomic experts on calibration text, slice them away,
compare held-out perplexity with whole-expert pruning, save the ragged model and load it back.

    python examples/compress_moe_heapr.py                                  # ~4 min on 1 core (600 steps)
    python examples/compress_moe_heapr.py --steps 60 --out /tmp/heapr      # ~20 s smoke run
    python examples/compress_moe_heapr.py --arch mixtral --ratio 0.4
"""

from __future__ import annotations

import argparse
import copy
import math
from pathlib import Path

import torch
from veil.training.compress.calibration import Calibration
from veil.training.compress.heapr import (
    STAGES,
    ExpertPruneConfig,
    HEAPrConfig,
    count_params,
    layout,
    load_pruned,
    save_pruned,
)
from veil.training.compress.heapr.workload import MoELMConfig, held_out_loss, train_moe_lm
from veil.training.compress.log import ModuleLog
from veil.training.lm import load_pydoc_topics
from veil.training.lm.data import eval_blocks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", choices=["qwen2_moe", "mixtral"], default="qwen2_moe")
    parser.add_argument("--steps", type=int, default=600, help="training steps of the tiny MoE LM")
    parser.add_argument("--ratio", type=float, default=0.25, help="fraction of routed-expert parameters removed")
    parser.add_argument("--out", type=Path, default=Path("runs/heapr-moe"), help="where the pruned model is saved")
    args = parser.parse_args()
    torch.set_num_threads(1)

    corpus = load_pydoc_topics()  # Python's help topics, fixed held-out split
    model, _ = train_moe_lm(MoELMConfig(arch=args.arch, steps=args.steps), corpus)
    blocks = eval_blocks(corpus.held_out, 128, 64)  # (64, 129) held-out windows
    calibration = Calibration.from_bytes(corpus.train, seq_len=128, num_sequences=32)  # train text only
    base = held_out_loss(model, blocks)
    print(f"{args.arch}: {count_params(model):,} parameters, held-out perplexity {math.exp(base):.3f}")

    baseline = copy.deepcopy(model)
    STAGES["expert_prune"].apply(baseline, ExpertPruneConfig(ratio=args.ratio), calibration, ModuleLog(progress=False))
    summary = STAGES["heapr"].apply(model, HEAPrConfig(ratio=args.ratio), calibration, ModuleLog())
    for name, method in (("HEAPr", model), ("expert pruning", baseline)):
        print(f"{name} at {args.ratio:.0%}: {count_params(method):,} parameters, held-out perplexity "
              f"{math.exp(held_out_loss(method, blocks)):.3f}")
    print("expert widths per layer:", {k: v["widths"] for k, v in layout(model).items()})
    print(f"routed-expert FLOPs per token: {summary['routed_flops_per_token_before']:,.0f} -> "
          f"{summary['routed_flops_per_token_after']:,.0f}")

    save_pruned(model, args.out, {"held_out_loss": held_out_loss(model, blocks), "heapr": summary["config"]})
    reloaded = load_pruned(args.out)
    prompt = torch.tensor([list(b"The ")])
    text = bytes(reloaded.generate(input_ids=prompt, max_new_tokens=40, do_sample=False)[0].tolist())
    print(f"saved to {args.out}; reloaded sample: {text.decode('utf-8', 'replace')!r}")


if __name__ == "__main__":
    main()
