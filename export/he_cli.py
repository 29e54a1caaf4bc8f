"""`veil export he`: a ULD-Net checkpoint -> a compiled HE plan served by `veil serve` (encrypted inference).

Examples:
    veil export he runs/polymlp --repo models --name digits-he --mode latency
    veil export he runs/polymlp --repo models --name digits-he-batch --mode throughput
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

EXAMPLE = """example:
  veil export he runs/polymlp --repo models --name digits-he --mode latency
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="veil export he", description=__doc__.splitlines()[0], epilog=EXAMPLE,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", type=Path, help="a `veil train uldnet` checkpoint folder")
    parser.add_argument("--repo", type=Path, required=True, help="model repository folder")
    parser.add_argument("--name", required=True, help="model name in the repository")
    parser.add_argument("--mode", choices=["latency", "throughput"], default="latency",
                        help="latency: one image per ciphertext; throughput: up to N/2 images per call")
    parser.add_argument("--version", type=int, default=1, help="version folder (default 1)")
    parser.add_argument("--precision-bits", type=int, default=20, help="fractional bits wanted after a multiply")
    return parser


def main(argv: list[str] | None = None) -> int:
    from .he import export_he

    args = build_parser().parse_args(argv)
    manifest = export_he(args.checkpoint, args.repo, args.name, args.mode, args.version, args.precision_bits)
    print(json.dumps({k: manifest[k] for k in ("name", "mode", "levels", "parameters", "galois_steps", "plan_hash")}
                     | {"sizes_bytes": manifest["describe"]["sizes_bytes"]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
