"""AdamW vs RACS vs Alice (and every other full-model veil optimizer) on the `veil train lm` byte-level Llama LM.

Gong, Scetbon, Ma, Meeds, "Towards Efficient Optimizer Design for LLM via Structured Fisher Approximation with a
Low-Rank Extension" (ICLR 2026): on LLaMA/C4, RACS beats Adam at ~40 % of its optimizer memory and Alice reaches
Adam's final perplexity in ~2x fewer steps. Here the same seed, text (pydoc topics, fixed held-out split), model
(tiny preset, 0.92 M parameters) and schedule (10 % warm-up, cosine to 10 %) are used for every optimizer; each
gets its lr from a small sweep, picked by the lowest final *training* loss (mean of the last 10 % of steps), so
the held-out text never chooses anything. Targets: Alice reaches AdamW's final held-out loss in <= 0.6x the
steps; RACS ends within 5 % of AdamW's held-out loss (or below it); optimizer state <= 1/2 of Adam's. Writes
docs/results/optim_lm.json, docs/img/optim_lm_loss.png and the optim_lm section of docs/results.md.

    python benchmarks/optim_lm.py            # 3 lrs x each optimizer, 300 steps (17 min measured on 2 shared cores)
    python benchmarks/optim_lm.py --quick --out /tmp/docs   # smoke: micro preset, 30 steps, one lr each
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import torch
from veil.training.lm import PRESETS, LMModelConfig, LMTrainConfig, load_pydoc_topics, train_lm
from veil.training.lm.config import LM_LR, full_model_optimizers

ROOT = Path(__file__).resolve().parents[1]
SECTION = "optim_lm"
sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import save_results  # noqa: E402

# lr grids: AdamW around its usual small-model range; RACS/Alice around the paper's λ = 0.02 (Tables 9, 11).
SWEEP: dict[str, list[float]] = {"adamw": [3e-4, 1e-3, 3e-3], "racs": [0.01, 0.02, 0.05], "alice": [0.01, 0.02, 0.05]}


def run_one(name: str, lr: float, model: LMModelConfig, train: LMTrainConfig, corpus: Any) -> dict[str, Any]:
    """Train one optimizer at one lr; a diverged run is recorded (not raised) so the sweep goes on."""
    try:
        result = train_lm(model, train.replace(optimizer=name, lr=lr), corpus, progress=False)
    except FloatingPointError as exc:
        return {"optimizer": name, "lr": lr, "diverged": str(exc)}
    tail = result.train_loss[-max(1, len(result.train_loss) // 10):]
    return {"optimizer": name, "lr": lr, "diverged": None, "select_train_loss": sum(tail) / len(tail),
            "metrics": dict(result.metrics), "history": result.history,
            "train_loss": result.train_loss}


def steps_to_reach(history: list[dict[str, float]], target: float) -> int | None:
    """First evaluated step whose held-out loss is <= ``target`` (None: never)."""
    return next((h["step"] for h in history if h["held_out_loss"] <= target), None)


def summarise(best: dict[str, dict[str, Any]], steps: int) -> dict[str, Any]:
    """Final losses, memory ratios and the three targets, all against the AdamW run."""
    adam = best["adamw"]["metrics"]
    rows = {}
    for name, run in best.items():
        m = run["metrics"]
        reach = steps_to_reach(run["history"], adam["held_out_loss"])
        rows[name] = {"lr": run["lr"], "held_out_loss": m["held_out_loss"], "held_out_perplexity": m["held_out_perplexity"],
                      "loss_vs_adamw": m["held_out_loss"] / adam["held_out_loss"] - 1,
                      "optimizer_state_bytes": m["optimizer_state_bytes"],
                      "state_vs_adamw": m["optimizer_state_bytes"] / adam["optimizer_state_bytes"],
                      "steps_to_adamw_final": reach, "step_ratio": None if reach is None else reach / steps,
                      "train_seconds": m["train_seconds"], "optimizer_kwargs": m["optimizer_kwargs"]}
    targets = {}
    if "alice" in rows:
        ratio = rows["alice"]["step_ratio"]
        targets["alice_steps_to_adamw_final <= 0.6x"] = ratio is not None and ratio <= 0.6
    if "racs" in rows:
        targets["racs_loss <= 1.05x adamw"] = rows["racs"]["loss_vs_adamw"] <= 0.05
    for name in ("racs", "alice"):
        if name in rows:
            targets[f"{name}_state <= 1/2 adam"] = rows[name]["state_vs_adamw"] <= 0.5
    return {"rows": rows, "targets": targets}


def plot(best: dict[str, dict[str, Any]], adam_final: float, path: Path) -> None:
    """Held-out loss vs step (left) and smoothed training loss (right) of each optimizer at its chosen lr."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for name, run in best.items():
        ax1.plot([h["step"] for h in run["history"]], [h["held_out_loss"] for h in run["history"]], marker=".",
                 label=f"{name} (lr {run['lr']:g})")
        loss = torch.tensor(run["train_loss"])
        k = max(1, len(loss) // 40)
        smooth = loss.unfold(0, k, 1).mean(1) if len(loss) >= k else loss  # moving average over k steps
        ax2.plot(range(k, len(loss) + 1), smooth.tolist(), label=name)
    ax1.axhline(adam_final, color="grey", linestyle="--", linewidth=0.8, label="AdamW final")
    for ax, title in ((ax1, "held-out loss (nats/byte)"), (ax2, "training loss (moving average)")):
        ax.set_xlabel("step")
        ax.set_title(title)
        ax.set_ylim(top=min(ax.get_ylim()[1], 3.5))
        ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def markdown(results: dict[str, Any], command: str) -> str:
    s = results["settings"]
    lines = [f"### Optimizers on the byte-level Llama LM ({s['preset']}, {s['parameters']:,} parameters)", "",
             f"`{command}` — {results['environment']['date']}, {results['environment']['machine']}, torch threads 1; "
             f"seed {s['seed']}, {s['steps']} steps of {s['batch_size']} x {s['block_size']} bytes, warm-up "
             f"{s['warmup']:.0%} + cosine to {s['min_lr_ratio']:.0%}, held-out = {s['held_out_bytes']:,} bytes of "
             f"pydoc topics ({s['eval_blocks']} evenly spaced windows per evaluation, every {s['eval_every']} steps). "
             "Each optimizer's lr is the one of its sweep with the lowest final training loss.", "",
             "| optimizer | lr | held-out loss | perplexity | vs AdamW | state (bytes) | state vs AdamW | "
             "steps to AdamW's final | seconds |", "|---|---|---|---|---|---|---|---|---|"]
    for name, r in results["summary"]["rows"].items():
        reach = "never" if r["steps_to_adamw_final"] is None else \
            f"{r['steps_to_adamw_final']} ({r['step_ratio']:.2f}x)"
        lines.append(f"| {name} | {r['lr']:g} | {r['held_out_loss']:.4f} | {r['held_out_perplexity']:.3f} | "
                     f"{100 * r['loss_vs_adamw']:+.1f} % | {r['optimizer_state_bytes']:,} | "
                     f"{r['state_vs_adamw']:.2f} | {reach} | {r['train_seconds']:.0f} |")
    lines += ["", "Targets: " + "; ".join(f"{k}: {'met' if v else 'MISSED'}"
                                          for k, v in results["summary"]["targets"].items()) + ".", "",
              "Learning-rate sweep (final training loss, mean of the last 10 % of steps; held-out loss for reference):",
              "", "| optimizer | lr | training loss | held-out loss |", "|---|---|---|---|"]
    for run in results["sweep"]:
        if run["diverged"]:
            lines.append(f"| {run['optimizer']} | {run['lr']:g} | diverged | — |")
        else:
            lines.append(f"| {run['optimizer']} | {run['lr']:g} | {run['select_train_loss']:.4f} | "
                         f"{run['held_out_loss']:.4f} |")
    lines += ["", "Optimizer arguments beyond lr: " + "; ".join(
        f"{n}: {json.dumps(r['optimizer_kwargs'])}" for n, r in results["summary"]["rows"].items()) + ".",
        "", "![held-out loss per step](img/optim_lm_loss.png)"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__.rsplit("\n\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a smoke run: micro preset, 30 steps, one lr each")
    parser.add_argument("--steps", type=int, default=300, help="optimizer steps per run (default: 300)")
    parser.add_argument("--seed", type=int, default=0, help="seed of every run (default: 0)")
    parser.add_argument("--out", type=Path, default=ROOT / "docs", help="docs folder to write into")
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    preset = "micro" if args.quick else "tiny"
    model = LMModelConfig(**PRESETS[preset])
    train = LMTrainConfig(steps=30 if args.quick else args.steps, eval_every=10 if args.quick else 25,
                          eval_blocks=16 if args.quick else 64, seed=args.seed)
    names = full_model_optimizers()
    missing = [n for n in names if n not in SWEEP and n not in LM_LR]
    if missing:
        raise ValueError(f"optimizers {missing}: expected an lr grid in SWEEP or an entry in LM_LR, found neither")
    grids = {n: [LM_LR[n]] if args.quick or n not in SWEEP else SWEEP[n] for n in names}
    corpus = load_pydoc_topics(train.held_out)
    sweep = []
    for name, lrs in grids.items():
        for lr in lrs:
            run = run_one(name, lr, model, train, corpus)
            sweep.append(run)
            print(f"{name} lr={lr:g}: " + (f"train {run['select_train_loss']:.4f}, held-out "
                  f"{run['metrics']['held_out_loss']:.4f}" if not run["diverged"] else "diverged"), file=sys.stderr)
    best = {}
    for name in names:
        done = [r for r in sweep if r["optimizer"] == name and not r["diverged"]]
        if not done:
            raise FloatingPointError(f"{name}: every lr of {grids[name]} diverged")
        best[name] = min(done, key=lambda r: r["select_train_loss"])
    summary = summarise(best, train.steps)
    results = {"settings": {"preset": preset, "parameters": best["adamw"]["metrics"]["parameters"], "seed": args.seed,
                            "steps": train.steps, "batch_size": train.batch_size, "block_size": train.block_size,
                            "warmup": train.warmup, "min_lr_ratio": train.min_lr_ratio, "eval_every": train.eval_every,
                            "eval_blocks": train.eval_blocks, "held_out_bytes": len(corpus.held_out),
                            "sweep": grids},
               "summary": summary,
               "sweep": [{"optimizer": r["optimizer"], "lr": r["lr"], "diverged": r["diverged"],
                          "select_train_loss": r.get("select_train_loss"),
                          "held_out_loss": r["metrics"]["held_out_loss"] if not r["diverged"] else None}
                         for r in sweep],
               "curves": {n: {"lr": r["lr"], "history": r["history"], "train_loss": r["train_loss"]}
                          for n, r in best.items()},
               "data": corpus.describe(),
               "environment": {"date": time.strftime("%Y-%m-%d"), "machine": f"{platform.machine()}, "
                               f"{os.cpu_count()} CPUs", "torch": torch.__version__, "python": platform.python_version()}}
    plot(best, best["adamw"]["metrics"]["held_out_loss"], args.out / "img" / "optim_lm_loss.png")
    command = "python benchmarks/optim_lm.py" + (" " + " ".join(argv) if argv else "")
    save_results(args.out, SECTION, results, markdown(results, command))
    print(json.dumps({"rows": {n: {k: v for k, v in r.items() if k != "optimizer_kwargs"}
                               for n, r in summary["rows"].items()}, "targets": summary["targets"]}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
