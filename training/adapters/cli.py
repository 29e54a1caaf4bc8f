"""`veil finetune`: fine-tune a pretrained encoder with an adapter (LoRA, PSOFT) on a templated task.

Examples:
    veil finetune --method lora --model bundled:all-MiniLM-L6-v2 --task sentiment --out runs/lora-sentiment
    veil finetune --method psoft --r 16 --alpha 16 --task topic --out runs/psoft-topic
    veil finetune --method probe --task sentiment      # frozen encoder, head only (the baseline)

The adapter is saved in the PEFT layout (adapter_config.json + adapter_model.safetensors, head in
modules_to_save); PSOFT also writes its exact rank-r LoRA export to OUT/as_lora. Metrics JSON goes to stdout,
the progress bar to stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from veil.config import atomic_dir

from .finetune import BUNDLED_MINILM, FinetuneConfig, build_classifier, train

EXAMPLE = """example:
  veil finetune --method lora --model bundled:all-MiniLM-L6-v2 --task sentiment --out runs/lora-sentiment
  veil finetune --method psoft --r 16 --alpha 16 --task topic --lr 5e-3 --out runs/psoft-topic
"""


def build_parser(prog: str = "veil finetune") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0], epilog=EXAMPLE,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=BUNDLED_MINILM,
                        help=f"base encoder: {BUNDLED_MINILM} or a local transformers folder (default: %(default)s)")
    parser.add_argument("--out", type=Path, default=None, help="output folder (default: runs/<method>-<task>)")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    FinetuneConfig.add_arguments(parser)
    return parser


def run(argv: list[str] | None = None) -> dict:
    """Parse, train and save; returns the metrics dict that ``main`` prints."""
    from .data import make_task

    args = build_parser().parse_args(argv)  # --help / usage errors raise SystemExit
    cfg = FinetuneConfig.from_args(args)
    task = make_task(cfg.task, (cfg.train_size, cfg.val_size, cfg.test_size), seed=cfg.seed)
    base, tokenizer = build_classifier(args.model, len(task.label_names), cfg.seed)
    adapter_cfg = cfg.adapter_config(len(task.label_names))
    if adapter_cfg is None:  # probe: frozen encoder, trainable head
        base.bert.requires_grad_(False)
        model = base
    else:
        from . import inject

        model = inject(base, adapter_cfg)
    metrics = {"method": cfg.method, "task": cfg.task, "labels": task.label_names,
               **train(model, tokenizer, task, cfg, progress=not args.no_progress)}
    out = args.out or Path("runs") / f"{cfg.method}-{cfg.task}"
    with atomic_dir(out) as tmp:
        if adapter_cfg is not None:
            from .checkpoint import write_files

            write_files(tmp, model.config.to_peft_dict(), model.adapter_state_dict())
            if hasattr(model, "lora_state_dict"):  # exact LoRA export (PSOFT)
                write_files(tmp / "as_lora", model.lora_config().to_peft_dict(), model.lora_state_dict())
        (tmp / "finetune.json").write_text(cfg.to_json())
        (tmp / "metrics.json").write_text(json.dumps(metrics, indent=2))
    return {"out": str(out), **metrics}


def main(argv: list[str] | None = None) -> int:
    """Run and print the metrics JSON; ``--help`` and usage errors return argparse's status instead of exiting."""
    try:
        metrics = run(argv)
    except SystemExit as exc:  # --help (0) or a usage error (2): the caller exits
        return exc.code if isinstance(exc.code, int) else 2
    print(json.dumps(metrics, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
