"""`veil export sampler`: a `veil train sampler` checkpoint -> a PriorGuide sampler served by `veil serve`.

Examples:
    veil export sampler runs/sampler-gl5 --repo models --name gl5
    veil export sampler runs/sampler-moons --repo models --name moons --steps 50 --langevin-steps 4
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from veil.posterior.settings import SamplerSettings

from .cli_args import repository_arguments

EXAMPLE = """example:
  veil export sampler runs/sampler-gl5 --repo models --name gl5
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="veil export sampler", description=__doc__.splitlines()[0],
                                     epilog=EXAMPLE, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     parents=[repository_arguments()])
    parser.add_argument("checkpoint", type=Path, help="a `veil train sampler` checkpoint folder")
    SamplerSettings.add_arguments(parser)  # the served defaults a request can override
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)  # before torch and onnx: --help and usage errors stay instant
    from .sampler import export_sampler

    manifest = export_sampler(args.checkpoint, args.repo, args.name, args.version, SamplerSettings.from_args(args))
    print(json.dumps({k: manifest[k] for k in ("name", "version", "dim", "x_dim", "train_prior_hash")}
                     | {"validation": manifest["export"]["validation"]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
