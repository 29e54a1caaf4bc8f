"""`veil export adapters`: a base encoder + PEFT-layout LoRA folders -> a served multi-adapter model.

Writes ``<repo>/<name>/1/model.onnx`` (LoRA A/B as graph inputs with zero defaults: the base when no adapter is
active), ``<repo>/<name>/adapters/<id>.onnx_adapter`` (one per adapter, stock ONNX Runtime format) and veil.json
listing the adapters; with ``--merged`` also one merged model ``<repo>/<name>-<id>`` per adapter. Every adapter is
checked against PyTorch (base + adapter applied unmerged), and against its merged graph with ``--merged``.
A ``veil finetune`` text run (``--adapter ID=runs/lora-topic``) brings its classifier head: the graph then also
outputs ``logits`` (the head on the mean-pooled embedding, each adapter with its own labels; 0 columns when no
adapter with a head is active). A LoRA that peft saved over veil's base (`peft_base`, head in modules_to_save) has no
finetune.json: --mean-pool-head says its `classifier` is that head.

Examples:
    veil export adapters bundled:all-MiniLM-L6-v2 --adapter tenant1=runs/lora1 --repo models --name minilm
    veil export adapters bundled:all-MiniLM-L6-v2 --adapter a=runs/a --adapter b=runs/b --repo models --name minilm --merged
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .cli_args import repository_arguments

EXAMPLE = """example:
  veil export adapters bundled:all-MiniLM-L6-v2 --adapter tenant1=runs/lora1 --adapter tenant2=runs/lora2 \\
      --repo models --name minilm --merged
  veil serve --repo models    # then POST /v2/models/minilm:tenant1/infer
"""


def adapter_arg(text: str) -> tuple[str, Path]:
    adapter_id, sep, path = text.partition("=")
    if not sep or not adapter_id or not path:
        raise argparse.ArgumentTypeError(f"expected ID=FOLDER (a PEFT LoRA folder), received {text!r}")
    return adapter_id, Path(path)


def build_parser(prog: str = "veil export adapters") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0], epilog=EXAMPLE,
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     parents=[repository_arguments()])
    parser.add_argument("base", help="base encoder: bundled:all-MiniLM-L6-v2 or a transformers folder")
    parser.add_argument("--adapter", type=adapter_arg, action="append", required=True, metavar="ID=FOLDER",
                        help="a PEFT LoRA folder (adapter_config.json + adapter_model.safetensors) or a `veil "
                             "finetune` LoRA run (its head becomes the `logits` output); repeatable")
    parser.add_argument("--mean-pool-head", action="store_true",
                        help="a saved `classifier` without finetune.json beside it is veil's MeanPoolClassifier head "
                             "(a LoRA peft saved over peft_base(...)); it becomes the `logits` output")
    parser.add_argument("--merged", action="store_true", help="also write one merged model <name>-<id> per adapter")
    parser.add_argument("--max-batch-size", type=int, default=32, help="config.pbtxt max_batch_size (default 32)")
    parser.add_argument("--cache-size", type=int, default=8, help="adapters kept loaded by the server (LRU, default 8)")
    parser.add_argument("--spec", nargs="?", const="", default=None, metavar="JSON",
                        help="also write each adapter's PAVE spec (pave/<id>.json; every adapter must be a `veil "
                             "finetune` text run); optional JSON of PaveConfig fields plus probe_size (docs/recommend.md)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from .adapters import export_adapters, sentence_encoder_spec
    from .encoder import load_sentence_encoder, resolve_encoder

    adapters = dict(args.adapter)
    if len(adapters) != len(args.adapter):
        print(f"--adapter: expected distinct ids, received {[i for i, _ in args.adapter]}", file=sys.stderr)
        return 2
    spec_config = None
    if args.spec is not None:  # bad settings fail before the export
        from .spec import run_spec, spec_settings, write_spec

        spec_config = spec_settings(args.spec)
    folder = resolve_encoder(args.base)
    model, config = load_sentence_encoder(folder)
    manifest = export_adapters(model, sentence_encoder_spec(config), adapters, args.repo, args.name, args.version,
                               merged_models=args.merged, max_batch_size=args.max_batch_size,
                               cache_size=args.cache_size, mean_pool_head=args.mean_pool_head,
                               manifest={"source": {"model": args.base, "architecture": config.model_type},
                                         "pooling": "mean", "normalize": model.normalize})
    summary = {"repository": str(args.repo), "name": args.name, "rank": manifest["lora"]["rank"],
               "adapters": [{"id": row["id"], "file": row["file"], "rank": row["rank"],
                             "max_abs_diff": max(v["max_abs_diff_vs_torch"] for c in row["parity"]["cases"]
                                                 for k, v in c.items() if k != "case")} for row in manifest["adapters"]],
               "merged_models": [f"{args.name}-{row['id']}" for row in manifest["adapters"]] if args.merged else []}
    if spec_config is not None:
        summary["pave_specs"] = {aid: write_spec(args.repo, args.name, run_spec(path, *spec_config, args.base), aid)
                                 for aid, path in adapters.items()}
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
