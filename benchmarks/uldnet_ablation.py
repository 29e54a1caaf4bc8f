"""Where the PolyResNet-20 loses its points on photos32: PolyNorm and PolyAct swapped one at a time for BatchNorm / ReLU.

Nets of the photos32 ResNet-20 shape on the `--preset photos32` recipe, trained the same short way (seed 0,
--epochs, the preset's warm-up): PolyNorm + PolyAct (the polynomial net), BatchNorm + ReLU (its twin), the two
mixes, the exact per-sample LayerNorm and a 4-group GroupNorm in PolyNorm's place (with ReLU: how much is the
per-sample axis, how much the polynomial), and the polynomial net with one recipe change (PolyAct dropout,
weight-standardized first convs, larger shifts; the twin with larger shifts too; each channel standardized before
PolyNorm's per-sample statistics, PolyNormConfig.channel_prenorm, which the preset now has: every other row is
built without it, so the rows keep the meaning they were measured with). Two nets train side by side, one
thread each (2 processes). Writes docs/results/uldnet_ablation.json and the uldnet_ablation section of
docs/results.md; `--variants` trains some and keeps the previous run's other rows (marked).

    python benchmarks/uldnet_ablation.py                        # 11 nets x 8 epochs: about 25 min on 2 cores
    python benchmarks/uldnet_ablation.py --variants "PolyNorm + ReLU" --epochs 2 --out /tmp/b  # a smoke run
"""

from __future__ import annotations

import json
import multiprocessing
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from functools import partial
from pathlib import Path
from typing import NamedTuple

import torch
from common import argument_parser, command_line, environment, save_results
from torch import nn
from torch.nn.utils import parametrize
from veil.training.uldnet import ModelConfig, TrainConfig, build_model, load_photos32, train_uldnet
from veil.training.uldnet.config import PHOTOS32_PRESETS
from veil.training.uldnet.models import PreActBlock
from veil.training.uldnet.polyact import PolyAct
from veil.training.uldnet.polynorm import PolyNorm

SECTION = "uldnet_ablation"


class Variant(NamedTuple):
    """One net of the ablation: what replaces PolyNorm / PolyAct, and what changes in the recipe."""

    norm: str = "polynorm"  # polynorm | batchnorm | layernorm (exact, per sample: GroupNorm(1, C)) | groupnorm4
    act: str = "polyact"  # polyact | relu
    dropout: float = 0.0  # PolyAct's dropout (he.md §1.4; the precursor code used 0.2)
    standardize_conv1: bool = False  # weight standardization (Qiao et al. 2019) of every block's first conv
    shift: int = 1  # the recipe's random shift in pixels (CIFAR's pad-4 crop: 4)
    prenorm: bool = False  # PolyNormConfig.channel_prenorm (the preset's since this ablation found it)


VARIANTS = {
    "PolyNorm + PolyAct (the polynomial net)": Variant(),
    "PolyNorm + ReLU": Variant(act="relu"),
    "BatchNorm + PolyAct": Variant(norm="batchnorm"),
    "BatchNorm + ReLU (the twin)": Variant(norm="batchnorm", act="relu"),
    "exact per-sample LayerNorm + ReLU": Variant(norm="layernorm", act="relu"),
    "per-sample GroupNorm (4 groups) + ReLU": Variant(norm="groupnorm4", act="relu"),
    "PolyNorm + PolyAct, PolyAct dropout 0.1": Variant(dropout=0.1),
    "PolyNorm + PolyAct, PolyAct dropout 0.2": Variant(dropout=0.2),
    "PolyNorm + PolyAct, standardized first convs": Variant(standardize_conv1=True),
    "PolyNorm + PolyAct, shifts up to 4 px": Variant(shift=4),
    "BatchNorm + ReLU (the twin), shifts up to 4 px": Variant(norm="batchnorm", act="relu", shift=4),
    "channel-standardized PolyNorm + PolyAct (--norm-channel-prenorm)": Variant(prenorm=True),
}
NORMS = {"batchnorm": nn.BatchNorm2d, "layernorm": partial(nn.GroupNorm, 1), "groupnorm4": partial(nn.GroupNorm, 4)}


class _Standardized(nn.Module):
    """Weight standardization as a parametrization: each output channel's weights at mean 0, variance 1."""

    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        var, mean = torch.var_mean(weight, dim=(1, 2, 3), keepdim=True, correction=0)
        return (weight - mean) / torch.sqrt(var + 1e-5)


def swapped(config: ModelConfig, variant: Variant) -> nn.Module:
    """The polynomial net of ``config`` with every PolyNorm / PolyAct replaced as ``variant`` says."""
    model = build_model(config)
    for parent in list(model.modules()):
        for name, child in parent.named_children():
            if variant.norm != "polynorm" and isinstance(child, PolyNorm):
                setattr(parent, name, NORMS[variant.norm](child.num_features))
            elif variant.act == "relu" and isinstance(child, PolyAct):
                setattr(parent, name, nn.ReLU())
            elif variant.dropout and isinstance(child, PolyAct):
                child.dropout = nn.Dropout(variant.dropout)
    if variant.standardize_conv1:
        for block in model.modules():
            if isinstance(block, PreActBlock):
                parametrize.register_parametrization(block.conv1, "weight", _Standardized())
    return model


def train_variant(name: str, epochs: int) -> dict:
    torch.set_num_threads(1)
    variant = VARIANTS[name]
    data = load_photos32()
    preset = PHOTOS32_PRESETS["resnet"]
    model = {**preset["model"], "norm": {**preset["model"]["norm"], "channel_prenorm": variant.prenorm}}
    model_config = ModelConfig(input_shape=data.input_shape, num_classes=len(data.classes), **model)
    train_config = TrainConfig(**{**preset["train"], "epochs": epochs, "shift": variant.shift})
    cpu = time.process_time()
    result = train_uldnet(model_config, train_config, data, progress=False, build=partial(swapped, variant=variant))
    return {"name": name, "variant": variant._asdict(), "test_accuracy": result.metrics["test_accuracy"],
            "val_accuracy": result.metrics["val_accuracy"], "final_train_loss": result.history[-1]["train_loss"],
            "cpu_seconds": round(time.process_time() - cpu, 1), "history": result.history,
            "model_config": model_config.to_dict(), "train_config": train_config.to_dict()}


def markdown(results: dict, command: str) -> str:
    env, rows = results["environment"], results["variants"]
    cfg = rows[0]["train_config"]
    carried = sorted({(r["run"]["command"], r["run"]["date"]) for r in rows if r["run"]["command"] != command})
    lines = [
        "## Where the PolyResNet-20 loses its points on photos32 (issue 30)",
        "",
        f"Command: `{command}` — {env['date']}, {env['machine']}, torch {env['torch']}; seed 0; 1-min load "
        f"{env['load_1min'][0]} before, {env['load_1min'][1]} after. The photos32 ResNet-20 recipe "
        f"(lr {cfg['lr']}, {cfg['warmup_epochs']} warm-up epochs) cut to {cfg['epochs']} epochs; the polynomial "
        "net with every PolyNorm swapped for another normalization (BatchNorm2d; the exact per-sample LayerNorm over "
        "C, H, W, i.e. GroupNorm(1, C), PolyNorm's own axes; GroupNorm with 4 groups) and / or every PolyAct for "
        "ReLU, or one change to the recipe; two nets at a time, one thread each (deterministic: a rerun gives the "
        "same figures). Test accuracy of the best-validation epoch."
        + "".join(f" Rows marked [{i}] are carried over from `{c}` ({d}), not measured in this run."
                  for i, (c, d) in enumerate(carried, 1)),
        "",
        "| variant | test acc % | val acc % | final train loss | CPU s |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        run = (r["run"]["command"], r["run"]["date"])
        mark = f" [{carried.index(run) + 1}]" if run in carried else ""
        lines.append(f"| {r['name']}{mark} | {100 * r['test_accuracy']:.2f} | {100 * r['val_accuracy']:.2f} | "
                     f"{r['final_train_loss']:.3f} | {r['cpu_seconds']} |")
    acc = {r["name"]: 100 * r["test_accuracy"] for r in rows}

    def delta(a: str, b: str) -> str:
        return f"{acc[a] - acc[b]:+.2f}" if a in acc and b in acc else "not measured"

    poly, norm_relu, twin, layer_relu, prenorm = (list(VARIANTS)[i] for i in (0, 1, 3, 4, -1))
    lines += ["", f"Swapping PolyNorm for BatchNorm (with ReLU): {delta(twin, norm_relu)} pts; swapping PolyAct for "
                  f"ReLU (with PolyNorm): {delta(norm_relu, poly)} pts; both: {delta(twin, poly)} pts. PolyNorm "
                  f"against the exact per-sample LayerNorm it approximates (both with ReLU): "
                  f"{delta(norm_relu, layer_relu)} pts; BatchNorm against that LayerNorm: {delta(twin, layer_relu)} "
                  "pts: the points go with the per-sample axis (the one the paper needs, he.md §1.2), not with the "
                  "polynomial.", "",
              f"Standardizing each channel before the per-sample statistics (PolyNormConfig.channel_prenorm, free "
              f"under HE): {delta(prenorm, poly)} pts over the polynomial net, {delta(prenorm, twin)} pts against the "
              f"twin."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argument_parser(__doc__)
    parser.add_argument("--epochs", type=int, default=8, help="training epochs of every net (the preset's warm-up)")
    parser.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS), metavar="NAME",
                        help="the nets to train (default: all); the other rows of the previous run are kept, marked "
                             "as carried over")
    args = parser.parse_args(argv)
    command = command_line(__file__, argv)
    previous_path = Path(args.out) / "results" / f"{SECTION}.json"
    previous = json.loads(previous_path.read_text()) if previous_path.exists() else {"variants": []}
    old_run = {"command": previous.get("command", "python benchmarks/uldnet_ablation.py"),
               "date": previous.get("environment", {}).get("date")}
    load_before, start = os.getloadavg()[0], time.perf_counter()
    with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn")) as pool:
        fresh = {r["name"]: r for r in pool.map(partial(train_variant, epochs=args.epochs), args.variants)}
    env = {**environment("1 thread per net, 2 processes"), "torch": torch.__version__,
           "wall_seconds": round(time.perf_counter() - start, 1),
           "load_1min": [round(load_before, 2), round(os.getloadavg()[0], 2)]}
    for row in fresh.values():
        row["run"] = {"command": command, "date": env["date"]}
    kept = {r["name"]: {**r, "run": r.get("run", old_run)} for r in previous["variants"]
            if r["name"] in VARIANTS and r["name"] not in fresh and r["train_config"]["epochs"] == args.epochs}
    rows = [fresh.get(name) or kept[name] for name in VARIANTS if name in fresh or name in kept]
    results = {"command": command, "variants": rows, "environment": env}
    save_results(args.out, SECTION, results, markdown(results, command))
    print(markdown(results, command))
    return 0


if __name__ == "__main__":
    sys.exit(main())
