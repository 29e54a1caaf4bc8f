"""E²LoRA vs LoRA on the `veil finetune` MiniLM tasks, side by side with the same seeds, data and steps.

Li, Ye, Ye, He, Chen, "Efficient and Effective LoRA with Entropy-Guided Adaptive Sharing" (ICLR 2026): one gradient
probe on the first training batch plans which adjacent layers share a LoRA and each interval's rank; the model is
then trained exactly like the LoRA baseline (r=8, α=16, query/key/value/dense of the 6 layers, lr 2e-3,
mean-pool head) for each budget of ``--epochs`` (default 2 and 4: the short budget shows how fast each converges).
Target: E²LoRA within 1 accuracy point of LoRA with >= 40 % fewer trainable adapter parameters, judged at the
largest budget. Writes docs/results/adapters_e2lora.json and the adapters_e2lora section of docs/results.md.

    python benchmarks/adapters_e2lora.py            # 3 tasks x 2 seeds x {2, 4} epochs (~20 min on 2 shared cores)
    python benchmarks/adapters_e2lora.py --quick --out /tmp/docs   # smoke: 1 task, 64 examples, 1 epoch
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn
from veil.training.adapters import E2LoraConfig, LoraConfig, inject
from veil.training.adapters.data import make_task
from veil.training.adapters.e2lora import plan_sharing
from veil.training.adapters.finetune import (
    BUNDLED_MINILM,
    MINILM_HUB_ID,
    FinetuneConfig,
    build_classifier,
    make_batches,
    train,
)

ROOT = Path(__file__).resolve().parents[1]
SECTION = "adapters_e2lora"
from common import argument_parser, command_line, environment, save_results  # noqa: E402


def adapter_params(model: nn.Module) -> int:
    """Trainable parameters outside the classification head (the adapters alone)."""
    return sum(p.numel() for n, p in model.named_parameters() if p.requires_grad and "classifier" not in n)


def run_one(method: str, task_name: str, seed: int, cfg: FinetuneConfig) -> dict[str, Any]:
    """Train one method on one task and seed; E²LoRA plans its sharing from one probe batch first."""
    task = make_task(task_name, (cfg.train_size, cfg.val_size, cfg.test_size), seed=seed)
    cfg = cfg.replace(task=task_name, seed=seed)  # cfg.epochs: this run's budget
    base, tok = build_classifier(BUNDLED_MINILM, len(task.label_names), seed)
    common = {"r": cfg.r, "lora_alpha": cfg.alpha, "target_modules": list(cfg.target_modules),
              "exclude_modules": ["pooler.dense"],  # the mean-pool head never uses BERT's pooler
              "modules_to_save": ["classifier"], "task_type": "SEQ_CLS", "base_model_name_or_path": MINILM_HUB_ID}
    plan = None
    if method == "lora":
        model = inject(base, LoraConfig(**common))
    else:
        ecfg = E2LoraConfig(**common)
        probe = make_batches(tok, task.train.texts, task.train.labels, cfg, shuffle_seed=seed)[0]
        ecfg = plan_sharing(base, ecfg, lambda m: nn.functional.cross_entropy(
            m(probe["input_ids"], probe["attention_mask"]), probe["labels"]))
        plan = next(iter(ecfg.share_intervals.values()))  # gradient_scope="layer": one plan for every target
        model = inject(base, ecfg)
    out = train(model, tok, task, cfg, progress=False)
    return {"method": method, "task": task_name, "seed": seed, "epochs": cfg.epochs, "test_accuracy": out["test_accuracy"],
            "trainable_params": out["trainable_params"], "adapter_params": adapter_params(model),
            "train_seconds": out["train_seconds"], "plan": plan}


def summarise(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per budget and task: mean accuracy and parameter counts of both methods, the gap and the parameter saving."""
    rows = []
    for epochs, task in dict.fromkeys((r["epochs"], r["task"]) for r in runs):
        by = {m: [r for r in runs if (r["epochs"], r["task"], r["method"]) == (epochs, task, m)]
              for m in ("lora", "e2lora")}
        acc = {m: sum(r["test_accuracy"] for r in rs) / len(rs) for m, rs in by.items()}
        par = {m: sum(r["adapter_params"] for r in rs) / len(rs) for m, rs in by.items()}
        rows.append({"epochs": epochs, "task": task, "lora_accuracy": acc["lora"], "e2lora_accuracy": acc["e2lora"],
                     "gap_points": 100 * (acc["e2lora"] - acc["lora"]), "lora_adapter_params": par["lora"],
                     "e2lora_adapter_params": par["e2lora"],
                     "param_reduction": 1 - par["e2lora"] / par["lora"],
                     "meets_target": 100 * (acc["lora"] - acc["e2lora"]) <= 1 and par["e2lora"] <= 0.6 * par["lora"]})
    return rows


def markdown(results: dict[str, Any], command: str) -> str:
    lines = [f"### E²LoRA vs LoRA on MiniLM ({results['model']})", "",
             f"`{command}` — {results['environment']['date']}, {results['environment']['machine']}; "
             f"seeds {results['seeds']}, {results['settings']}. Target: within 1 point of LoRA with >= 40 % fewer "
             f"trainable adapter parameters, judged at the largest budget ({max(results['epochs'])} epochs); the "
             "shorter budget shows convergence speed.", "",
             "| epochs | task | LoRA acc | E²LoRA acc | gap (points) | LoRA params | E²LoRA params | reduction | target |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in results["summary"]:
        verdict = ("met" if r["meets_target"] else "missed") if r["epochs"] == max(results["epochs"]) else "(budget)"
        lines.append(f"| {r['epochs']} | {r['task']} | {100 * r['lora_accuracy']:.1f} % | {100 * r['e2lora_accuracy']:.1f} % | "
                     f"{r['gap_points']:+.1f} | {r['lora_adapter_params']:,.0f} | {r['e2lora_adapter_params']:,.0f} | "
                     f"{100 * r['param_reduction']:.0f} % | {verdict} |")
    for epochs in results["epochs"]:
        rows = [r for r in results["summary"] if r["epochs"] == epochs]
        lora, e2 = (sum(r[k] for r in rows) / len(rows) for k in ("lora_accuracy", "e2lora_accuracy"))
        lines.append(f"| {epochs} | **mean of the tasks** | {100 * lora:.1f} % | {100 * e2:.1f} % | "
                     f"{100 * (e2 - lora):+.1f} | | | | |")
    plans = sorted({json.dumps(r["plan"]) for r in results["runs"] if r["plan"]})
    lines += ["", "Sharing plans ([first layer, last layer, rank] per interval): " + "; ".join(plans) + "."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argument_parser(__doc__)
    parser.add_argument("--quick", action="store_true", help="a smoke run: one task, 64 examples, one epoch")
    parser.add_argument("--epochs", default="2,4", help="comma-separated training budgets (default 2,4)")
    parser.add_argument("--seeds", default="0,1", help="comma-separated seeds (default 0,1)")
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    torch.set_num_threads(min(2, os.cpu_count() or 1))
    if args.quick:
        cfg, tasks, seeds, budgets = FinetuneConfig(train_size=64, val_size=16, test_size=32), ["sentiment"], [0], [1]
    else:
        cfg, tasks = FinetuneConfig(), ["sentiment", "number", "topic"]
        seeds, budgets = [int(s) for s in args.seeds.split(",")], sorted(int(e) for e in args.epochs.split(","))
    runs = [run_one(m, t, s, cfg.replace(epochs=e)) for e in budgets for t in tasks for s in seeds
            for m in ("lora", "e2lora")]
    results = {"model": "all-MiniLM-L6-v2", "seeds": seeds, "epochs": budgets, "runs": runs, "summary": summarise(runs),
               "settings": f"r={cfg.r}, alpha={cfg.alpha:g}, {'/'.join(cfg.target_modules)}, lr {cfg.lr:g}, "
                           f"{cfg.train_size} train / {cfg.test_size} test",
               "environment": environment(torch=torch.__version__)}
    command = command_line(__file__, argv)
    save_results(args.out, SECTION, results, markdown(results, command))
    print(json.dumps(results["summary"], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
