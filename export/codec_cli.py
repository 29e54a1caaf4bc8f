"""`veil export codec`: a `veil train codec` checkpoint -> encoder/decoder/prior ONNX + codec.json in a repository.

Examples:
    veil export codec runs/codec --repo models --name codec
    veil serve --repo models     # then POST /v2/models/codec/infer with a BYTES image or bitstream
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from .cli_args import repository_arguments

EXAMPLE = """example:
  veil export codec runs/codec --repo models --name codec
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="veil export codec", description=__doc__.splitlines()[0], epilog=EXAMPLE,
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     parents=[repository_arguments()])
    parser.add_argument("checkpoint", type=Path, help="a `veil train codec` checkpoint folder")
    return parser


def export_run(run: Path) -> dict[str, Any]:
    """Export a `veil train codec` run folder to ``run/repo/codec/1``; the summary fields `veil train codec` adds."""
    from .codec import export_codec

    manifest = export_codec(run, run / "repo", "codec")
    return {"model": str(run / "repo" / "codec"), "model_hash": manifest["model_hash"],
            "validation": manifest["validation"]}


def train_main(argv: list[str] | None = None) -> int:
    """`veil train codec`: train (veil.training.codec.cli), then export the run here unless ``--no-export``."""
    from veil.training.codec.cli import main as train

    return train(argv, export=export_run)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)  # before torch and onnx: --help and usage errors stay instant
    from .codec import export_codec

    manifest = export_codec(args.checkpoint, args.repo, args.name, args.version)
    print(json.dumps({k: manifest[k] for k in ("name", "version", "kind", "model_hash", "scales", "bits", "validation")},
                     indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
