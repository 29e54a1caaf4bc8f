"""`veil train sampler`: train an amortized diffusion posterior (VE score network) on a simulator task.

Examples:
    veil train sampler --task gaussian_linear --dim 5 --out runs/sampler-gl5
    veil train sampler --task two_moons --steps 5000 --out runs/sampler-moons

The checkpoint (config.json, model.safetensors, metrics.json) is what `veil export sampler` reads. Results
(metrics JSON) go to stdout; the progress bar goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .config import TASK_NAMES, SamplerTrainConfig, ScoreNetConfig

EXAMPLE = """example:
  veil train sampler --task gaussian_linear --dim 5 --out runs/sampler-gl5
  veil train sampler --task two_moons --steps 5000 --hidden 256 --out runs/sampler-moons
  veil train sampler --task gaussian_linear --dim 2 --predictive --out runs/sampler-gl2-pred
"""


def build_parser(prog: str = "veil train sampler") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0], epilog=EXAMPLE,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", required=True, choices=sorted(TASK_NAMES), help="simulator task")
    parser.add_argument("--dim", type=int, default=None, help="θ's dimension (gaussian_linear tasks; default 10)")
    parser.add_argument("--predictive", action="store_true",
                        help="model the joint (θ, x*) | x: PriorGuide's posterior-predictive mode (Eq. 17)")
    parser.add_argument("--out", type=Path, default=None, help="checkpoint folder (default: runs/sampler-<task>)")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    ScoreNetConfig.add_arguments(parser, skip=("dim", "x_dim"))
    SamplerTrainConfig.add_arguments(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)  # before torch: --help and usage errors stay instant
    import torch

    from .simulators import get_task
    from .trainer import save_sampler, train_score

    torch.set_num_threads(1)
    task = get_task(args.task, args.dim)
    train_cfg = SamplerTrainConfig.from_args(args)
    dim = task.dim + task.x_dim if args.predictive else task.dim
    model_cfg = ScoreNetConfig.from_args(args, dim=dim, x_dim=task.x_dim)
    simulate = task.simulate_predictive if args.predictive else task.simulate_pairs
    theta, x = simulate(train_cfg.simulations, seed=train_cfg.seed)
    result = train_score(theta, x, task.prior, model_cfg, train_cfg, progress=not args.no_progress)
    out = args.out or Path("runs") / f"sampler-{args.task}{'-predictive' if args.predictive else ''}"
    save_sampler(result, out, {"name": task.name, "dim": task.dim, "x_dim": task.x_dim,
                               "predictive": args.predictive})
    print(json.dumps({"checkpoint": str(out), **result.metrics}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
