"""`veil demo`: the end-to-end tour, extended as capabilities land.

Today: train (or reuse) the digits PolyCNN and its standard-op baseline, reload both checkpoints from
disk, evaluate them on the held-out test split and print a summary table with the multiplicative depth.
A checkpoint is reused when its config.json matches the requested configs exactly.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

EXAMPLE = """example:
  veil demo                      # reuses runs/demo/* when present
  veil demo --retrain --epochs 20
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="veil demo", description=__doc__.splitlines()[0], epilog=EXAMPLE,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("runs/demo"), help="where the demo's checkpoints live")
    parser.add_argument("--retrain", action="store_true", help="train again even if matching checkpoints exist")
    parser.add_argument("--epochs", type=int, default=None, help="training epochs (default: the trainer's)")
    parser.add_argument("--seed", type=int, default=0, help="training seed")
    parser.add_argument("--no-baseline", action="store_true", help="skip the standard-op baseline")
    parser.add_argument("--no-progress", action="store_true", help="hide progress bars")
    return parser


def _train_or_reuse(path: Path, model_config, train_config, data, retrain: bool, progress: bool) -> tuple[str, float]:
    """Make sure ``path`` holds a checkpoint of exactly these configs; returns (status, seconds spent)."""
    from veil.training.uldnet import save_uldnet, train_uldnet

    config_file = path / "config.json"
    if not retrain and config_file.is_file():
        saved = json.loads(config_file.read_text())
        if saved.get("model") == model_config.to_dict() and saved.get("train") == train_config.to_dict():
            return "reused", 0.0
    start = time.perf_counter()
    save_uldnet(train_uldnet(model_config, train_config, data, progress=progress), path, data)
    return "trained", time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    from veil.training.uldnet import (
        ModelConfig,
        TrainConfig,
        load_digits_preset,
        load_uldnet,
        multiplicative_depth,
    )
    from veil.training.uldnet.config import DIGITS_PRESETS
    from veil.training.uldnet.trainer import accuracy

    args = build_parser().parse_args(argv)
    data = load_digits_preset()
    preset = DIGITS_PRESETS["cnn"]
    train_config = TrainConfig(seed=args.seed, **{**preset["train"], **({"epochs": args.epochs} if args.epochs else {})})
    polycnn = ModelConfig(arch="cnn", input_shape=data.input_shape, **preset["model"])
    runs = [("PolyCNN (ULD-Net)", args.out / "polycnn", polycnn)]
    if not args.no_baseline:
        runs.append(("CNN baseline (ReLU/BN/MaxPool)", args.out / "cnn-baseline", polycnn.replace(baseline=True)))
    rows = []
    for label, path, model_config in runs:
        status, seconds = _train_or_reuse(path, model_config, train_config, data, args.retrain, not args.no_progress)
        model, _ = load_uldnet(path)
        depth = multiplicative_depth(model)
        rows.append((label, accuracy(model, data.x_test, data.y_test), sum(p.numel() for p in model.parameters()),
                     depth.total, depth.max_op_levels, status, seconds))

    header = f"{'model':<32} {'test acc':>8} {'params':>8} {'depth':>6} {'max/op':>6}  {'checkpoint':<10} {'train s':>7}"
    print(f"\nveil demo: digits ({len(data.y_test)} held-out test images), checkpoints under {args.out}\n")
    print(header)
    print("-" * len(header))
    for label, acc, params, total, per_op, status, seconds in rows:
        fmt = lambda v: "n/a" if v is None else str(v)  # noqa: E731
        print(f"{label:<32} {100 * acc:>7.2f}% {params:>8} {fmt(total):>6} {fmt(per_op):>6}  {status:<10} {seconds:>7.1f}")
    print("\ndepth = CKKS levels consumed end to end (n/a: not polynomial, cannot run encrypted)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
