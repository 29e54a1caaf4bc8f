"""`veil export onnx`: a trained model -> validated ONNX in a Triton-layout model repository.

SOURCE is a veil checkpoint folder (`veil train uldnet --out ...`), a Hugging Face encoder folder, or
`bundled:all-MiniLM-L6-v2` (exported as a sentence-embedding model with mean pooling). A checkpoint is dispatched
on the kind its config.json records; a kind another verb exports (codec, sampler, forecast, a finetune run) is
refused with that verb's command, an unknown kind with the list of known ones.

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

from veil.kinds import CHECKPOINT_VERBS

from .cli_args import repository_arguments

# checkpoint kind (config.json "kind") -> what exports it (veil.kinds): this verb, or the one named
VERB = "veil export onnx"
ONNX_KINDS = tuple(kind for kind, verb in CHECKPOINT_VERBS.items() if verb == VERB)
OTHER_VERBS = {kind: verb for kind, verb in CHECKPOINT_VERBS.items() if verb != VERB}

EXAMPLE = """example:
  veil export onnx runs/polycnn --repo models --name digits
  veil export onnx bundled:all-MiniLM-L6-v2 --repo models --name minilm --quantize int8
"""


def build_parser(prog: str = "veil export onnx") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0], epilog=EXAMPLE,
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     parents=[repository_arguments("from the source")])
    parser.add_argument("source", help="checkpoint folder, Hugging Face encoder folder, or bundled:all-MiniLM-L6-v2")
    parser.add_argument("--quantize", choices=["int8"], default=None,
                        help="int8: static QDQ with calibration for CNN/MLP checkpoints, dynamic for encoders")
    parser.add_argument("--calibration", type=Path, default=None,
                        help=".npz with x (and y) for int8 calibration when the checkpoint's data cannot be reloaded")
    parser.add_argument("--max-batch-size", type=int, default=None, help="config.pbtxt max_batch_size (default 64; 32 for encoders)")
    return parser


def source_kind(source: str) -> str:
    """The kind of SOURCE, one of :data:`ONNX_KINDS`; anything else is refused with the fix.

    Raises:
        FileNotFoundError: SOURCE is not a folder (a mistyped path).
        ValueError: a folder without a config.json, a kind another verb exports (naming it), or an unknown kind
            (listing the known ones).
    """
    if source.startswith("bundled:"):
        return "huggingface-encoder"  # resolve_encoder names the bundled models if this one is not
    path = Path(source)
    known = sorted([*ONNX_KINDS, *OTHER_VERBS])
    if not path.is_dir():
        raise FileNotFoundError(f"source {source!r}: not found; expected a checkpoint folder, a Hugging Face "
                                "encoder folder or bundled:all-MiniLM-L6-v2")
    if (path / "adapter_config.json").is_file():
        kind = "finetune"
    elif (path / "config.json").is_file():
        try:
            config = json.loads((path / "config.json").read_text())
        except json.JSONDecodeError as exc:
            raise ValueError(f"source {source!r}: config.json is not JSON ({exc.msg})") from None
        kind = config.get("kind") if isinstance(config, dict) else None
        if kind is None and isinstance(config, dict) and "model_type" in config:
            kind = "huggingface-encoder"  # a transformers config records its model_type, not a veil kind
    else:
        raise ValueError(f"source {source!r}: expected a folder with config.json (its recorded kind: one of "
                         f"{known}), found none")
    if kind in OTHER_VERBS:
        raise ValueError(f"source {source!r}: a {kind!r} checkpoint is exported by `{OTHER_VERBS[kind]} {source} "
                         "--repo REPO --name NAME`, not by `veil export onnx`")
    if kind not in ONNX_KINDS:
        raise ValueError(f"source {source!r}: config.json kind: expected one of {known}, received {kind!r}")
    return kind


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    source = Path(args.source)
    batch = {} if args.max_batch_size is None else {"max_batch_size": args.max_batch_size}
    if source_kind(args.source) == "uldnet":
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
