"""ULD-Net depth sweep on digits: polynomial CNNs from 8 to 68 CKKS levels at widths 4 / 8 / 16, and the 28-level commands.

Issue 30's digits targets, measured in one run: every polynomial CNN trains at every depth and width without
diverging at one recipe (lr 1e-2, 40 epochs: the top half of the stable range of docs/uldnet.md), and every
28-level PolyCNN a benchmark or doc trains reaches >= 96 % test accuracy with its stated command.

Depths: the plain stack of ``--preset digits-he --arch cnn`` (stem stride 2, conv, PolyNorm, PolyAct, conv,
PolyAct, flatten: 8 levels) and the residual PolyCNN of ``--preset digits --arch cnn`` with 0 ... 3 blocks per
stage (18, 28, 48, 68 levels); each at widths 4, 8 and 16, on ``--seeds``; two nets at a time, one thread each.
A run diverges when its loss turns non-finite (the trainer stops it) or its test accuracy stays within 5 points
of chance. The 28-level commands, seed 0: ``veil train uldnet --preset digits --arch cnn`` (width 32, the
preset's recipe) and the width-4 PolyCNN of ``python benchmarks/he_deep.py --width 4 --epochs 100 --lr 1e-2``
(he_deep's own ``checkpoint`` recipe). Writes docs/results/uldnet_depth.json, the uldnet_depth section of
docs/results.md and docs/img/uldnet_depth.png (test accuracy against levels, one line per width).

    python benchmarks/uldnet_depth.py                          # 3 seeds, about 15 min on 2 cores
    python benchmarks/uldnet_depth.py --quick --out /tmp/b     # a smoke run (2 epochs, width 4, 2 depths)
"""

from __future__ import annotations

import json
import multiprocessing
import os
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from functools import partial
from pathlib import Path

import torch
from common import argument_parser, command_line, environment, save_figure, save_results
from veil.training.uldnet import ModelConfig, TrainConfig, load_digits_preset, train_uldnet
from veil.training.uldnet.config import DIGITS_HE_PRESETS, DIGITS_PRESETS

SECTION = "uldnet_depth"
# name -> the model fields that set its depth (width comes from the sweep)
DEPTHS = {"plain stack (digits-he cnn)": {k: v for k, v in DIGITS_HE_PRESETS["cnn"]["model"].items()
                                          if k not in ("arch", "width")},
          **{f"residual, {n} block(s) per stage": {**{k: v for k, v in DIGITS_PRESETS["cnn"]["model"].items()
                                                      if k != "width"}, "depth": n} for n in range(4)}}
WIDTHS = (4, 8, 16)
RECIPE = {"lr": 1e-2, "epochs": 40}
RETRY_LR = 3e-3  # a diverged run is trained again at this lr, as the trainer's error advises ("lower --lr")
CHANCE_MARGIN = 0.05  # within this of chance (1 / classes), a finished run counts as diverged
TARGET_28 = 0.96
WARMUP = TrainConfig.__dataclass_fields__["warmup_epochs"].default  # the trainer's, cut to epochs - 1 in smoke runs


def train_one(job: tuple[str, int, int, float], epochs: int) -> dict:
    """Train one (depth, width, seed, lr) net of the sweep on one thread: accuracy, levels, divergence, CPU seconds."""
    torch.set_num_threads(1)
    name, width, seed, lr = job
    data = load_digits_preset()
    model_config = ModelConfig(arch="cnn", input_shape=data.input_shape, width=width, **DEPTHS[name])
    train_config = TrainConfig(**{**DIGITS_PRESETS["cnn"]["train"], "lr": lr, "epochs": epochs,
                                  "warmup_epochs": min(WARMUP, epochs - 1), "seed": seed})
    cpu = time.process_time()
    row = {"depth": name, "width": width, "seed": seed, "lr": lr, "model_config": model_config.to_dict(),
           "train_config": train_config.to_dict()}
    try:
        result = train_uldnet(model_config, train_config, data, progress=False)
    except FloatingPointError as exc:
        return {**row, "diverged": str(exc).split(";")[0], "cpu_seconds": round(time.process_time() - cpu, 1)}
    chance = 1 / len(set(data.y_train.tolist()))
    accuracy = result.metrics["test_accuracy"]
    return {**row, "levels": result.metrics["depth_total"], "test_accuracy": accuracy,
            "val_accuracy": result.metrics["val_accuracy"], "final_train_loss": result.history[-1]["train_loss"],
            "diverged": "at chance" if accuracy < chance + CHANCE_MARGIN else None,
            "cpu_seconds": round(time.process_time() - cpu, 1)}


def stated_commands(quick: bool) -> list[dict]:
    """The 28-level PolyCNNs that `veil train` and benchmarks/he_deep.py train, each by its own stated command."""
    import tempfile

    from common import run_child
    from he_deep import checkpoint

    rows, smoke = [], " [--quick: 2 epochs]" if quick else ""
    with tempfile.TemporaryDirectory(prefix="veil-uldnet-depth-") as work:
        cli = ["veil", "train", "uldnet", "--preset", "digits", "--arch", "cnn", "--out", f"{work}/cli", "--no-progress"]
        wall = run_child([sys.executable, "-m", "veil.cli", *cli[1:]] + (["--epochs", "2", "--warmup-epochs", "1"]
                                                                         if quick else []))[0]
        he_deep = [4, 2 if quick else 100, 1e-2]
        cpu = time.process_time()
        path = checkpoint(Path(work), "cnn", *he_deep)
        he_deep_cpu = time.process_time() - cpu
        for command, folder, seconds in (
                (" ".join(cli[:-3]) + smoke, Path(work) / "cli", f"{wall:.1f} s wall"),
                ("python benchmarks/he_deep.py --width 4 --epochs 100 --lr 1e-2 (its PolyCNN checkpoint)" + smoke, path,
                 f"{he_deep_cpu:.1f} s CPU")):
            metrics = json.loads((folder / "metrics.json").read_text())
            width = json.loads((folder / "config.json").read_text())["model"]["width"]
            rows.append({"command": command, "levels": metrics["depth_total"], "width": width,
                         "test_accuracy": metrics["test_accuracy"], "time": seconds})
    return rows


def summarize(runs: list[dict], retries: list[dict]) -> list[dict]:
    """One row per (depth, width): levels, test accuracy per seed, mean, divergences and their retries."""
    rows = []
    for name in DEPTHS:
        for width in sorted({r["width"] for r in runs}):
            cell = [r for r in runs if r["depth"] == name and r["width"] == width]
            if not cell:
                continue
            done = [r for r in cell if not r["diverged"]]  # a run left at chance is not averaged in
            rows.append({"depth": name, "width": width, "levels": next((r["levels"] for r in done), None),
                         "accuracies": [r["test_accuracy"] for r in done],
                         "mean": statistics.mean(r["test_accuracy"] for r in done) if done else None,
                         "diverged": [f"seed {r['seed']}: {r['diverged']}" for r in cell if r["diverged"]],
                         "retries": [f"seed {r['seed']}: " + (r["diverged"] if r["diverged"] else
                                                              f"{r['test_accuracy'] * 100:.1f}")
                                     for r in retries if r["depth"] == name and r["width"] == width]})
    return rows


def markdown(results: dict) -> str:
    env = results["environment"]
    lines = ["## ULD-Net depth sweep on digits (issue 30)", "",
             f"Command: `{results['command']}` — {env['date']}, {env['machine']}, torch {env['torch']}; seeds "
             f"{results['seeds']}; {env['wall_seconds']:.0f} s wall, 1-min load {env['load_1min'][0]} before, "
             f"{env['load_1min'][1]} after. Every net: lr {RECIPE['lr']:g}, {results['epochs']} epochs (AdamW, cosine, "
             "the digits preset otherwise); test accuracy of the best-validation epoch. A run diverges when its loss "
             f"turns non-finite or it ends within {CHANCE_MARGIN * 100:.0f} points of chance; a diverged run is "
             f"trained again at lr {RETRY_LR:g}, as the trainer's error advises (shown after it).", "",
             "| PolyCNN | levels | " + " | ".join(f"width {w}: test acc % (per seed)" for w in results["widths"]) + " |",
             "|---|---|" + "---|" * len(results["widths"])]
    for name in DEPTHS:
        cells = {r["width"]: r for r in results["summary"] if r["depth"] == name}
        if not cells:
            continue
        levels = next((c["levels"] for c in cells.values() if c["levels"] is not None), "-")
        text = []
        for w in results["widths"]:
            c = cells.get(w)
            text.append("-" if c is None else (f"{c['mean'] * 100:.1f} ({', '.join(f'{a * 100:.1f}' for a in c['accuracies'])})"
                                               if c["mean"] is not None else "")
                        + ("; **diverged**: " + ", ".join(c["diverged"]) if c and c["diverged"] else "")
                        + (f"; at lr {RETRY_LR:g}: " + ", ".join(c["retries"]) if c and c["retries"] else ""))
        lines.append(f"| {name} | {levels} | " + " | ".join(text) + " |")
    diverged = sum(len(r["diverged"]) for r in results["summary"])
    again = [r for r in results["retries"] if r["diverged"]]
    lines += ["", "The 28-level PolyCNNs that veil's commands train (seed 0):", "",
              "| command | levels | width | test acc % | time |", "|---|---|---|---|---|"]
    lines += [f"| `{r['command']}` | {r['levels']} | {r['width']} | {r['test_accuracy'] * 100:.2f} | {r['time']} |"
              for r in results["stated"]]
    low = [r for r in results["stated"] if r["test_accuracy"] < TARGET_28]
    lines += ["", "| target | met |", "|---|---|",
              f"| no divergence over the sweep ({len(results['runs'])} runs) | "
              + ("yes" if not diverged else f"**missed** ({diverged} diverged)") + " |",
              f"| every diverged run trains at lr {RETRY_LR:g} | "
              + ("-" if not results["retries"] else "yes" if not again else f"**no** ({len(again)} diverged again)") + " |",
              f"| every 28-level PolyCNN of a stated command >= {TARGET_28 * 100:.0f} % | "
              + ("yes" if not low else "**missed** (" + ", ".join(f"{r['test_accuracy'] * 100:.2f} %" for r in low) + ")")
              + " |", "", "![test accuracy against CKKS levels](img/uldnet_depth.png)"]
    return "\n".join(lines)


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    for width in results["widths"]:
        cells = sorted((r["levels"], r["mean"]) for r in results["summary"]
                       if r["width"] == width and r["mean"] is not None and r["levels"] is not None)
        ax.plot([c[0] for c in cells], [c[1] * 100 for c in cells], marker="o", label=f"width {width}")
    ax.set(xlabel="CKKS levels (multiplicative depth)", ylabel="test accuracy %, mean over\nthe seeds that did not diverge",
           title="Polynomial CNNs on digits, lr 1e-2")
    ax.grid(alpha=0.3)
    ax.legend()
    save_figure(fig, path)


def main(argv: list[str] | None = None) -> int:
    parser = argument_parser(__doc__)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--epochs", type=int, default=RECIPE["epochs"], help="epochs of every sweep net")
    parser.add_argument("--quick", action="store_true", help="smoke run: 2 epochs, width 4, two depths, one seed")
    args = parser.parse_args(argv)
    command = command_line(__file__, argv)
    widths, depths, seeds, epochs = WIDTHS, list(DEPTHS), args.seeds, args.epochs
    if args.quick:
        widths, depths, seeds, epochs = (4,), depths[:2], [0], 2
    jobs = [(name, width, seed, RECIPE["lr"]) for name in depths for width in widths for seed in seeds]
    load_before, start = os.getloadavg()[0], time.perf_counter()
    with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn")) as pool:
        runs = list(pool.map(partial(train_one, epochs=epochs), jobs))
        retries = list(pool.map(partial(train_one, epochs=epochs),
                                [(r["depth"], r["width"], r["seed"], RETRY_LR) for r in runs if r["diverged"]]))
    stated = stated_commands(args.quick)
    env = {**environment("1 thread per net, 2 processes"), "torch": torch.__version__,
           "wall_seconds": round(time.perf_counter() - start, 1),
           "load_1min": [round(load_before, 2), round(os.getloadavg()[0], 2)]}
    results = {"command": command, "seeds": seeds, "epochs": epochs, "widths": list(widths), "runs": runs,
               "retries": retries, "summary": summarize(runs, retries), "stated": stated, "environment": env}
    save_results(args.out, SECTION, results, markdown(results))
    plot(results, Path(args.out) / "img" / f"{SECTION}.png")
    print(markdown(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
