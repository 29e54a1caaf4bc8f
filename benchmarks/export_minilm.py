"""all-MiniLM-L6-v2 on CPU: PyTorch eager vs ONNX Runtime fp32 (plain, fused) vs int8, interleaved in one run.

Exports the bundled model with veil's exporter, applies ORT's transformer fusions as the export does (attention
as ``Attention`` for fp32, as ``MultiHeadAttention`` under int8), quantizes (dynamic int8, per-channel and, for
comparison, ORT's default per-tensor), then times every variant on the same inputs, round-robin, at batch 1 and 8
and sequence 128, and measures int8 quality as the cosine to fp32 on real sentences. Checks the issue's target
(fp32 with fusions >= 1.8x PyTorch eager at batch 8) and records the load average, since the cores may be shared.
Writes docs/results/export_minilm.json and the export_minilm section of docs/results.md.

    python benchmarks/export_minilm.py               # 30 timed rounds per setting
    python benchmarks/export_minilm.py --rounds 3 --out /tmp/docs   # smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch
from common import save_results
from veil.export.encoder import (
    DYNAMIC,
    embedding_agreement,
    fuse_transformer,
    load_sentence_encoder,
    random_tokens,
    resolve_encoder,
)
from veil.export.onnx_export import export_graph
from veil.export.quantize import quantize_dynamic_int8

from veil.machine import describe

ROOT = Path(__file__).resolve().parents[1]
TARGET = 1.8  # issue 20 section 2b: ORT fp32 with fusions vs PyTorch eager at batch 8, sequence 128


def session(model, threads: int) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    # no spin-waiting after a run: interleaved variants would otherwise steal each other's cores
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__.split("\n\n", 2)[2],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--sequence", type=int, default=128)
    parser.add_argument("--out", type=Path, default=ROOT / "docs")
    args = parser.parse_args(argv)
    threads = torch.get_num_threads()
    load_before = os.getloadavg()[0]

    folder = resolve_encoder("bundled:all-MiniLM-L6-v2")
    model, config = load_sentence_encoder(folder)
    example = random_tokens(config.vocab_size, 2, 16)
    plain = export_graph(model, tuple(example.values()), list(example), ["sentence_embedding"], DYNAMIC).model
    fused, counts = fuse_transformer(plain, config)
    fused_mha, counts_mha = fuse_transformer(plain, config, multi_head=True)
    variants = {"ort_fp32": session(plain, threads), "ort_fp32_fused": session(fused, threads),
                "ort_fp32_fused_mha": session(fused_mha, threads),
                "ort_int8": session(quantize_dynamic_int8(fused_mha, per_channel=True), threads),
                "ort_int8_per_tensor": session(quantize_dynamic_int8(fused_mha, per_channel=False), threads)}
    quality = {name: embedding_agreement(variants["ort_fp32_fused_mha"], variants[name], folder)
               for name in ("ort_int8", "ort_int8_per_tensor")}

    results = {}
    for batch in (1, 8):
        feeds = random_tokens(config.vocab_size, batch, args.sequence)
        feeds["attention_mask"][:] = 1  # full-length sequences
        np_feeds = {k: v.numpy() for k, v in feeds.items()}

        def run_torch(feeds=feeds) -> None:
            with torch.no_grad():
                model(**feeds)

        runners = {"torch_eager": run_torch, **{n: (lambda s=s, f=np_feeds: s.run(None, f)) for n, s in variants.items()}}
        times: dict[str, list[float]] = {n: [] for n in runners}
        for _ in range(3):
            for fn in runners.values():
                fn()
        for _ in range(args.rounds):  # interleaved, so drift and noise hit every variant alike
            for name, fn in runners.items():
                start = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - start)
        medians = {n: float(np.median(t)) * 1e3 for n, t in times.items()}
        results[f"batch{batch}"] = {"median_ms": medians,
                                    "speedup_vs_torch": {n: medians["torch_eager"] / v for n, v in medians.items()}}
        print(f"batch {batch}: " + ", ".join(f"{n} {v:.2f} ms" for n, v in medians.items()), file=sys.stderr)

    speedup = results["batch8"]["speedup_vs_torch"]["ort_fp32_fused"]
    report = {"date": time.strftime("%Y-%m-%d"), "machine": describe(), "threads": threads,
              "torch": torch.__version__, "onnxruntime": ort.__version__, "sequence": args.sequence,
              "rounds": args.rounds, "load_average_1min": {"start": load_before, "end": os.getloadavg()[0]},
              "fused_ops": {"ort_fp32_fused": counts, "ort_fp32_fused_mha": counts_mha}, "quality": quality,
              "target": {"variant": "ort_fp32_fused", "batch": 8, "min_speedup": TARGET, "speedup": speedup,
                         "met": speedup >= TARGET},
              "results": results}
    save_results(args.out, "export_minilm", report, markdown(report, "python benchmarks/export_minilm.py" + (" " + " ".join(argv) if argv else "")))
    print(json.dumps(report, indent=1))
    return 0


def markdown(r: dict, command: str) -> str:
    names = {"torch_eager": "PyTorch eager (fp32)", "ort_fp32": "ORT fp32, exported graph",
             "ort_fp32_fused": "ORT fp32 + transformer fusions, Attention (veil's fp32)",
             "ort_fp32_fused_mha": "ORT fp32 + transformer fusions, MultiHeadAttention",
             "ort_int8": "ORT int8 dynamic, per-channel, of the MultiHeadAttention graph (veil's int8)",
             "ort_int8_per_tensor": "ORT int8 dynamic, per-tensor (ORT default)"}
    load, target = r["load_average_1min"], r["target"]
    lines = ["## all-MiniLM-L6-v2 export on CPU (issue: export and serve)", "",
             f"Command: `{command}` — {r['date']}, {r['machine']}, {r['threads']} threads, torch {r['torch']}, "
             f"onnxruntime {r['onnxruntime']}; sequence {r['sequence']}, median of {r['rounds']} interleaved rounds; "
             f"1-minute load average {load['start']:.2f} at the start, {load['end']:.2f} at the end.",
             "Fused operators in the dynamo graph after veil's attention canonicalization "
             f"(export/attention_fusion.py) and ORT's optimizer: Attention graph {r['fused_ops']['ort_fp32_fused']}; "
             f"MultiHeadAttention graph {r['fused_ops']['ort_fp32_fused_mha']}.", "",
             "| variant | batch 1 ms | speed-up vs PyTorch | batch 8 ms | speed-up vs PyTorch | mean cosine to fp32 |",
             "|---|---|---|---|---|---|"]
    for key, label in names.items():
        b1, b8 = r["results"]["batch1"], r["results"]["batch8"]
        cos = r["quality"].get(key, {}).get("mean_cosine")
        lines.append(f"| {label} | {b1['median_ms'][key]:.2f} | {b1['speedup_vs_torch'][key]:.2f}x | {b8['median_ms'][key]:.2f} | "
                     f"{b8['speedup_vs_torch'][key]:.2f}x | {'' if cos is None else f'{cos:.4f}'} |")
    lines += ["", f"Target (issue 20 §2b): ORT fp32 with fusions >= {target['min_speedup']}x PyTorch eager at batch 8 — "
              f"**{'met' if target['met'] else 'not met'}** ({target['speedup']:.2f}x in this run)."
              + (f" The {r['threads']} cores were shared (load average above {r['threads']}): times are inflated and "
                 "the ratios less certain than on idle cores." if max(load.values()) > r["threads"] else ""),
              "int8 quantizes the MultiHeadAttention graph, whose Q/K/V projections stay MatMuls; in the Attention "
              "graph they are one packed fp32 GEMM that MatMul/Gemm-only dynamic quantization leaves in float.",
              "Cosine (to the fp32 MultiHeadAttention graph) measured on 64 real sentences from Python's "
              "`pydoc_data.topics`, padded to 128 tokens."]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
