"""Where the PolyResNet-20 loses its points on photos32: PolyNorm and PolyAct swapped one at a time for BatchNorm / ReLU.

Four nets of the photos32 ResNet-20 shape on the `--preset photos32` recipe, trained the same short way (seed 0,
--epochs, the preset's warm-up): PolyNorm + PolyAct (the polynomial net), BatchNorm + ReLU (its twin), and the
two mixes, built by swapping every PolyNorm for a BatchNorm2d of the same channels or every PolyAct for a ReLU
in the polynomial net. Two nets train side by side, one thread each (2 processes). Writes
docs/results/uldnet_ablation.json and the uldnet_ablation section of docs/results.md.

    python benchmarks/uldnet_ablation.py                        # 4 nets x 8 epochs: about 10 min on 2 cores
    python benchmarks/uldnet_ablation.py --epochs 2 --out /tmp/b # a smoke run
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from functools import partial

import torch
from common import argument_parser, command_line, environment, save_results
from torch import nn
from veil.training.uldnet import ModelConfig, TrainConfig, build_model, load_photos32, train_uldnet
from veil.training.uldnet.config import PHOTOS32_PRESETS
from veil.training.uldnet.polyact import PolyAct
from veil.training.uldnet.polynorm import PolyNorm

SECTION = "uldnet_ablation"
# name -> (swap PolyNorm for BatchNorm2d, swap PolyAct for ReLU)
VARIANTS = {"PolyNorm + PolyAct (the polynomial net)": (False, False), "PolyNorm + ReLU": (False, True),
            "BatchNorm + PolyAct": (True, False), "BatchNorm + ReLU (the twin)": (True, True)}


def swapped(config: ModelConfig, batchnorm: bool, relu: bool) -> nn.Module:
    """The polynomial net of ``config`` with every PolyNorm and / or PolyAct replaced by BatchNorm2d / ReLU."""
    model = build_model(config)
    for parent in list(model.modules()):
        for name, child in parent.named_children():
            if batchnorm and isinstance(child, PolyNorm):
                setattr(parent, name, nn.BatchNorm2d(child.num_features))
            elif relu and isinstance(child, PolyAct):
                setattr(parent, name, nn.ReLU())
    return model


def train_variant(name: str, epochs: int) -> dict:
    torch.set_num_threads(1)
    batchnorm, relu = VARIANTS[name]
    data = load_photos32()
    preset = PHOTOS32_PRESETS["resnet"]
    model_config = ModelConfig(input_shape=data.input_shape, num_classes=len(data.classes), **preset["model"])
    train_config = TrainConfig(**{**preset["train"], "epochs": epochs})
    cpu = time.process_time()
    result = train_uldnet(model_config, train_config, data, progress=False,
                          build=partial(swapped, batchnorm=batchnorm, relu=relu))
    return {"name": name, "batchnorm": batchnorm, "relu": relu, "test_accuracy": result.metrics["test_accuracy"],
            "val_accuracy": result.metrics["val_accuracy"], "final_train_loss": result.history[-1]["train_loss"],
            "cpu_seconds": round(time.process_time() - cpu, 1), "history": result.history,
            "model_config": model_config.to_dict(), "train_config": train_config.to_dict()}


def markdown(results: dict, command: str) -> str:
    env, rows = results["environment"], results["variants"]
    cfg = rows[0]["train_config"]
    lines = [
        "## Where the PolyResNet-20 loses its points on photos32 (issue 30)",
        "",
        f"Command: `{command}` — {env['date']}, {env['machine']}, torch {env['torch']}; seed 0; 1-min load "
        f"{env['load_1min'][0]} before, {env['load_1min'][1]} after. The photos32 ResNet-20 recipe "
        f"(lr {cfg['lr']}, {cfg['warmup_epochs']} warm-up epochs) cut to {cfg['epochs']} epochs; the polynomial "
        "net with every PolyNorm swapped for BatchNorm2d and / or every PolyAct for ReLU; two nets at a time, one "
        "thread each. Test accuracy of the best-validation epoch.",
        "",
        "| norm + activation | test acc % | val acc % | final train loss | CPU s |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r['name']} | {100 * r['test_accuracy']:.2f} | {100 * r['val_accuracy']:.2f} | "
                     f"{r['final_train_loss']:.3f} | {r['cpu_seconds']} |")
    acc = {r["name"]: 100 * r["test_accuracy"] for r in rows}
    names = list(VARIANTS)
    lines += ["", f"Swapping PolyNorm for BatchNorm (with ReLU): {acc[names[3]] - acc[names[1]]:+.2f} pts; swapping "
                  f"PolyAct for ReLU (with PolyNorm): {acc[names[1]] - acc[names[0]]:+.2f} pts; both: "
                  f"{acc[names[3]] - acc[names[0]]:+.2f} pts."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argument_parser(__doc__)
    parser.add_argument("--epochs", type=int, default=8, help="training epochs of every net (the preset's warm-up)")
    args = parser.parse_args(argv)
    load_before, start = os.getloadavg()[0], time.perf_counter()
    with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn")) as pool:
        rows = list(pool.map(partial(train_variant, epochs=args.epochs), VARIANTS))
    results = {"variants": rows, "environment": {
        **environment("1 thread per net, 2 processes"), "torch": torch.__version__,
        "wall_seconds": round(time.perf_counter() - start, 1),
        "load_1min": [round(load_before, 2), round(os.getloadavg()[0], 2)]}}
    save_results(args.out, SECTION, results, markdown(results, command_line(__file__, argv)))
    print(markdown(results, command_line(__file__, argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
