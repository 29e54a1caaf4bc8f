"""`veil compress`: run a compression recipe on a model with local calibration data; write the model and report.

MODEL is a `veil train lm` checkpoint folder (byte-level LM: calibration windows from the data's training part,
held-out perplexity on its fixed held-out part), or a sentence encoder (``bundled:all-MiniLM-L6-v2`` or a
transformers folder: calibration on half of the data's sentences, embedding cosine to the uncompressed model on
the other half). DATA is a local text file or ``bundled:pydoc_topics`` (Python's help topics).

The summary JSON goes to stdout; the per-module log goes to stderr; DIR receives model.safetensors,
config.json, report.json and report.md.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from veil.config import ConfigError

if TYPE_CHECKING:  # torch loads in the command that runs, never for --help or a usage error
    from torch import nn

    from .api import EvalFn
    from .calibration import Calibration

BUNDLED_TEXT = "bundled:pydoc_topics"

EXAMPLE = """example:
  veil train lm --preset tiny --steps 600 --out runs/lm
  cat > recipe.yaml <<'EOF'
  seed: 0
  stages:
    - method: saes_svd      # or svd_llm, svd
      ratio: 0.4            # remove 40 % of each factorised matrix's weights
      ignore: [lm_head]
  EOF
  veil compress runs/lm --recipe recipe.yaml --calibration bundled:pydoc_topics --out runs/lm-saes40
  veil compress bundled:all-MiniLM-L6-v2 --recipe recipe.yaml --calibration notes.txt --out runs/minilm-saes40
"""


def build_parser(prog: str = "veil compress") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0], epilog=EXAMPLE,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", help="a `veil train lm` checkpoint folder, bundled:all-MiniLM-L6-v2 or a "
                                      "transformers sentence-encoder folder")
    parser.add_argument("--recipe", required=True, type=Path, help="YAML or JSON recipe (docs/compress.md)")
    parser.add_argument("--calibration", required=True, help=f"a local text file or {BUNDLED_TEXT}")
    parser.add_argument("--out", required=True, type=Path, help="output folder (written atomically)")
    parser.add_argument("--num-sequences", type=int, default=32, help="calibration sequences (default 32)")
    parser.add_argument("--seq-len", type=int, default=128, help="tokens (bytes for an LM) per sequence (128)")
    parser.add_argument("--batch-size", type=int, default=8, help="sequences per calibration batch (8)")
    parser.add_argument("--eval-sequences", type=int, default=64, help="held-out sequences for metrics and drift (64)")
    parser.add_argument("--no-drift", action="store_true", help="skip the depth-wise drift table")
    parser.add_argument("--no-progress", action="store_true", help="no per-module lines on stderr")
    return parser


def _positive(args: argparse.Namespace) -> None:
    for name in ("num_sequences", "seq_len", "batch_size", "eval_sequences"):
        if getattr(args, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')}: expected >= 1, received {getattr(args, name)}")


def _is_lm_checkpoint(source: str) -> bool:
    config = Path(source) / "config.json"
    return config.is_file() and json.loads(config.read_text()).get("kind") == "lm"


def lm_workload(source: str, args: argparse.Namespace) -> tuple[nn.Module, Calibration, Calibration, EvalFn]:
    """A byte LM: calibration windows from the data's training part, perplexity on its held-out part."""
    import math

    from veil.training.lm import evaluate, load_lm, load_pydoc_topics, load_text_file
    from veil.training.lm.data import eval_blocks

    from .calibration import Calibration

    model, _ = load_lm(source)
    if args.calibration == BUNDLED_TEXT:
        corpus = load_pydoc_topics()
    elif not Path(args.calibration).is_file():
        raise FileNotFoundError(f"--calibration: expected an existing file or {BUNDLED_TEXT}, received "
                                f"{args.calibration!r}")
    else:
        corpus = load_text_file(args.calibration)
    cal = Calibration.from_bytes(corpus.train, args.seq_len, args.num_sequences, args.batch_size,
                                 source=f"{corpus.source}/train")
    blocks = eval_blocks(corpus.held_out, args.seq_len, args.eval_sequences)  # (N, T + 1)
    held = Calibration.from_tokens(blocks[:, :-1], args.batch_size, source=f"{corpus.source}/held_out")

    def eval_fn(m: nn.Module) -> dict[str, float]:
        loss = evaluate(m, blocks)
        return {"held_out_loss": loss, "held_out_perplexity": math.exp(loss)}

    return model, cal, held, eval_fn


def encoder_workload(source: str, args: argparse.Namespace) -> tuple[nn.Module, Calibration, Calibration, EvalFn]:
    """A sentence encoder: even sentences calibrate, odd ones measure the embedding cosine to the original."""
    from .calibration import Calibration
    from .workloads import embedding_cosine, minilm, minilm_sentences

    model, tokenizer = minilm(source)
    if args.calibration == BUNDLED_TEXT:
        cal_texts, held_texts = minilm_sentences(max(args.num_sequences, args.eval_sequences))
    else:
        path = Path(args.calibration)
        if not path.is_file():
            raise FileNotFoundError(f"--calibration: expected an existing file or {BUNDLED_TEXT}, received {str(path)!r}")
        texts = [p.strip() for p in path.read_text(encoding="utf-8", errors="replace").split("\n\n") if p.strip()]
        if len(texts) < 2:
            raise ConfigError(f"--calibration {str(path)!r}: expected at least 2 paragraphs (blank-line separated), "
                              f"received {len(texts)}")
        cal_texts, held_texts = texts[0::2], texts[1::2]
    cal = Calibration.from_texts(cal_texts[:args.num_sequences], tokenizer, args.batch_size, args.seq_len,
                                 source=f"{args.calibration}/even")
    held = Calibration.from_texts(held_texts[:args.eval_sequences], tokenizer, args.batch_size, args.seq_len,
                                  source=f"{args.calibration}/odd")
    reference = copy.deepcopy(model).eval()
    return model, cal, held, lambda m: embedding_cosine(reference, m, held)


def run(args: argparse.Namespace) -> dict[str, Any]:
    from .api import compress
    from .recipe import load_recipe

    _positive(args)
    recipe = load_recipe(args.recipe)  # refuse a bad recipe before loading anything heavy
    workload = lm_workload if _is_lm_checkpoint(args.model) else encoder_workload
    model, cal, held, eval_fn = workload(args.model, args)
    report = compress(model, recipe, cal, args.out, eval_fn=eval_fn, eval_data=held, drift=not args.no_drift,
                      progress=not args.no_progress)
    return {"out": str(args.out), "parameters": report["parameters"], "metrics": report.get("metrics"),
            "drift_last_block": report["drift"][-1] if report.get("drift") else None, "seconds": report["seconds"]}


def main(argv: list[str] | None = None) -> int:
    """Run and print the summary JSON; ``--help`` and usage errors return argparse's status instead of exiting."""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:  # --help (0) or a usage error (2): the caller exits
        return exc.code if isinstance(exc.code, int) else 2
    try:
        summary = run(args)
    except (ValueError, FileNotFoundError) as exc:
        print(f"veil compress: error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
