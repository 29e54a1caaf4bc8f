"""`veil export onnx`: a trained model -> validated ONNX in a Triton-layout model repository.

SOURCE is a veil checkpoint folder (`veil train uldnet --out ...`), a Hugging Face encoder folder, or
`bundled:all-MiniLM-L6-v2` (exported as a sentence-embedding model with mean pooling).

Examples:
    veil export onnx runs/polycnn --repo models --name digits
    veil export onnx runs/polycnn --repo models --name digits-int8 --quantize int8
    veil export onnx bundled:all-MiniLM-L6-v2 --repo models --name minilm --quantize int8
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

EXAMPLE = """example:
  veil export onnx runs/polycnn --repo models --name digits
  veil export onnx bundled:all-MiniLM-L6-v2 --repo models --name minilm --quantize int8
"""


def build_parser(prog: str = "veil export onnx") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0], epilog=EXAMPLE,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("source", help="checkpoint folder, Hugging Face encoder folder, or bundled:all-MiniLM-L6-v2")
    parser.add_argument("--repo", type=Path, required=True, help="model repository folder (created if missing)")
    parser.add_argument("--name", default=None, help="model name in the repository (default: from the source)")
    parser.add_argument("--version", type=int, default=1, help="version folder to write (default: 1)")
    parser.add_argument("--quantize", choices=["int8"], default=None,
                        help="int8: static QDQ with calibration for CNN/MLP checkpoints, dynamic for encoders")
    parser.add_argument("--calibration", type=Path, default=None,
                        help=".npz with x (and y) for int8 calibration when the checkpoint's data cannot be reloaded")
    parser.add_argument("--max-batch-size", type=int, default=None, help="config.pbtxt max_batch_size (default 64; 32 for encoders)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    source = Path(args.source)
    batch = {} if args.max_batch_size is None else {"max_batch_size": args.max_batch_size}
    if (source / "config.json").is_file() and json.loads((source / "config.json").read_text()).get("kind") == "uldnet":
        from .uldnet import export_uldnet

        manifest = export_uldnet(source, args.repo, args.name, args.version, args.quantize, args.calibration, **batch)
    else:
        from .encoder import export_sentence_encoder

        manifest = export_sentence_encoder(args.source, args.repo, args.name, args.version, args.quantize, **batch)
    summary = {"repository": str(args.repo), "name": manifest["name"], "version": manifest["version"],
               "kind": manifest["kind"], "precision": manifest["precision"],
               "validation": [{"shapes": c["shapes"], **{k: v["max_abs_diff"] for k, v in c["outputs"].items()}}
                              for c in manifest["validation"]["cases"]],
               "veil_functions": manifest["export"]["veil_functions"]}
    for key in ("quantization", "optimization"):
        if key in manifest:
            summary[key] = {k: v for k, v in manifest[key].items() if k != "validation"}
    print(json.dumps(summary, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
