"""`veil finetune`: fine-tune a pretrained encoder with any registered adapter method on a bundled workload.

Methods: lora, psoft, mtlora, e2lora, loramixer, vapt, and probe (frozen encoder, head only — the baseline).
Workloads: --model bundled:all-MiniLM-L6-v2 with a templated text task (sentiment, number, topic), or
--model vit-digits with --task digits-5to9 (a tiny ViT pre-trained on digits 0-4, adapted to 5-9; probe, lora,
vapt). vapt is ViT-only. Method options are generated flags (--<method>-<field>, e.g. --mtlora-num-experts) or
--config JSON (the method config's fields).

The adapter is saved in the PEFT layout (adapter_config.json + adapter_model.safetensors, head in
modules_to_save); PSOFT and E2LoRA also write their exact plain-LoRA export to OUT/as_lora, a digits run the
pre-trained ViT to OUT/base; a text run's README.md says how to load its LoRA in peft (peft_base). Metrics JSON goes to stdout, the progress bar to stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from veil.atomic import atomic_dir
from veil.config import ConfigError

from .finetune_config import BUNDLED_MINILM, MINILM_HUB_ID, OPTIMIZER_LR, FinetuneConfig
from .workloads import (
    DIGITS_TASK,
    VIT_DIGITS,
    adapter_config,
    add_method_arguments,
    e2lora_plan,
    save_adapter,
)

EXAMPLE = """example:
  veil finetune --method lora --model bundled:all-MiniLM-L6-v2 --task sentiment --out runs/lora-sentiment
  veil finetune --method psoft --r 16 --alpha 16 --task topic --lr 5e-3 --out runs/psoft-topic
  veil finetune --method e2lora --task number --out runs/e2lora-number
  veil finetune --method mtlora --mtlora-num-experts 4 --mtlora-block-adapter-type both --task sentiment
  veil finetune --method loramixer --config '{"num_experts": 4, "routing": "soft"}' --task topic
  veil finetune --method vapt --model vit-digits --task digits-5to9 --vapt-num-tokens 4
  veil finetune --method probe --task sentiment      # frozen encoder, head only (the baseline)
"""
VIT_METHODS = ("probe", "lora", "vapt")
DIGITS_DEFAULTS = {"lr": 1e-2, "epochs": 30, "batch_size": 64, "weight_decay": 1e-4}


def build_parser(prog: str = "veil finetune") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, usage=f"{prog} --method METHOD [--model MODEL] --task TASK [options]", description="\n\n".join(__doc__.split("\n\n")[:2]), epilog=EXAMPLE,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None,
                        help=f"base model: {BUNDLED_MINILM} or a local transformers folder (text tasks), "
                             f"{VIT_DIGITS} ({DIGITS_TASK}); default: the task's")
    parser.add_argument("--out", type=Path, default=None, help="output folder (default: runs/<method>-<task>)")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    FinetuneConfig.add_arguments(parser)
    add_method_arguments(parser)
    return parser


def check_workload(parser: argparse.ArgumentParser, cfg: FinetuneConfig, model: str) -> None:
    """Refuse method/model/task combinations that have no workload (exit 2 with the fix)."""
    digits = cfg.task == DIGITS_TASK
    if cfg.method == "vapt" and not digits:
        parser.error(f"--method vapt: VAPT inserts prompt tokens after the CLS token of vision-transformer blocks "
                     f"and is ViT-only; it cannot adapt the MiniLM text task {cfg.task!r}. "
                     f"Use --model {VIT_DIGITS} --task {DIGITS_TASK}")
    if digits and model != VIT_DIGITS:
        parser.error(f"--task {DIGITS_TASK}: expected --model {VIT_DIGITS} (the tiny ViT), received {model!r}")
    if not digits and model == VIT_DIGITS:
        parser.error(f"--model {VIT_DIGITS}: expected --task {DIGITS_TASK}, received {cfg.task!r}")
    if digits and cfg.optimizer != "adamw":
        parser.error(f"--optimizer {cfg.optimizer}: the {DIGITS_TASK} workload trains with adamw; the LoRA-pair "
                     "optimizers run on the text tasks (sentiment, number, topic)")
    if digits and cfg.method not in VIT_METHODS:
        parser.error(f"--method {cfg.method}: the {DIGITS_TASK} ViT workload supports {', '.join(VIT_METHODS)}; "
                     f"use a text task (sentiment, number, topic) for {cfg.method}")


def run(argv: list[str] | None = None) -> dict:
    """Parse, train and save; returns the metrics dict that ``main`` prints."""
    parser = build_parser()
    args = parser.parse_args(argv)  # --help / usage errors raise SystemExit
    try:
        cfg = FinetuneConfig.from_args(args)
        if args.lr is None:  # the optimizer's own default (AdamW's is the field default)
            cfg = cfg.replace(lr=OPTIMIZER_LR[cfg.optimizer])
    except ConfigError as exc:
        parser.error(str(exc))
    model_name = args.model or (VIT_DIGITS if cfg.task == DIGITS_TASK else BUNDLED_MINILM)
    check_workload(parser, cfg, model_name)
    from .. import distributed  # torch: imported once the command runs (the parser needs none of it)
    from .interop import README, model_card

    runner = run_digits if cfg.task == DIGITS_TASK else run_text
    distributed.setup()  # under torchrun: DDP over --nproc_per_node processes (training/distributed.py)
    model, metrics, extra, cfg = runner(parser, args, cfg, model_name)  # cfg: with the workload's defaults
    out = args.out or Path("runs") / f"{cfg.method}-{cfg.task}"
    if not distributed.is_main():  # one checkpoint per job: rank 0 writes it
        return {"out": str(out), **metrics}
    with atomic_dir(out) as tmp:
        if cfg.method != "probe":
            save_adapter(tmp, model)
        for name, base in extra.items():
            _save_quietly(base, tmp / name)
        (tmp / "finetune.json").write_text(cfg.to_json())
        source = MINILM_HUB_ID if model_name == BUNDLED_MINILM else model_name
        card = None if cfg.task == DIGITS_TASK else model_card(cfg.method, cfg.task, metrics["labels"], source)
        if card is not None:  # which base to load the LoRA onto in peft (interop.py)
            (tmp / README).write_text(card)
        (tmp / "metrics.json").write_text(json.dumps(metrics, indent=2))
    return {"out": str(out), **metrics}


def make_adapter_config(parser: argparse.ArgumentParser, args, cfg: FinetuneConfig, base_name: str):
    try:
        return adapter_config(cfg, args, base_name, vit=cfg.task == DIGITS_TASK)
    except (ConfigError, ValueError, json.JSONDecodeError) as exc:
        parser.error(f"--method {cfg.method}: {exc}")


def inject_or_exit(parser: argparse.ArgumentParser, base, adapter_cfg, method: str):
    from . import inject

    try:
        return inject(base, adapter_cfg)
    except (ConfigError, ValueError) as exc:  # e.g. targets that match nothing in this model
        parser.error(f"--method {method}: cannot adapt this model: {exc}")


def run_text(parser: argparse.ArgumentParser, args, cfg: FinetuneConfig, model_name: str):
    """MiniLM (or a local encoder) + mean-pool head on a templated task."""
    from .data import make_task
    from .finetune import build_classifier, make_batches, train

    task = make_task(cfg.task, (cfg.train_size, cfg.val_size, cfg.test_size), seed=cfg.seed)
    base, tokenizer = build_classifier(model_name, len(task.label_names), cfg.seed)
    adapter_cfg = make_adapter_config(parser, args, cfg, MINILM_HUB_ID if model_name == BUNDLED_MINILM else model_name)
    if adapter_cfg is None:  # probe: frozen encoder, trainable head
        base.bert.requires_grad_(False)
        model = base
    else:
        if cfg.method == "e2lora":  # the planning pass: one gradient probe on the first training batch
            batch = make_batches(tokenizer, task.train.texts, task.train.labels, cfg, shuffle_seed=cfg.seed)[0]
            try:
                adapter_cfg = e2lora_plan(base, adapter_cfg, batch,
                                          lambda m, b: m(b["input_ids"], b["attention_mask"]))
            except ValueError as exc:
                parser.error(f"--method e2lora: planning pass failed: {exc}")
        model = inject_or_exit(parser, base, adapter_cfg, cfg.method)
    metrics = {"method": cfg.method, "task": cfg.task, "labels": task.label_names,
               **train(model, tokenizer, task, cfg, progress=not args.no_progress)}
    if cfg.method == "e2lora":
        metrics["share_intervals"] = adapter_cfg.share_intervals
    return model, metrics, {}, cfg


def _save_quietly(model, folder: Path) -> None:
    """``model.save_pretrained(folder)`` without transformers' "Writing model shards" tqdm bar, which writes ``\\r``
    updates into a log (issue 33.3; the walk found it in `veil finetune --task digits-5to9`'s stderr)."""
    from transformers.utils import logging as hf_logging

    shown = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        model.save_pretrained(folder)
    finally:
        if shown:
            hf_logging.enable_progress_bar()


def run_digits(parser: argparse.ArgumentParser, args, cfg: FinetuneConfig, model_name: str):
    """The tiny ViT pre-trained on digits 0-4, adapted to 5-9 (new head) with ``cfg.method``."""
    import copy

    from .workloads import build_vit_digits, train_digits

    base, info = build_vit_digits(cfg, progress=not args.no_progress)
    extra = {"base": copy.deepcopy(base)}  # the pre-trained backbone (fresh head) the adapter needs
    adapter_cfg = make_adapter_config(parser, args, cfg, model_name)
    if adapter_cfg is None:  # probe: frozen backbone, trainable head
        base.requires_grad_(False)
        base.classifier.requires_grad_(True)
        model = base
    else:
        model = inject_or_exit(parser, base, adapter_cfg, cfg.method)
    # the digits workload's own defaults (vapt/digits.py) unless given on the command line
    given = {k: getattr(args, k) for k in DIGITS_DEFAULTS if getattr(args, k) is not None}
    cfg = cfg.replace(**{**DIGITS_DEFAULTS, **given})
    metrics = {"method": cfg.method, "task": cfg.task, "labels": [str(d) for d in range(5, 10)], **info,
               **train_digits(model, cfg, cfg.lr, progress=not args.no_progress)}
    return model, metrics, extra, cfg


def main(argv: list[str] | None = None) -> int:
    """Run and print the metrics JSON; ``--help`` and usage errors return argparse's status instead of exiting."""
    try:
        metrics = run(argv)
    except SystemExit as exc:  # --help (0) or a usage error (2): the caller exits
        return exc.code if isinstance(exc.code, int) else 2
    from .. import distributed

    if distributed.is_main():
        print(json.dumps(metrics, indent=2))
    distributed.teardown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
