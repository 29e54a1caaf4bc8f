"""LoRA-Mixer vs single LoRA on a mixture of the three MiniLM tasks, same seeds, data and steps.

Li et al., "LoRA-Mixer" (ICLR 2026), joint regime (spec §3.2 (i)): stage 1 trains one LoRA expert per domain with
hard routing (each sample's domain id), stage 2 trains the router and experts with soft routing and the RSL; at test
time the router alone picks the experts (no domain ids). The mixture has one 8-way head over the union of the
labels of sentiment (2), number (2) and topic (4), so the model must also tell the domains apart.
Baselines, trained for the same total epochs on the same mixture: one LoRA of rank r on the same attention
projections, and one of rank E·r (the mixer's trainable parameter count). No target in the issue: this measures
whether routing over domain experts pays off here and whether the router learns the domains (top-1 agreement).

    python benchmarks/adapters_loramixer.py                  # 2 seeds, 160 train / 120 test per domain
    python benchmarks/adapters_loramixer.py --quick --out /tmp/docs
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn
from veil.training.adapters import LoraConfig, inject
from veil.training.adapters.data import TaskData, TextTask, make_task
from veil.training.adapters.finetune import (
    BUNDLED_MINILM,
    MINILM_HUB_ID,
    FinetuneConfig,
    accuracy,
    build_classifier,
    make_batches,
    train,
)
from veil.training.adapters.loramixer import LoraMixerConfig
from veil.training.adapters.workloads import BERT_ATTENTION_PROJECTIONS

ROOT = Path(__file__).resolve().parents[1]
SECTION = "adapters_loramixer"
DOMAINS = ("sentiment", "number", "topic")
from common import argument_parser, command_line, environment, save_results  # noqa: E402


def mixture(cfg: FinetuneConfig, seed: int) -> tuple[TextTask, dict[str, TextTask]]:
    """One task over the union of the domains' labels (label offsets per domain), and each domain with offset labels."""
    sizes = (cfg.train_size, cfg.val_size, cfg.test_size)
    parts, names, offset = {}, [], 0
    for domain in DOMAINS:
        task = make_task(domain, sizes, seed=seed)
        shift = [label + offset for label in task.train.labels], [label + offset for label in task.val.labels], \
            [label + offset for label in task.test.labels]
        parts[domain] = TextTask(domain, task.label_names, TaskData(task.train.texts, shift[0]),
                             TaskData(task.val.texts, shift[1]), TaskData(task.test.texts, shift[2]))
        names += [f"{domain}:{n}" for n in task.label_names]
        offset += len(task.label_names)

    def union(split: str) -> TaskData:
        return TaskData([t for p in parts.values() for t in getattr(p, split).texts],
                        [y for p in parts.values() for y in getattr(p, split).labels])

    return TextTask("mixture", names, union("train"), union("val"), union("test")), parts


def fit_hard_stage(model: nn.Module, tok, parts: dict[str, TextTask], cfg: FinetuneConfig) -> None:
    """Stage 1: per-domain experts — batches of one domain at a time (round robin), routed by their domain id."""
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    for epoch in range(cfg.epochs):
        model.train()
        per_domain = [make_batches(tok, p.train.texts, p.train.labels, cfg, shuffle_seed=cfg.seed + epoch)
                      for p in parts.values()]
        for step in range(max(len(b) for b in per_domain)):
            for domain, batches in enumerate(per_domain):
                if step >= len(batches):
                    continue
                b = batches[step]
                model.set_domains([domain] * len(b["labels"]))
                loss = nn.functional.cross_entropy(model(b["input_ids"], b["attention_mask"]), b["labels"])
                opt.zero_grad()
                loss.backward()
                opt.step()


def routing_agreement(model: nn.Module, tok, parts: dict[str, TextTask], cfg: FinetuneConfig) -> float:
    """Share of real tokens whose top-1 router expert is their sample's domain, averaged over the mixer layers."""
    hits = total = 0
    for domain, part in enumerate(parts.values()):
        for b in make_batches(tok, part.test.texts, part.test.labels, cfg):
            seen: list[torch.Tensor] = []
            hooks = [layer.lora_router.register_forward_hook(lambda _m, _i, out, seen=seen: seen.append(out.argmax(-1)))
                     for layer in model.mixer_layers()]
            with torch.no_grad():
                model(b["input_ids"], b["attention_mask"])
            for h in hooks:
                h.remove()
            real = b["attention_mask"].bool()  # (B, T)
            for top1 in seen:  # (B, T) per layer
                hits += int((top1[real] == domain).sum())
                total += int(real.sum())
    return hits / max(total, 1)


def per_domain_accuracy(model: nn.Module, tok, parts: dict[str, TextTask], cfg: FinetuneConfig) -> dict[str, float]:
    return {d: accuracy(model, make_batches(tok, p.test.texts, p.test.labels, cfg)) for d, p in parts.items()}


def run_one(method: str, seed: int, cfg: FinetuneConfig, stage_epochs: tuple[int, int]) -> dict[str, Any]:
    """Train one method on the mixture; LoRA baselines get stage 1 + stage 2 epochs in one run."""
    task, parts = mixture(cfg, seed)
    base, tok = build_classifier(BUNDLED_MINILM, len(task.label_names), seed)
    common = {"target_modules": list(BERT_ATTENTION_PROJECTIONS), "modules_to_save": ["classifier"],
              "task_type": "SEQ_CLS", "base_model_name_or_path": MINILM_HUB_ID}
    cfg = cfg.replace(seed=seed)
    start = time.perf_counter()
    row: dict[str, Any] = {"method": method, "seed": seed}
    if method in ("lora", "lora_matched"):
        rank = cfg.r * (len(DOMAINS) if method == "lora_matched" else 1)
        model = inject(base, LoraConfig(r=rank, lora_alpha=2.0 * rank, **common))
        train(model, tok, task, cfg.replace(epochs=sum(stage_epochs)), progress=False)
    else:
        model = inject(base, LoraMixerConfig(r=cfg.r, lora_alpha=cfg.alpha, num_experts=len(DOMAINS),
                                             routing="hard", top_k=1, **common))
        fit_hard_stage(model, tok, parts, cfg.replace(epochs=stage_epochs[0]))
        model.begin_soft_stage()
        train(model, tok, task, cfg.replace(epochs=stage_epochs[1]), progress=False)
        row["routing_agreement"] = routing_agreement(model, tok, parts, cfg)
        row["mixer_layers"] = len(model.mixer_layers())
        model.set_routing("topk")  # K = 1: each token runs the one expert its router picks
        row["top1_accuracy"] = accuracy(model, make_batches(tok, task.test.texts, task.test.labels, cfg))
        model.set_routing("soft")
    row.update(test_accuracy=accuracy(model, make_batches(tok, task.test.texts, task.test.labels, cfg)),
               per_domain=per_domain_accuracy(model, tok, parts, cfg),
               trainable_params=sum(p.numel() for p in model.parameters() if p.requires_grad),
               train_seconds=round(time.perf_counter() - start, 1))
    return row


def summarise(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for method in dict.fromkeys(r["method"] for r in runs):
        rs = [r for r in runs if r["method"] == method]

        def mean(get, rs=rs) -> float:
            return sum(get(r) for r in rs) / len(rs)

        row = {"method": method, "test_accuracy": mean(lambda r: r["test_accuracy"]),
               "per_domain": {d: mean(lambda r, d=d: r["per_domain"][d]) for d in DOMAINS},
               "trainable_params": rs[0]["trainable_params"]}
        if "routing_agreement" in rs[0]:
            row.update(routing_agreement=mean(lambda r: r["routing_agreement"]),
                       top1_accuracy=mean(lambda r: r["top1_accuracy"]))
        rows.append(row)
    return rows


LABELS = {"lora": "LoRA r={r}", "lora_matched": "LoRA r={rm} (mixer's parameter count)",
          "loramixer": "LoRA-Mixer, {e} experts of r={r} (soft routing)"}


def markdown(results: dict[str, Any], command: str) -> str:
    r, e = results["r"], len(DOMAINS)
    lines = [f"### LoRA-Mixer vs LoRA on a mixture of the MiniLM tasks ({results['model']})", "",
             f"`{command}` — {results['environment']['date']}, {results['environment']['machine']}; seeds "
             f"{results['seeds']}, {results['settings']}. One 8-way head over sentiment/number/topic labels; the "
             "mixer's stage 1 uses domain ids (hard routing), its test-time routing does not.", "",
             "| method | mixture acc | sentiment | number | topic | trainable params |", "|---|---|---|---|---|---|"]
    for row in results["summary"]:
        name = LABELS[row["method"]].format(r=r, rm=r * e, e=e)
        d = row["per_domain"]
        lines.append(f"| {name} | {100 * row['test_accuracy']:.1f} % | {100 * d['sentiment']:.1f} % | "
                     f"{100 * d['number']:.1f} % | {100 * d['topic']:.1f} % | {row['trainable_params']:,} |")
    mixer = next(row for row in results["summary"] if row["method"] == "loramixer")
    lines += ["", f"Mixer routing: top-1 expert = the sample's domain for **{100 * mixer['routing_agreement']:.1f} %** "
                  f"of tokens (mean over its {results['mixer_layers']} routed projections; chance 33 %); with top-1 "
                  f"routing (each token runs one expert) the mixture accuracy is {100 * mixer['top1_accuracy']:.1f} %."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argument_parser(__doc__)
    parser.add_argument("--quick", action="store_true", help="a smoke run: one seed, 32 examples per domain")
    parser.add_argument("--seeds", default="0,1", help="comma-separated seeds (default 0,1)")
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    torch.set_num_threads(min(2, os.cpu_count() or 1))
    if args.quick:
        cfg, seeds, stages = FinetuneConfig(train_size=32, val_size=8, test_size=16), [0], (1, 1)
    else:
        cfg = FinetuneConfig(train_size=160, val_size=40, test_size=120)
        seeds, stages = [int(s) for s in args.seeds.split(",")], (2, 1)
    runs = [run_one(m, s, cfg, stages) for s in seeds for m in ("lora", "lora_matched", "loramixer")]
    results = {"model": "all-MiniLM-L6-v2", "seeds": seeds, "r": cfg.r, "runs": runs, "summary": summarise(runs),
               "mixer_layers": next(r["mixer_layers"] for r in runs if "mixer_layers" in r),
               "settings": f"r={cfg.r}, alpha=2r, q/k/v/attention-output projections, lr {cfg.lr:g}, "
                           f"{sum(stages)} epochs (mixer: {stages[0]} hard + {stages[1]} soft), "
                           f"{cfg.train_size} train / {cfg.test_size} test per domain",
               "environment": environment(torch=torch.__version__)}
    command = command_line(__file__, argv)
    save_results(args.out, SECTION, results, markdown(results, command))
    print(json.dumps(results["summary"], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
