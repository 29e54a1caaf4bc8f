"""`veil train lm`: train a tiny Llama-style byte-level LM from scratch with any full-model veil optimizer.

Examples:
    veil train lm --optimizer alice --lr 0.02 --out runs/lm-alice
    veil train lm --preset micro --steps 200 --out runs/lm-micro
    veil train lm --text my_notes.txt --optimizer racs --lr 0.02 --steps 500

Results (metrics JSON) go to stdout; the progress bar goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from .config import PRESETS, LMModelConfig, LMTrainConfig

if TYPE_CHECKING:
    from .data import Corpus

EXAMPLE = """example:
  veil train lm --optimizer alice --lr 0.02 --out runs/lm-alice
  veil train lm --preset micro --steps 200 --text my_notes.txt --out runs/lm-notes
"""


def build_parser(prog: str = "veil train lm") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0], epilog=EXAMPLE,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", choices=sorted(PRESETS), default=None,
                        help="model size: micro 0.14 M, tiny 0.92 M, small 6.5 M parameters (default: tiny; "
                             "flags such as --hidden-size override it)")
    parser.add_argument("--text", type=Path, default=None,
                        help="train on this file (any text, read as bytes) instead of the bundled Python help topics")
    parser.add_argument("--out", type=Path, default=None, help="checkpoint folder (default: runs/lm-<optimizer>)")
    parser.add_argument("--config", type=Path, default=None,
                        help="start from a JSON file with 'model' and 'train' objects (e.g. a checkpoint's config.json)")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    LMModelConfig.add_arguments(parser)
    LMTrainConfig.add_arguments(parser, skip=("optimizer_args",))
    parser.add_argument("--optimizer-args", type=json.loads, default=None, metavar="JSON",
                        help='extra keyword arguments of the optimizer as a JSON object, e.g. \'{"rank": 16}\' '
                             "(alice's default: rank hidden_size/4, leading 0.3 rank)")
    return parser


def configs_from_args(args: argparse.Namespace) -> tuple[LMModelConfig, LMTrainConfig]:
    """Defaults, then --config, then --preset (tiny when neither is given), then the individual flags."""
    base = json.loads(args.config.read_text()) if args.config else {}
    model_base = dict(base.get("model", {}))
    if args.preset or not args.config:
        model_base.update(PRESETS[args.preset or "tiny"])
    extra = {} if args.optimizer_args is None else {"optimizer_args": args.optimizer_args}
    return (LMModelConfig.from_args(args, base=model_base),
            LMTrainConfig.from_args(args, base=base.get("train"), **extra))


def load_corpus(args: argparse.Namespace, held_out: float) -> Corpus:
    from .data import load_pydoc_topics, load_text_file

    return load_text_file(args.text, held_out) if args.text is not None else load_pydoc_topics(held_out)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)  # before torch: --help and usage errors stay instant
    from .trainer import save_lm, train_lm

    model_config, train_config = configs_from_args(args)
    corpus = load_corpus(args, train_config.held_out)
    out = args.out or Path("runs") / f"lm-{train_config.optimizer}"
    result = train_lm(model_config, train_config, corpus, progress=not args.no_progress)
    save_lm(result, out, corpus)
    print(json.dumps({"checkpoint": str(out), **result.metrics}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
