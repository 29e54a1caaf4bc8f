"""ULD-Net on the bundled digits: polynomial models vs the same networks with standard ops, side by side.

Trains PolyMLP, PolyCNN and PolyViT and their standard-op baselines with the same recipe, seeds and split,
then writes docs/results/uldnet_digits.json, the ULD-Net section of docs/results.md and a validation-
accuracy plot (docs/img/uldnet_digits_val.png).

    python benchmarks/uldnet_digits.py                 # 5 seeds, the full recipe (a few minutes on 2 cores)
    python benchmarks/uldnet_digits.py --seeds 0 --epochs 3 --out /tmp/b   # a quick smoke run
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from common import save_figure, save_results
from veil.training.uldnet import (
    ModelConfig,
    TrainConfig,
    load_digits_preset,
    multiplicative_depth,
    train_uldnet,
)
from veil.training.uldnet.config import DIGITS_PRESETS

from veil.progress import progress as progress_bar

ROOT = Path(__file__).resolve().parents[1]
SECTION = "uldnet_digits"


def run(seeds: list[int], epochs: int | None) -> dict:
    data = load_digits_preset()
    results: dict = {"seeds": seeds, "models": {}}
    jobs = [(arch, baseline) for arch in ("mlp", "cnn", "vit") for baseline in (False, True)]
    with progress_bar(total=len(jobs) * len(seeds), desc="uldnet digits", file=sys.stderr) as bar:
        for arch, baseline in jobs:
            preset = DIGITS_PRESETS[arch]
            model_config = ModelConfig(arch=arch, baseline=baseline, input_shape=data.input_shape, **preset["model"])
            runs = []
            for seed in seeds:
                quick = {"epochs": epochs, "warmup_epochs": 1} if epochs else {}
                train_config = TrainConfig(seed=seed, **{**preset["train"], **quick})
                result = train_uldnet(model_config, train_config, data, progress=False)
                runs.append({"seed": seed, **result.metrics, "history": result.history})
                bar.update()
            depth = multiplicative_depth(result.model)
            results["models"][f"{arch}{'-baseline' if baseline else ''}"] = {
                "model_config": model_config.to_dict(), "train_config": train_config.to_dict(), "runs": runs,
                "depth": depth.to_dict()}
    return results


def time_cli(out_dir: Path) -> float:
    """Wall time of the user's command `veil train uldnet --preset digits` (process start to checkpoint)."""
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "veil.cli", "train", "uldnet", "--preset", "digits", "--arch", "cnn",
                    "--out", str(out_dir), "--no-progress"], check=True, capture_output=True)
    return time.perf_counter() - start


def summarize(results: dict) -> list[dict]:
    rows = []
    for arch in ("mlp", "cnn", "vit"):
        poly, base = results["models"][arch], results["models"][f"{arch}-baseline"]
        acc = [r["test_accuracy"] * 100 for r in poly["runs"]]
        base_acc = [r["test_accuracy"] * 100 for r in base["runs"]]
        rows.append({
            "arch": arch, "poly_mean": statistics.mean(acc), "poly_min": min(acc), "base_mean": statistics.mean(base_acc),
            "gap": statistics.mean(base_acc) - statistics.mean(acc), "depth_total": poly["depth"]["total"],
            "max_op_levels": poly["depth"]["max_op_levels"], "params": poly["runs"][0]["parameters"],
            "train_s": statistics.mean(r["train_seconds"] for r in poly["runs"]),
            "base_train_s": statistics.mean(r["train_seconds"] for r in base["runs"]),
            "per_seed": [round(a, 2) for a in acc], "base_per_seed": [round(a, 2) for a in base_acc]})
    return rows


def markdown(results: dict, rows: list[dict], command: str) -> str:
    env = results["environment"]
    lines = [
        "## ULD-Net on digits (issue: foundation and ULD-Net)",
        "",
        f"Command: `{command}` — {env['date']}, {env['machine']}, torch {env['torch']}.",
        f"Seeds {results['seeds']}; fixed stratified split (1077 train / 360 val / 360 test, split seed 0); the same",
        "recipe for the polynomial model and its standard-op baseline (ReLU/GELU, BatchNorm/LayerNorm, softmax, MaxPool).",
        "Test accuracy of the best-validation epoch; depth = CKKS levels end to end (plaintext multiplies counted).",
        "",
        "| model | test acc % (mean) | per seed | baseline % (mean) | gap (pts) | depth total | max levels / operator | params | train s (poly / baseline) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    names = {"mlp": "PolyMLP", "cnn": "PolyCNN", "vit": "PolyViT"}
    for r in rows:
        lines.append(f"| {names[r['arch']]} | {r['poly_mean']:.2f} | {r['per_seed']} | {r['base_mean']:.2f} | {r['gap']:+.2f} | "
                     f"{r['depth_total']} | {r['max_op_levels']} | {r['params']} | {r['train_s']:.1f} / {r['base_train_s']:.1f} |")
    if "cli_preset_wall_seconds" in env:
        lines += ["", f"`veil train uldnet --preset digits --arch cnn`, process start to checkpoint: "
                      f"**{env['cli_preset_wall_seconds']} s** (target <= 120 s on 2 cores)."]
    lines += ["", "![validation accuracy per epoch](img/uldnet_digits_val.png)"]
    return "\n".join(lines)


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6), sharey=True)
    for ax, arch in zip(axes, ("mlp", "cnn", "vit"), strict=True):
        for key, style in ((arch, "-"), (f"{arch}-baseline", "--")):
            history = results["models"][key]["runs"][0]["history"]
            ax.plot([h["epoch"] for h in history], [100 * h["val_accuracy"] for h in history], style,
                    label="polynomial" if key == arch else "standard ops")
        warmup = results["models"][arch]["train_config"]["warmup_epochs"]
        ax.axvline(warmup - 0.5, color="grey", lw=0.8, ls=":", label="PolyNorm on (end of warm-up)")
        ax.set_title(arch)
        ax.set_xlabel("epoch")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("validation accuracy % (seed 0)")
    axes[0].set_ylim(50, 100)
    axes[0].legend()
    save_figure(fig, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__.split("\n\n", 2)[2],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--epochs", type=int, default=None, help="override the recipe's epochs (smoke runs)")
    parser.add_argument("--out", type=Path, default=ROOT / "docs", help="docs folder to write into")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    results = run(args.seeds, args.epochs)
    results["environment"] = {"date": time.strftime("%Y-%m-%d"), "machine": f"{platform.machine()}, {torch.get_num_threads()} threads",
                              "torch": torch.__version__, "threads": torch.get_num_threads(),
                              "wall_seconds": round(time.perf_counter() - start, 1)}
    if not args.epochs:
        with tempfile.TemporaryDirectory() as tmp:
            results["environment"]["cli_preset_wall_seconds"] = round(time_cli(Path(tmp) / "ck"), 1)
    rows = summarize(results)
    command = "python benchmarks/uldnet_digits.py" + (" " + " ".join(argv) if argv else "")
    plot(results, args.out / "img" / "uldnet_digits_val.png")
    save_results(args.out, SECTION, {**results, "summary": rows}, markdown(results, rows, command))
    print(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
