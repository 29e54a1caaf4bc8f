"""`veil export forecast`: a `veil train forecast` checkpoint -> one affine ONNX graph, or an HE plan (--he).

Examples:
    veil export forecast runs/co2-rrr --repo models --name co2
    veil export forecast runs/co2-rrr --repo models --name co2-he --he throughput   # many series per call
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .cli_args import repository_arguments

EXAMPLE = """example:
  veil export forecast runs/co2-rrr --repo models --name co2
  veil export forecast runs/co2-rrr --repo models --name co2-he --he latency
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="veil export forecast", description=__doc__.splitlines()[0], epilog=EXAMPLE,
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     parents=[repository_arguments("the checkpoint folder's name")])
    parser.add_argument("checkpoint", type=Path, help="a `veil train forecast` checkpoint folder")
    parser.add_argument("--he", choices=["latency", "throughput"], default=None,
                        help="compile to an encrypted-inference plan: latency (series packed in slot blocks) or "
                             "throughput (one ciphertext per lag, up to N/2 series per call)")
    parser.add_argument("--precision-bits", type=int, default=20, help="--he: fractional bits wanted after a multiply")
    parser.add_argument("--client-norm", action="store_true",
                        help="--he: the client standardises and instance-normalises its windows before encrypting "
                             "(needed for RevIN with a bias, a learned affine or a mixed W)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.he:
        from .forecast import export_forecast_he

        name = args.name or f"{args.checkpoint.name}-he"
        manifest = export_forecast_he(args.checkpoint, args.repo, name, args.he, args.version, args.precision_bits,
                                      args.client_norm)
        print(json.dumps({k: manifest[k] for k in ("name", "mode", "levels", "parameters", "batch_capacity", "plan_hash")}
                         | {"parameter_choice": manifest["parameter_choice"]["why"]}, indent=1))
        return 0
    from .forecast import export_forecast

    manifest = export_forecast(args.checkpoint, args.repo, args.name, args.version)
    print(json.dumps({k: manifest[k] for k in ("name", "version", "kind", "lookback", "horizon", "channels",
                                               "collapse")}
                     | {"validation": manifest["validation"]["cases"]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
