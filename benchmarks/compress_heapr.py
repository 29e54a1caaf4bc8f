"""HEAPr atomic-expert pruning vs whole-expert pruning on a tiny byte-level MoE LM, at equal parameter removal.

Workload: a transformers Qwen2-MoE (3 layers, hidden 64, 8 routed experts of width 32, top-2, a shared expert of
width 64; fused v5 expert tensors) trained from scratch on Python's pydoc topics (veil.training.lm's fixed
held-out split), and a Mixtral (no shared expert), one model per seed and architecture. Calibration: 64 windows
of 128 bytes evenly spaced over the *train* text (``Calibration.from_bytes``); evaluation: every 128-byte block of the held-out
topics. Ratio convention: fraction of routed-expert parameters removed. Expert pruning removes round(r * 24) whole
experts (REAP saliency g·||f||, spread evenly over layers); HEAPr removes the same fraction of atomic experts (so
exactly the same routed-expert parameters; expert pruning also drops the dropped experts' router rows). Also
shown: HEAPr with per-layer ranking, expert pruning by routing frequency, random atomic experts, and (at 25 %)
the HEAPr options. Nothing is tuned on the held-out text: every setting is the spec's default.
Target: HEAPr at 25 % beats expert pruning at equal removal and stays within 5 % of the unpruned perplexity.
Writes docs/results/compress_heapr.json, docs/img/compress_heapr_perplexity.png and the compress_heapr section of
docs/results.md.

    python benchmarks/compress_heapr.py                          # 2 seeds x {Qwen2-MoE, Mixtral} (~14 min, 1 core)
    python benchmarks/compress_heapr.py --archs mixtral --seeds 0
    python benchmarks/compress_heapr.py --quick --out /tmp/docs   # smoke: Qwen2-MoE, 60 steps, 25 % only
"""

from __future__ import annotations

import copy
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn
from veil.training.compress.calibration import Calibration
from veil.training.compress.heapr import (
    STAGES,
    ExpertPruneConfig,
    HEAPrConfig,
    convert_to_ragged,
    count_params,
    moe_blocks,
    removal_mask,
    routed_expert_params,
)
from veil.training.compress.heapr.workload import MoELMConfig, held_out_loss, train_moe_lm
from veil.training.lm import load_pydoc_topics
from veil.training.lm.data import eval_blocks

ROOT = Path(__file__).resolve().parents[1]
SECTION = "compress_heapr"
from common import argument_parser, command_line, environment, save_figure, save_results  # noqa: E402

RATIOS = (0.1, 0.25, 0.4)
VARIANTS = {"heapr_first_order": {"first_order": True}, "heapr_per_token": {"fisher": "per_token"},
            "heapr_by_frequency": {"weighting": "by_frequency"}, "heapr_all_tokens": {"tokens": "all"}}


def quiet(*args: Any, **kwargs: Any) -> None:
    """A ModuleLog-compatible sink (the benchmark records the stage summaries instead)."""


def random_atomic(model: nn.Module, ratio: float, seed: int) -> None:
    """Remove round(ratio * N) atomic experts chosen uniformly at random (the floor every method must beat)."""
    convert_to_ragged(model)
    g = torch.Generator().manual_seed(seed)
    blocks = dict(moe_blocks(model))
    scores = {n: [torch.rand(w, generator=g) for w in b.experts.widths] for n, b in blocks.items()}
    for name, masks in removal_mask(scores, ratio, "global").items():
        blocks[name].experts.keep_neurons([(~m).nonzero().flatten() for m in masks])


def prune(model: nn.Module, method: str, ratio: float, cal: Calibration, seed: int) -> dict[str, Any]:
    """A pruned copy's summary; ``method`` names the stage and its settings."""
    if method == "random_atomic":
        random_atomic(model, ratio, seed)
        return {}
    if method.startswith("expert_prune"):
        cfg = ExpertPruneConfig(ratio=ratio, criterion="frequency" if method.endswith("frequency") else "reap")
        return STAGES["expert_prune"].apply(model, cfg, cal, quiet)
    options = {"heapr": {}, "heapr_layerwise": {"ranking": "per_layer"}, **VARIANTS}[method]
    return STAGES["heapr"].apply(model, HEAPrConfig(ratio=ratio, **options), cal, quiet)


def run_seed(arch: str, seed: int, steps: int, ratios: tuple[float, ...], cal_sequences: int,
             eval_count: int) -> list[dict[str, Any]]:
    """Train one model, then evaluate it unpruned and under every method and ratio."""
    corpus = load_pydoc_topics()
    cfg = MoELMConfig(arch=arch, steps=steps, seed=seed)
    model, metrics = train_moe_lm(cfg, corpus, eval_count=16)
    cal = Calibration.from_bytes(corpus.train, seq_len=128, num_sequences=cal_sequences, batch_size=8)
    blocks = eval_blocks(corpus.held_out, 128, eval_count)  # (N, 129)
    base = held_out_loss(model, blocks)
    n_experts = cfg.num_layers * cfg.num_experts
    rows = [{"arch": arch, "seed": seed, "method": "unpruned", "requested_ratio": 0.0, "removed_fraction": 0.0,
             "held_out_loss": base, "perplexity": math.exp(base), "params": count_params(model),
             "routed_expert_params": routed_expert_params(model), "train_seconds": metrics["train_seconds"]}]
    for ratio in ratios:
        exact = round(ratio * n_experts) / n_experts  # what whole-expert pruning can remove: HEAPr removes the same
        methods = ["heapr", "heapr_layerwise", "expert_prune", "expert_prune_frequency", "random_atomic"]
        methods += list(VARIANTS) if ratio == 0.25 else []
        for method in methods:
            pruned = copy.deepcopy(model)
            start = time.perf_counter()
            summary = prune(pruned, method, exact, cal, seed)
            seconds = time.perf_counter() - start
            loss = held_out_loss(pruned, blocks)
            rows.append({"arch": arch, "seed": seed, "method": method, "requested_ratio": ratio,
                         "removed_fraction": 1 - routed_expert_params(pruned) / rows[0]["routed_expert_params"],
                         "held_out_loss": loss, "perplexity": math.exp(loss), "params": count_params(pruned),
                         "routed_expert_params": routed_expert_params(pruned), "prune_seconds": round(seconds, 2),
                         "layout": summary.get("layout")})
            print(f"{arch} seed {seed} {method:24s} r={exact:.3f} ppl {math.exp(loss):.4f} (unpruned "
                  f"{math.exp(base):.4f})", file=sys.stderr, flush=True)
    return rows


def summarise(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Mean over seeds per (arch, method, ratio), with the relative perplexity change against the unpruned model."""
    base = {(r["arch"], r["seed"]): r["perplexity"] for r in rows if r["method"] == "unpruned"}
    groups: dict[tuple[str, str, float], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["arch"], r["method"], r["requested_ratio"]), []).append(r)
    out = []
    for (arch, method, ratio), rs in groups.items():
        rel = [r["perplexity"] / base[(r["arch"], r["seed"])] - 1 for r in rs]
        out.append({"arch": arch, "method": method, "requested_ratio": ratio,
                    "removed_fraction": sum(r["removed_fraction"] for r in rs) / len(rs),
                    "perplexity": sum(r["perplexity"] for r in rs) / len(rs), "relative_increase": sum(rel) / len(rel),
                    "params": sum(r["params"] for r in rs) / len(rs), "seeds": len(rs)})
    return out


def targets(summary: list[dict[str, Any]]) -> dict[str, Any]:
    """Per arch at 25 %: does HEAPr beat expert pruning, and stay within 5 % of the unpruned perplexity?"""
    out = {}
    for arch in sorted({s["arch"] for s in summary}):
        pick = {s["method"]: s for s in summary if s["arch"] == arch and s["requested_ratio"] == 0.25}
        if "heapr" in pick:
            out[arch] = {"beats_expert_pruning": pick["heapr"]["perplexity"] < pick["expert_prune"]["perplexity"],
                         "within_5_percent": pick["heapr"]["relative_increase"] <= 0.05,
                         "heapr_relative_increase": pick["heapr"]["relative_increase"],
                         "expert_prune_relative_increase": pick["expert_prune"]["relative_increase"]}
    return out


def plot(summary: list[dict[str, Any]], path: Path) -> None:
    """Perplexity against removed fraction, one panel per architecture, one line per main method."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import ScalarFormatter

    archs = sorted({s["arch"] for s in summary})
    fig, axes = plt.subplots(1, len(archs), figsize=(6 * len(archs), 4), squeeze=False)
    for ax, arch in zip(axes[0], archs, strict=True):
        base = next(s["perplexity"] for s in summary if s["arch"] == arch and s["method"] == "unpruned")
        for method in ("heapr", "heapr_layerwise", "expert_prune", "expert_prune_frequency", "random_atomic"):
            pts = sorted((s["removed_fraction"], s["perplexity"]) for s in summary if s["arch"] == arch
                         and s["method"] == method)
            if pts:
                ax.plot([0.0] + [p[0] for p in pts], [base] + [p[1] for p in pts], marker="o", label=method)
        ax.axhline(base * 1.05, color="grey", linestyle=":", label="unpruned + 5 %")
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(ScalarFormatter())
        ax.yaxis.set_minor_formatter(ScalarFormatter())
        ax.set_xlabel("fraction of routed-expert parameters removed")
        ax.set_ylabel("held-out perplexity (bytes, log scale)")
        ax.set_title(f"tiny {arch} on pydoc topics")
        ax.legend(fontsize=8)
    save_figure(fig, path)


def markdown(results: dict[str, Any], command: str) -> str:
    lines = ["### HEAPr vs expert pruning on a tiny MoE LM (pydoc topics)", "",
             f"`{command}` — {results['environment']['date']}, {results['environment']['machine']}; seeds "
             f"{results['seeds']}, {results['settings']}. Perplexity per byte on the held-out topics, mean over seeds; "
             "ratio = fraction of routed-expert parameters removed (the same for every method in a row group). "
             "Target: HEAPr at 25 % beats expert pruning and stays within 5 % of the unpruned perplexity.", "",
             "| arch | method | removed | perplexity | vs unpruned | params |", "|---|---|---|---|---|---|"]
    for s in sorted(results["summary"], key=lambda s: (s["arch"], s["requested_ratio"], s["perplexity"])):
        lines.append(f"| {s['arch']} | {s['method']} | {100 * s['removed_fraction']:.1f} % | {s['perplexity']:.4f} | "
                     f"{100 * s['relative_increase']:+.2f} % | {s['params']:,.0f} |")
    lines.append("")
    for arch, t in results["targets"].items():
        lines.append(f"Target ({arch}, 25 %): beats expert pruning: {'met' if t['beats_expert_pruning'] else 'missed'} "
                     f"({100 * t['heapr_relative_increase']:+.2f} % vs {100 * t['expert_prune_relative_increase']:+.2f} %"
                     f"); within 5 % of unpruned: {'met' if t['within_5_percent'] else 'missed'}.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argument_parser(__doc__)
    parser.add_argument("--quick", action="store_true", help="a smoke run: Qwen2-MoE only, 60 training steps, 25 %% only, 1 seed")
    parser.add_argument("--seeds", default="0,1", help="comma-separated seeds (default 0,1)")
    parser.add_argument("--archs", default="qwen2_moe,mixtral", help="comma-separated: qwen2_moe, mixtral")
    parser.add_argument("--steps", type=int, default=1200, help="training steps of each model (default 1200)")
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    archs = ["qwen2_moe"] if args.quick else args.archs.split(",")
    if args.quick:
        seeds, steps, ratios, cal_sequences, eval_count = [0], 60, (0.25,), 16, 16
    else:
        seeds, steps, ratios, cal_sequences, eval_count = [int(s) for s in args.seeds.split(",")], args.steps, RATIOS, 64, 0
    rows = [r for arch in archs for seed in seeds for r in run_seed(arch, seed, steps, ratios, cal_sequences,
                                                                    eval_count)]
    summary = summarise(rows)
    results = {"seeds": seeds, "archs": archs, "ratios": list(ratios), "rows": rows, "summary": summary,
               "targets": targets(summary),
               "settings": f"{steps} AdamW steps, calibration {cal_sequences} x 128 train bytes, "
                           f"{eval_count or 'all'} held-out 128-byte blocks",
               "environment": environment("1 torch thread", torch=torch.__version__)}
    command = command_line(__file__, argv)
    plot(summary, args.out / "img" / "compress_heapr_perplexity.png")
    save_results(args.out, SECTION, results, markdown(results, command))
    print(json.dumps(results["targets"], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
