"""`veil sample`: PriorGuide posterior draws from an exported sampler, under a prior chosen now.

Examples:
    veil sample models/gl5 --x 0.1 0.2 0.0 -0.3 0.5 \\
        --prior '{"family": "gaussian", "mean": [0.2, 0, 0, 0, 0], "std": [0.06, 0.06, 0.06, 0.06, 0.06]}' \\
        --num-samples 1000 --out draws.npy
    veil sample models/moons --x 0.1 -0.2 --prior-file my_prior.json --steps 50 --langevin-steps 4

MODEL is a model folder of a repository (its highest version is used), a version folder or a sampler.json.
Without a prior the draws are from the training posterior (unguided). The diagnostics and a summary (mean and
standard deviation per dimension) go to stdout as JSON; the draws go to ``--out`` (.npy or .csv), one row per
draw: θ, then x* for a predictive model.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
from pathlib import Path

from veil.atomic import write_atomic

EXAMPLE = """example:
  veil sample models/gl5 --x 0.1 0.2 0.0 -0.3 0.5 \\
      --prior '{"family": "gaussian", "mean": [0.2, 0, 0, 0, 0], "std": 0.06}' --out draws.npy
"""


def build_parser() -> argparse.ArgumentParser:
    from .settings import SamplerSettings

    parser = argparse.ArgumentParser(prog="veil sample", description=__doc__.splitlines()[0], epilog=EXAMPLE,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", type=Path, help="exported sampler: model folder, version folder or sampler.json")
    parser.add_argument("--x", type=float, nargs="+", required=True, help="the observation (d_x numbers)")
    prior = parser.add_mutually_exclusive_group()
    prior.add_argument("--prior", default=None, help="test prior as a JSON spec (default: the training prior)")
    prior.add_argument("--prior-file", type=Path, default=None, help="test prior spec in a JSON file")
    parser.add_argument("--out", type=Path, default=None, help="write the draws here (.npy or .csv)")
    SamplerSettings.add_arguments(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)  # before torch: --help and usage errors stay instant
    import numpy as np
    import torch

    from .artifact import load_artifact
    from .priors import PriorSpecError, prior_from_spec
    from .settings import SamplerSettings

    torch.set_num_threads(1)
    try:
        artifact = load_artifact(args.model)
        dim = artifact.train_prior.dim
        spec = args.prior_file.read_text() if args.prior_file else args.prior
        prior = None if spec is None else prior_from_spec(spec, dim=dim)
        settings = SamplerSettings.from_args(args, base=artifact.defaults.to_dict())
        out = artifact.posterior.sample(x=torch.tensor(args.x), prior=prior, settings=settings)
    except (FileNotFoundError, PriorSpecError, ValueError) as exc:
        parser.exit(2, f"veil sample: error: {exc}\n")
    theta = out.theta.numpy() if out.predictive is None else torch.cat([out.theta, out.predictive], 1).numpy()
    if args.out is not None:
        buffer = io.BytesIO()
        if args.out.suffix == ".csv":
            np.savetxt(buffer, theta, delimiter=",")
        else:
            np.save(buffer, theta)
        write_atomic(args.out, buffer.getvalue())
    summary = {"mean": [round(float(v), 6) for v in theta.mean(0)], "std": [round(float(v), 6) for v in theta.std(0)]}
    print(json.dumps({"samples": list(theta.shape), "out": None if args.out is None else str(args.out),
                      "summary": summary, "diagnostics": out.diagnostics}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
