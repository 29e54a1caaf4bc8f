"""ULD-Net at 32x32 RGB (photos32): PolyResNet-20 and PolyViT against their ReLU+BN / LN+GELU twins and logistic regression.

One run on the bundled photos32 task (training/uldnet/photos.py), every model on its `--preset photos32`
recipe, the polynomial model and its standard-op twin on the same budget (epochs, lr, batch, seed). The
PolyResNet-20 is trained by the user's own command, `veil train uldnet --preset photos32 --arch resnet`, in a
child process, so its wall and CPU time are those of the default run; its checkpoint stays in
--checkpoint. Writes docs/results/uldnet_photos.json and the uldnet_photos section of docs/results.md.

Both ResNet-20s also train at every ``--resnet-lrs`` learning rate (the same budget otherwise), so the gap is
reported at each lr and with each model at the lr its validation accuracy picks (the mean over its last
``SETTLED_EPOCHS`` epochs: a single best epoch of a noisy curve picks a mid-schedule spike); the test set picks
nothing.

    nice python benchmarks/uldnet_photos.py                          # the full run (about 30 min on 2 idle cores)
    python benchmarks/uldnet_photos.py --quick --out /tmp/b          # a smoke run (2 epochs each)
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from common import argument_parser, command_line, environment, save_results
from veil.training.uldnet import ModelConfig, TrainConfig, load_photos32, train_uldnet
from veil.training.uldnet.config import PHOTOS32_PRESETS

ROOT = Path(__file__).resolve().parents[1]
SECTION = "uldnet_photos"
NAMES = {"resnet": "PolyResNet-20", "resnet-baseline": "ResNet-20 (ReLU + BatchNorm)", "vit": "PolyViT",
         "vit-baseline": "ViT (LayerNorm + GELU, softmax)", "logreg": "logistic regression (raw pixels)"}
QUICK = {"epochs": 2, "warmup_epochs": 1}
SETTLED_EPOCHS = 5  # an lr is chosen by the mean validation accuracy of a run's last epochs


def logistic_regression(data) -> dict:
    from sklearn.linear_model import LogisticRegression

    flat = lambda x: x.reshape(len(x), -1)  # noqa: E731
    start, cpu = time.perf_counter(), time.process_time()
    model = LogisticRegression(max_iter=300).fit(flat(data.x_train), data.y_train)
    return {"test_accuracy": float(model.score(flat(data.x_test), data.y_test)),
            "val_accuracy": float(model.score(flat(data.x_val), data.y_val)),
            "train_seconds": round(time.perf_counter() - start, 1), "cpu_seconds": round(time.process_time() - cpu, 1)}


def start_cli_resnet(checkpoint: Path, quick: bool) -> tuple[subprocess.Popen, list[str], float]:
    """Start `veil train uldnet --preset photos32 --arch resnet` in a child process (the user's default run)."""
    argv = [sys.executable, "-m", "veil.cli", "train", "uldnet", "--preset", "photos32", "--arch", "resnet",
            "--out", str(checkpoint), "--no-progress"]
    if quick:
        argv += ["--epochs", str(QUICK["epochs"]), "--warmup-epochs", str(QUICK["warmup_epochs"])]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, text=True), argv, time.perf_counter()


def finish_cli_resnet(child: subprocess.Popen, argv: list[str], start: float, checkpoint: Path) -> dict:
    """Wait for the child: its metrics, wall time and CPU time (user + system, from its rusage)."""
    out, _ = child.communicate()
    if child.returncode:
        raise RuntimeError(f"{' '.join(argv)} exited with status {child.returncode}")
    metrics = json.loads(out)
    metrics["wall_seconds"] = round(time.perf_counter() - start, 1)
    metrics["command"] = " ".join(["veil", *argv[3:]])
    metrics["history"] = json.loads((checkpoint / "metrics.json").read_text())["history"]
    return metrics


def train(arch: str, baseline: bool, data, quick: bool, lr: float | None = None) -> dict:
    preset = PHOTOS32_PRESETS[arch]
    model_config = ModelConfig(input_shape=data.input_shape, num_classes=len(data.classes), baseline=baseline,
                               **preset["model"])
    train_config = TrainConfig(**{**preset["train"], **(QUICK if quick else {}), **({"lr": lr} if lr else {})})
    cpu = time.process_time()
    result = train_uldnet(model_config, train_config, data, progress=False)
    return {**result.metrics, "cpu_seconds": round(time.process_time() - cpu, 1), "history": result.history,
            "model_config": model_config.to_dict(), "train_config": train_config.to_dict()}


def settled_val(history: list[dict]) -> float:
    """Mean validation accuracy of a run's last :data:`SETTLED_EPOCHS` epochs (what an lr is chosen by)."""
    return float(np.mean([h["val_accuracy"] for h in history[-SETTLED_EPOCHS:]]))


def run(checkpoint: Path, quick: bool, lrs: list[float]) -> dict:
    """The PolyResNet-20 CLI run alone first (its wall time is the default command's on an otherwise idle
    machine), then the other models one after another in this process, each with every core; then both
    ResNet-20s at every other lr of ``lrs`` (keys ``resnet@LR`` and ``resnet-baseline@LR``)."""
    data = load_photos32()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    resnet = finish_cli_resnet(*start_cli_resnet(checkpoint, quick), checkpoint)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    resnet["cpu_seconds"] = round(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime, 1)
    print("resnet done", file=sys.stderr, flush=True)
    models = {"logreg": logistic_regression(data)}
    for key, arch, baseline in (("resnet-baseline", "resnet", True), ("vit", "vit", False), ("vit-baseline", "vit", True)):
        models[key] = train(arch, baseline, data, quick)
        print(f"{key} done", file=sys.stderr, flush=True)
    models["resnet"] = resnet
    preset_lr = PHOTOS32_PRESETS["resnet"]["train"]["lr"]
    for lr in [lr for lr in lrs if lr != preset_lr]:
        for key, baseline in (("resnet", False), ("resnet-baseline", True)):
            models[f"{key}@{lr:g}"] = train("resnet", baseline, data, quick, lr)
            print(f"{key}@{lr:g} done", file=sys.stderr, flush=True)
    return {"data": data.describe(), "models": models}


def lr_sweep(models: dict) -> dict:
    """Per ResNet-20 and lr: test and settled validation accuracy; each model's validation-chosen lr; the gap
    (twin minus polynomial net, test points) at each lr and at the chosen ones."""
    preset_lr = PHOTOS32_PRESETS["resnet"]["train"]["lr"]
    runs: dict[str, dict[float, dict]] = {"resnet": {}, "resnet-baseline": {}}
    for key, m in models.items():
        base, _, lr = key.partition("@")
        if base in runs:
            runs[base][float(lr) if lr else preset_lr] = {"test": 100 * m["test_accuracy"],
                                                          "settled_val": 100 * settled_val(m["history"])}
    chosen = {k: max(r, key=lambda lr: r[lr]["settled_val"]) for k, r in runs.items()}
    gaps = {f"{lr:g}": runs["resnet-baseline"][lr]["test"] - runs["resnet"][lr]["test"]
            for lr in runs["resnet"] if lr in runs["resnet-baseline"]}
    return {"runs": {k: {f"{lr:g}": v for lr, v in r.items()} for k, r in runs.items()},
            "chosen_lr": {k: f"{lr:g}" for k, lr in chosen.items()}, "gap_at_lr": gaps,
            "gap_chosen": runs["resnet-baseline"][chosen["resnet-baseline"]]["test"] - runs["resnet"][chosen["resnet"]]["test"]}


def summarize(results: dict) -> dict:
    acc = {k: 100 * m["test_accuracy"] for k, m in results["models"].items()}
    resnet_s = results["models"]["resnet"]["wall_seconds"]
    sweep = lr_sweep(results["models"])
    return {
        "lr_sweep": sweep,
        "accuracy": {k: round(v, 2) for k, v in acc.items()},
        "resnet_gap": round(acc["resnet-baseline"] - acc["resnet"], 2),
        "vit_gap": round(acc["vit-baseline"] - acc["vit"], 2),
        "resnet_over_logreg": round(acc["resnet"] - acc["logreg"], 2),
        "vit_over_logreg": round(acc["vit"] - acc["logreg"], 2),
        "targets": {"PolyResNet-20 within 2 pts of its ReLU+BN twin": acc["resnet-baseline"] - acc["resnet"] <= 2,
                    **({f"PolyResNet-20 within 2 pts of its twin, each at its validation-chosen lr (polynomial "
                        f"{sweep['chosen_lr']['resnet']}, twin {sweep['chosen_lr']['resnet-baseline']})":
                        sweep["gap_chosen"] <= 2} if len(sweep["gap_at_lr"]) > 1 else {}),
                    "PolyViT within 3 pts of its LN+GELU twin": acc["vit-baseline"] - acc["vit"] <= 3,
                    "both >= 25 pts above logistic regression": min(acc["resnet"], acc["vit"]) - acc["logreg"] >= 25,
                    "logistic regression < 60 %": acc["logreg"] < 60,
                    "ReLU ResNet-20 < 97 % (the task is not saturated)": acc["resnet-baseline"] < 97,
                    "default PolyResNet-20 run <= 15 min": resnet_s <= 900},
    }


def markdown(results: dict, summary: dict, command: str) -> str:
    env, models = results["environment"], results["models"]
    sizes = results["data"]["sizes"]
    lines = [
        "## ULD-Net at 32x32 RGB: photos32 (issue 30)",
        "",
        f"Command: `nice {command}` — {env['date']}, {env['machine']}, torch {env['torch']}; one run, seed 0; "
        f"1-min load {env.get('load_1min', ['?', '?'])[0]} before, {env.get('load_1min', ['?', '?'])[1]} after.",
        f"photos32: {len(results['data']['classes'])} classes (one per bundled photo / texture), {sizes['train']} / "
        f"{sizes['val']} / {sizes['test']} crops from disjoint blocks of each image, each crop standardised on its own "
        "(docs/uldnet.md). Test accuracy of the best-validation epoch; each model on its `--preset photos32` recipe, "
        "the twin on the same budget. The runs go one after another, each with every core (the PolyResNet-20 first, "
        "alone); CPU s = user + system time of the run (up to cores x wall).",
        "",
        "| model | test acc % | val acc % | CKKS levels | params | epochs (warm-up) | lr | wall s | CPU s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    names = {**NAMES, **{k: f"{NAMES[k.partition('@')[0]]}, lr {k.partition('@')[2]}" for k in models if "@" in k}}
    for key, name in names.items():
        m = models[key]
        cfg = PHOTOS32_PRESETS.get(key.split("-")[0].partition("@")[0], {}).get("train", {})
        epochs = "-" if key == "logreg" else f"{m.get('train_config', cfg).get('epochs', cfg.get('epochs'))} " \
                                             f"({m.get('train_config', cfg).get('warmup_epochs', cfg.get('warmup_epochs'))})"
        lr = "-" if key == "logreg" else m.get("train_config", cfg).get("lr", cfg.get("lr"))
        depth = m.get("depth_total", "-") if key != "logreg" else "-"
        wall = m.get("wall_seconds", m["train_seconds"])
        lines.append(f"| {name} | {100 * m['test_accuracy']:.2f} | {100 * m['val_accuracy']:.2f} | "
                     f"{'not polynomial' if depth is None else depth} | {m.get('parameters', '-')} | {epochs} | {lr} | "
                     f"{wall} | {m['cpu_seconds']} |")
    lines += ["", f"Twin minus polynomial net (test accuracy): ResNet-20 {summary['resnet_gap']:+.2f} pts, ViT "
                  f"{summary['vit_gap']:+.2f} pts; polynomial net minus logistic regression: "
                  f"{summary['resnet_over_logreg']:+.2f} (ResNet) / {summary['vit_over_logreg']:+.2f} (ViT) pts.",
              f"The PolyResNet-20 row is the default command `{models['resnet']['command']}`, process start to "
              f"checkpoint: {models['resnet']['wall_seconds']} s wall."]
    sweep = summary["lr_sweep"]
    if len(sweep["gap_at_lr"]) > 1:
        rows = [f"| {lr} | {sweep['runs']['resnet'][lr]['test']:.2f} ({sweep['runs']['resnet'][lr]['settled_val']:.2f}) | "
                f"{sweep['runs']['resnet-baseline'][lr]['test']:.2f} ({sweep['runs']['resnet-baseline'][lr]['settled_val']:.2f})"
                f" | {gap:+.2f} |" for lr, gap in sweep["gap_at_lr"].items()]
        lines += ["", f"ResNet-20s at each lr, the same budget otherwise: test accuracy % (validation accuracy %, the "
                      f"mean of the last {SETTLED_EPOCHS} epochs, which chooses the lr):", "",
                  "| lr | PolyResNet-20 | ReLU + BN twin | twin minus polynomial |", "|---|---|---|---|", *rows, "",
                  f"Each at its validation-chosen lr (polynomial {sweep['chosen_lr']['resnet']}, twin "
                  f"{sweep['chosen_lr']['resnet-baseline']}): twin minus polynomial net {sweep['gap_chosen']:+.2f} pts."]
    lines += ["", "| target | met |", "|---|---|"]
    lines += [f"| {t} | {'yes' if ok else '**missed**'} |" for t, ok in summary["targets"].items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argument_parser(__doc__)
    parser.add_argument("--quick", action="store_true", help="2 epochs per model (a smoke run, not a result)")
    parser.add_argument("--resnet-lrs", default="0.003,0.01",
                        help="learning rates both ResNet-20s train at (the preset's is the default run's); "
                             "comma-separated (default %(default)s)")
    parser.add_argument("--checkpoint", type=Path, default=ROOT / "runs" / "photos32-resnet20",
                        help="where the PolyResNet-20 checkpoint of the default command goes")
    args = parser.parse_args(argv)
    start, load_before = time.perf_counter(), os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = Path(tmp) / "ck" if args.quick else args.checkpoint
        results = run(checkpoint, args.quick, [float(lr) for lr in args.resnet_lrs.split(",")])
    results["environment"] = {**environment(f"{torch.get_num_threads()} threads"), "torch": torch.__version__,
                              "numpy": np.__version__, "wall_seconds": round(time.perf_counter() - start, 1),
                              "load_1min": [round(load_before, 2), round(os.getloadavg()[0], 2)]}
    results["checkpoint"] = None if args.quick else str(args.checkpoint)
    (args.out / "results").mkdir(parents=True, exist_ok=True)  # the raw runs first: a report bug loses nothing
    (args.out / "results" / f"{SECTION}.raw.json").write_text(json.dumps(results, indent=1))
    summary = summarize(results)
    save_results(args.out, SECTION, {**results, "summary": summary}, markdown(results, summary, command_line(__file__, argv)))
    (args.out / "results" / f"{SECTION}.raw.json").unlink()  # saved in the report: the raw copy was only a safety net
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
