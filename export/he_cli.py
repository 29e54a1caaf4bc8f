"""`veil export he`: a ULD-Net checkpoint -> a compiled HE plan served by `veil serve` (encrypted inference).

Examples:
    veil export he runs/polymlp --repo models --name digits-he --mode latency
    veil export he runs/polymlp --repo models --name digits-he-batch --mode throughput
    veil export he runs/polycnn --repo models --name digits-cnn-1 --rotation-keys binary --replicate
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from veil.he.cost import MAX_KEY_BYTES

from .cli_args import repository_arguments

EXAMPLE = """example:
  veil export he runs/polymlp --repo models --name digits-he --mode latency
  veil export he runs/polycnn --repo models --name digits-cnn-he --refresh   # deep: client-refresh rounds
  veil export he runs/polycnn --repo models --name digits-cnn-1 --rotation-keys binary --replicate  # small keys
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="veil export he", description=__doc__.splitlines()[0], epilog=EXAMPLE,
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     parents=[repository_arguments()])
    parser.add_argument("checkpoint", type=Path, help="a `veil train uldnet` checkpoint folder")
    parser.add_argument("--mode", choices=["latency", "throughput"], default="latency",
                        help="latency: one image per ciphertext; throughput: up to N/2 images per call")
    parser.add_argument("--precision-bits", type=int, default=20, help="fractional bits wanted after a multiply")
    parser.add_argument("--rotation-keys", default="exact",
                        help="latency key manifest: exact (fastest), pow2, binary (fewest keys) or budget:K "
                             "(default exact)")
    parser.add_argument("--replicate", nargs="?", const="on", default="auto", choices=["auto", "on", "off"],
                        help="latency: one image per ciphertext, its block repeated over every slot by the client, "
                             "so rotations count modulo the block (with --rotation-keys binary, log2(block) keys "
                             "instead of log2(N/2)), a conv's diagonals merge modulo it and a stem conv may run on "
                             "im2col patches in a larger block where that is predicted faster: on (bare --replicate) for "
                             "every segment (one-image clients: fewer keys, no batching), off never, auto (default) "
                             "each segment with free slots when the plan holds one image per ciphertext anyway")
    parser.add_argument("--refresh", action="store_true",
                        help="cut a plan deeper than one 128-bit parameter set into segments; the client decrypts "
                             "and re-encrypts fresh between them (it learns the activations at the cuts; docs/he.md)")
    parser.add_argument("--max-poly-modulus-degree", type=int, default=None, choices=[4096, 8192, 16384, 32768],
                        help="with --refresh: also cut where a segment would need a larger ring N")
    parser.add_argument("--max-key-mib", type=int, default=MAX_KEY_BYTES >> 20,
                        help="the most MiB of evaluation keys the model may need (with --refresh: all segments); "
                             "over it a leaner key manifest is taken, or the export is refused (default %(default)s)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)  # before torch and onnx: --help and usage errors stay instant
    from .he import export_he

    if args.max_poly_modulus_degree and not args.refresh:
        print("veil export he: --max-poly-modulus-degree expected only with --refresh", file=sys.stderr)
        return 2
    if args.replicate == "on" and args.mode != "latency":
        print(f"veil export he: --replicate expected only with --mode latency, received --mode {args.mode}",
              file=sys.stderr)
        return 2
    manifest = export_he(args.checkpoint, args.repo, args.name, args.mode, args.version, args.precision_bits,
                         refresh=args.refresh, max_poly_modulus_degree=args.max_poly_modulus_degree,
                         rotation_keys=args.rotation_keys, max_key_bytes=args.max_key_mib << 20,
                         replicate={"auto": None, "on": True, "off": False}[args.replicate])
    print(json.dumps({k: manifest[k] for k in ("name", "mode", "levels", "parameters", "galois_steps", "plan_hash",
                                               "rounds", "cuts")}
                     | {"sizes_bytes": manifest["describe"]["sizes_bytes"], "segmentation": manifest["segmentation"],
                        "parameter_choice": manifest["parameter_choice"]["why"]},
                     indent=1))
    print(f"parameters: {manifest['parameter_choice']['why']}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
