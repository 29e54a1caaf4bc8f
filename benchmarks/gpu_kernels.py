"""veil's Triton kernels vs the PyTorch (cuBLAS) baselines on one GPU, with achieved TFLOP/s and GB/s vs roofline.

Side by side in one run, fp16, ``triton.testing.do_bench`` medians:
- mixed-adapter LoRA over 8-64 adapters: one gathered shrink/expand launch vs looping over the batch's adapters
  (the ORT/PEFT way); target >= 3x;
- fused low-rank ``(x U) V + b`` vs two cuBLAS GEMMs at rank <= d/4 (and dense ``x W`` for reference); target
  >= 1.3x;
- linear + PolyAct epilogue vs ``nn.Linear`` then the polynomial.
Writes docs/results/gpu_kernels.json and the gpu_kernels section of docs/results.md (with the GPU's name) only on
a CUDA machine; finishes in under 5 minutes on one GPU.

    python benchmarks/gpu_kernels.py                 # on a CUDA machine
    TRITON_INTERPRET=1 python benchmarks/gpu_kernels.py --interpret --out /tmp/docs   # CPU smoke: tiny shapes
"""

from __future__ import annotations

import json
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
SECTION = "gpu_kernels"
from common import argument_parser, write_section  # noqa: E402

TARGETS = {"lora_speedup_min": 3.0, "lowrank_speedup_min": 1.3}
# dense fp16 tensor-core peak (TFLOP/s) and memory bandwidth (TB/s), vendor figures (engine.md §3.5: verify)
PEAKS = {"H200": (989.0, 4.8), "H100": (989.0, 3.35), "A100": (312.0, 2.0), "L4": (121.0, 0.3), "A10": (125.0, 0.6)}


def timer(interpret: bool):
    """Median milliseconds of a callable: do_bench on CUDA, a few wall-clock runs in the interpreter."""
    if not interpret:
        from triton.testing import do_bench

        return lambda fn: float(do_bench(fn, warmup=25, rep=100, return_mode="median"))

    def wall(fn) -> float:
        fn()
        times = []
        for _ in range(3):
            t = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t) * 1e3)
        return sorted(times)[1]
    return wall


def roofline(flops: float, nbytes: float, ms: float, peak: tuple[float, float] | None) -> dict[str, float | None]:
    """Achieved TFLOP/s and GB/s, and the fraction of min(peak FLOP/s, intensity x peak bandwidth)."""
    tflops, gbs = flops / ms / 1e9, nbytes / ms / 1e6
    bound = None if peak is None else min(peak[0], flops / nbytes * peak[1])  # TFLOP/s attainable
    return {"tflops": round(tflops, 3), "gbs": round(gbs, 1),
            "roofline_frac": None if bound is None else round(tflops / bound, 3)}


def two_gemms(x: torch.Tensor, u: torch.Tensor, v: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """The unfused baseline: ``x U`` to memory, then ``(x U) V + b`` (two cuBLAS GEMMs)."""
    return torch.addmm(bias, x @ u, v)


def linear_then_poly(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor, coeffs: torch.Tensor) -> torch.Tensor:
    """The unfused baseline: ``F.linear`` then the polynomial as separate kernels."""
    from veil.engine.kernels.reference import horner

    return horner(torch.nn.functional.linear(x, w, bias), coeffs).to(x.dtype)


def lora_cases(dev: str, dtype: torch.dtype, quick: bool, bench, peak) -> list[dict[str, Any]]:
    from veil.engine.kernels.lora import lora_apply
    from veil.engine.kernels.reference import lora_reference

    d, r = (64, 8) if quick else (4096, 16)
    rows = []
    for tokens in ([32] if quick else [64, 512]):
        for adapters in ([4] if quick else [8, 16, 32, 64]):
            g = torch.Generator(device="cpu").manual_seed(adapters)
            x, y = torch.randn(tokens, d, generator=g).to(dev, dtype), torch.randn(tokens, d, generator=g).to(dev, dtype)
            a = (torch.randn(adapters, d, r, generator=g) * 0.02).to(dev, dtype)
            b = (torch.randn(adapters, r, d, generator=g) * 0.02).to(dev, dtype)
            scales = torch.ones(adapters, device=dev)
            index = torch.randint(0, adapters, (tokens,), generator=g, dtype=torch.int32).to(dev)
            fused = bench(partial(lora_apply, x, y, a, b, scales, index))
            loop = bench(partial(lora_reference, x, y, a, b, scales, index))
            used = int(index.unique().numel())
            flops, nbytes = 4.0 * tokens * d * r, 2.0 * (used * 2 * d * r + 3 * tokens * d)
            rows.append({"kernel": "lora", "tokens": tokens, "adapters": adapters, "rank": r, "d": d,
                         "fused_ms": round(fused, 4), "loop_ms": round(loop, 4), "speedup": round(loop / fused, 2),
                         **roofline(flops, nbytes, fused, peak)})
    return rows


def lowrank_cases(dev: str, dtype: torch.dtype, quick: bool, bench, peak) -> list[dict[str, Any]]:
    from veil.engine.kernels.lowrank import lowrank_linear

    d = 64 if quick else 1024
    rows = []
    for tokens in ([16] if quick else [16, 256, 4096]):
        for rank in ([16] if quick else [d // 16, d // 8, d // 4]):
            g = torch.Generator(device="cpu").manual_seed(rank)
            x = torch.randn(tokens, d, generator=g).to(dev, dtype)
            u, v = (torch.randn(d, rank, generator=g) / d**0.5).to(dev, dtype), \
                (torch.randn(rank, d, generator=g) / rank**0.5).to(dev, dtype)
            bias, w = torch.randn(d, generator=g).to(dev, dtype), (u @ v).contiguous()
            fused = bench(partial(lowrank_linear, x, u, v, bias))
            two = bench(partial(two_gemms, x, u, v, bias))
            dense = bench(partial(torch.addmm, bias, x, w))
            flops, nbytes = 2.0 * tokens * rank * 2 * d, 2.0 * (2 * d * rank + 2 * tokens * d)
            rows.append({"kernel": "lowrank", "tokens": tokens, "rank": rank, "d": d, "fused_ms": round(fused, 4),
                         "two_gemm_ms": round(two, 4), "dense_ms": round(dense, 4), "speedup": round(two / fused, 2),
                         **roofline(flops, nbytes, fused, peak)})
    return rows


def polyact_cases(dev: str, dtype: torch.dtype, quick: bool, bench, peak) -> list[dict[str, Any]]:
    from veil.engine.kernels.poly import linear_polyact

    d = 64 if quick else 2048
    rows = []
    for tokens in ([16] if quick else [64, 1024]):
        g = torch.Generator(device="cpu").manual_seed(tokens)
        x, w = torch.randn(tokens, d, generator=g).to(dev, dtype), (torch.randn(d, d, generator=g) / d**0.5).to(dev, dtype)
        bias, coeffs = torch.randn(d, generator=g).to(dev, dtype), (torch.randn(d, 3, generator=g) * 0.1).to(dev)
        fused = bench(partial(linear_polyact, x, w, bias, coeffs))
        unfused = bench(partial(linear_then_poly, x, w, bias, coeffs))
        flops, nbytes = 2.0 * tokens * d * d, 2.0 * (d * d + 2 * tokens * d)
        rows.append({"kernel": "linear_polyact", "tokens": tokens, "d": d, "fused_ms": round(fused, 4),
                     "unfused_ms": round(unfused, 4), "speedup": round(unfused / fused, 2),
                     **roofline(flops, nbytes, fused, peak)})
    return rows


def markdown(results: dict[str, Any], command: str) -> str:
    env, rows = results["environment"], results["rows"]
    out = [f"### Triton kernels on {env['gpu']}", "",
           f"`{command}` — {env['date']}, torch {env['torch']}, triton {env['triton']}, fp16, do_bench medians.", "",
           "| kernel | shape | fused ms | baseline ms | speedup | TFLOP/s | GB/s | of roofline |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        shape = ", ".join(f"{k} {r[k]}" for k in ("tokens", "adapters", "rank", "d") if k in r)
        base = r.get("loop_ms", r.get("two_gemm_ms", r.get("unfused_ms")))
        out.append(f"| {r['kernel']} | {shape} | {r['fused_ms']} | {base} | {r['speedup']}x | {r['tflops']} | "
                   f"{r['gbs']} | {r['roofline_frac']} |")
    out += ["", "Baselines: lora = loop over the batch's adapters (PyTorch); lowrank = `addmm(b, x@U, V)` (dense "
            "`x@W` in the JSON); linear_polyact = `F.linear` then the polynomial.", "",
            "Targets: " + "; ".join(f"{k}: {'met' if v else 'MISSED'}" for k, v in results["targets"].items())]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argument_parser(__doc__)
    parser.add_argument("--interpret", action="store_true", help="CPU smoke run in Triton's interpreter, tiny shapes")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available() and not args.interpret:
        print("gpu_kernels: no CUDA device here; nothing measured (use --interpret with TRITON_INTERPRET=1 for a "
              "CPU smoke run)", file=sys.stderr)
        return 0
    import triton

    dev, dtype = ("cpu", torch.float32) if args.interpret else ("cuda", torch.float16)
    gpu = "CPU (Triton interpreter)" if args.interpret else torch.cuda.get_device_name()
    peak = next((p for name, p in PEAKS.items() if name in gpu), None)
    bench = timer(args.interpret)
    rows = (lora_cases(dev, dtype, args.interpret, bench, peak) + lowrank_cases(dev, dtype, args.interpret, bench, peak)
            + polyact_cases(dev, dtype, args.interpret, bench, peak))
    lora = [r["speedup"] for r in rows if r["kernel"] == "lora"]
    low = [r["speedup"] for r in rows if r["kernel"] == "lowrank" and r["rank"] <= r["d"] // 4]
    results = {"environment": {"date": time.strftime("%Y-%m-%d"), "gpu": gpu, "torch": torch.__version__,
                               "triton": triton.__version__, "peak_tflops_tbs": peak},
               "rows": rows,
               "targets": {"mixed-adapter LoRA >= 3x the adapter loop (every case)": min(lora) >= TARGETS["lora_speedup_min"],
                           "fused low-rank >= 1.3x (x@U)@V at rank <= d/4 (every case)":
                               min(low) >= TARGETS["lowrank_speedup_min"]}}
    for r in rows:
        print(json.dumps(r))
    if args.interpret:  # timings of the interpreter mean nothing: never written to results.md
        (args.out / "results").mkdir(parents=True, exist_ok=True)
        (args.out / "results" / f"{SECTION}_interpret.json").write_text(json.dumps(results, indent=1))
        return 0
    (args.out / "results").mkdir(parents=True, exist_ok=True)
    (args.out / "results" / f"{SECTION}.json").write_text(json.dumps(results, indent=1))
    write_section(args.out / "results.md", SECTION, markdown(results, "python benchmarks/gpu_kernels.py"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
