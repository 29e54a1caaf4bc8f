"""`veil export finetuned`: a `veil finetune` run folder -> one validated ONNX classifier in a model repository.

LoRA, PSOFT and E2LoRA are merged into the base weights (W + ΔW, a plain graph); mtLoRA, LoRA-Mixer and VAPT are
exported unmerged with their routers / prompt generators in the graph. The graph is checked against PyTorch.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .cli_args import repository_arguments

EXAMPLE = """example:
  veil finetune --method mtlora --task sentiment --out runs/mtlora-sentiment
  veil export finetuned runs/mtlora-sentiment --repo models --name sentiment
  veil serve --repo models    # then POST /v2/models/sentiment/infer with input_ids + attention_mask
"""


def build_parser(prog: str = "veil export finetuned") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0], epilog=EXAMPLE,
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     parents=[repository_arguments()])
    parser.add_argument("run", type=Path, help="a `veil finetune --out` folder")
    parser.add_argument("--base", default=None,
                        help="text base model (bundled:all-MiniLM-L6-v2 or a transformers folder); default: the "
                             "checkpoint's base_model_name_or_path")
    parser.add_argument("--no-merge", action="store_true",
                        help="keep LoRA/PSOFT/E2LoRA unmerged in the graph (default: fold W + ΔW)")
    parser.add_argument("--max-batch-size", type=int, default=32, help="config.pbtxt max_batch_size (default 32)")
    parser.add_argument("--spec", nargs="?", const="", default=None, metavar="JSON",
                        help="also write the model's PAVE spec (pave.json, for POST /v2/recommend); optional JSON of "
                             "PaveConfig fields plus probe_size (docs/recommend.md)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from .finetuned import export_finetuned

    spec_config = None
    if args.spec is not None:  # bad settings fail before the export
        from .spec import run_spec, spec_settings, write_spec

        spec_config = spec_settings(args.spec)
    manifest = export_finetuned(args.run, args.repo, args.name, args.version, base=args.base,
                                merge=not args.no_merge, max_batch_size=args.max_batch_size)
    if spec_config is not None:
        manifest["pave_spec"] = write_spec(args.repo, args.name, run_spec(args.run, *spec_config, args.base))
    worst = max(out["max_abs_diff"] for case in manifest["validation"]["cases"] for out in case["outputs"].values())
    print(json.dumps({"repository": str(args.repo), "name": args.name, "method": manifest["method"],
                      "kind": manifest["kind"], "graph": manifest["graph"], "labels": manifest["labels"],
                      "max_abs_diff_vs_torch": worst, **({"pave_spec": manifest["pave_spec"]} if args.spec is not None
                                                         else {})}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
