"""ARPC codec rate-distortion on the held-out photos vs JPEG, WebP and AVIF at matched bpp, in one run.

The codec shipped with veil (veil/codec/default: tokenizer then prior on the skimage photos, astronaut,
coffee and chelsea held out; how it was trained is in docs/codec.md), or the one given by ``--model``, is measured at every number of scales sent, k = 1..K, and at each target bpp
(the most scales within it), against each classical codec's best MS-SSIM within the same budget over quality
x downscale factor (whole files counted, plus 4 bytes of original size when downscaled). Also: encode +
decode time of a 256x256 image on 2 threads, bit-exact decoding across runs and thread counts, and rate
monotonicity in k. Writes docs/results/codec_rd.json, the codec_rd section of results.md, docs/img/codec_rd.png.

    .venv/bin/python benchmarks/codec_rd.py                  # the shipped default model
    .venv/bin/python benchmarks/codec_rd.py --model runs/codec
    .venv/bin/python benchmarks/codec_rd.py --quick --out /tmp/docs   # smoke run: small crops, one target, WebP
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from common import save_results
from veil.codec.cli import default_model
from veil.codec.evaluate import bench, curve, plot
from veil.codec.images import bundled
from veil.codec.runtime import CodecRuntime

ROOT = Path(__file__).resolve().parents[1]
TARGETS = [0.01, 0.02, 0.05, 0.1]


def timing(folder: Path, pixels: np.ndarray, repeats: int) -> dict[str, float]:
    """Median encode and decode seconds of a 256x256 image (all scales) with 2 ONNX Runtime threads."""
    runtime = CodecRuntime(folder, threads=2)
    enc, dec = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        data = runtime.encode(pixels).data
        enc.append(time.perf_counter() - start)
        start = time.perf_counter()
        runtime.decode(data)
        dec.append(time.perf_counter() - start)
    return {"encode_s": float(np.median(enc)), "decode_s": float(np.median(dec)),
            "total_s": float(np.median(enc) + np.median(dec)), "threads": 2, "size": list(pixels.shape[:2])}


def determinism(folder: Path, pixels: np.ndarray, K: int) -> dict[str, Any]:
    """SHA-256 of decoded pixels over two runtimes x thread counts 1 and 2, greedy and seeded-sampled modes."""
    one, two = CodecRuntime(folder, threads=1), CodecRuntime(folder, threads=2)
    out = {}
    for mode, k in (("greedy", K // 2), ("sample", K // 2), ("greedy", K)):
        data = one.encode(pixels, k=k, mode=mode, seed=11).data
        shas = {hashlib.sha256(r.decode(data).tobytes()).hexdigest() for r in (one, two, one, two)}
        out[f"{mode}_k{k}"] = len(shas) == 1
    return {"bit_exact": all(out.values()), "cases": out}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=None,
                        help="exported codec or run folder (default: the model shipped with veil)")
    parser.add_argument("--quick", action="store_true", help="smoke run: 192x192 crops, one target, WebP")
    parser.add_argument("--out", type=Path, default=ROOT / "docs", help="docs folder (results.md, results/, img/)")
    args = parser.parse_args(argv)
    folder, source = default_model(args.model)
    images = bundled()
    if args.quick:
        images = {n: np.ascontiguousarray(im[:192, :192]) for n, im in images.items()}
    targets, codecs = ([0.1], ["webp"]) if args.quick else (TARGETS, None)
    runtime = CodecRuntime(folder, threads=1)
    result = bench(runtime, images, targets, codecs)
    result["curve"] = [{k: v for k, v in c.items() if k != "images"} for c in curve(runtime, images)]
    result["curve_mean_mode"] = [{k: v for k, v in c.items() if k != "images"} for c in curve(runtime, images, "mean")]
    bpps = [c["mean"]["bpp"] for c in result["curve"]]
    square = np.ascontiguousarray(bundled(("astronaut",))["astronaut"][128:384, 128:384])
    command = "python benchmarks/codec_rd.py" + (f" --model {args.model}" if args.model else "") + (
        " --quick" if args.quick else "")
    manifest = json.loads((folder.parent / "veil.json").read_text())
    report = {"command": command,
              "model": {"folder": str(folder), "source": source, "hash": runtime.hash,
                        "training_images": manifest.get("training_images", []),
                        "veil": manifest.get("source", {})},
              "images": {n: list(im.shape[:2]) for n, im in images.items()},
              "bpp_strictly_increasing": all(a < b for a, b in itertools.pairwise(bpps)),
              "timing_256": timing(folder, square, 2 if args.quick else 5),
              "determinism": determinism(folder, square, runtime.geo.K), **result}
    plot(result, args.out / "img" / "codec_rd.png")
    save_results(args.out, "codec_rd", report, markdown(report))
    print(json.dumps({"rows": [summary(r, report["codecs"]) for r in report["rows"]],
                      "timing_256": report["timing_256"], "determinism": report["determinism"]["bit_exact"],
                      "bpp_strictly_increasing": report["bpp_strictly_increasing"]}, indent=1))
    return 0


def summary(row: dict[str, Any], codecs: list[str]) -> dict[str, Any]:
    """Our mean point at a target, the best anchor's, and the per-image wins on MS-SSIM."""
    ours = row["veil"]["mean"]
    anchors = {c: row[c]["mean"] for c in codecs if row[c]["mean"] is not None}
    best = max(anchors, key=lambda c: anchors[c]["ms_ssim"]) if anchors else None
    wins = 0
    for image in row["veil"]["images"]:
        rivals = [row[c]["images"][image["image"]]["ms_ssim"] for c in codecs if row[c]["images"][image["image"]]]
        wins += int(not rivals or image["ms_ssim"] > max(rivals))
    return {"target_bpp": row["target_bpp"], "veil": {k: ours[k] for k in ("bpp", "ms_ssim", "psnr")},
            "best_anchor": best, "anchor": anchors.get(best), "wins": wins, "images": len(row["veil"]["images"]),
            "unreachable": [c for c in codecs if row[c]["mean"] is None]}


def markdown(report: dict[str, Any]) -> str:
    codecs = report["codecs"]
    lines = ["### ARPC codec: rate-distortion on the held-out photos (astronaut, coffee, chelsea)", "",
             f"`{report['command']}` — model `{report['model']['hash'][:12]}` ({report['model']['source']}, "
             f"trained on {len(report['model']['training_images'])} photos, none of these); every bpp is real bytes (header, chunk "
             "lengths, CRC) over the original pixels. Anchors: best MS-SSIM within the same budget over quality x "
             "downscale (whole files + 4 bytes of size). Greedy decoding of the scales not sent.", "",
             "| target bpp | veil bpp | veil MS-SSIM | veil PSNR | "
             + " | ".join(f"{c} bpp / MS-SSIM / PSNR" for c in codecs) + " | veil wins (images) |",
             "|" + "---|" * (5 + len(codecs))]
    for row in report["rows"]:
        s, ours = summary(row, codecs), row["veil"]["mean"]
        cells = []
        for c in codecs:
            m = row[c]["mean"]
            cells.append("unreachable" if m is None else f"{m['bpp']:.4f} / {m['ms_ssim']:.3f} / {m['psnr']:.2f}")
        lines.append(f"| {row['target_bpp']} | {ours['bpp']:.4f} | {ours['ms_ssim']:.3f} | {ours['psnr']:.2f} | "
                     + " | ".join(cells) + f" | {s['wins']}/{s['images']} |")
    lines += ["", "| k | bpp | raw bpp (before LRE) | MS-SSIM greedy | PSNR greedy | MS-SSIM mean-mode | PSNR mean-mode |",
              "|---|---|---|---|---|---|---|"]
    for g, m in zip(report["curve"], report["curve_mean_mode"], strict=True):
        lines.append(f"| {g['k']} | {g['mean']['bpp']:.4f} | {g['mean']['raw_bpp']:.4f} | {g['mean']['ms_ssim']:.3f} | "
                     f"{g['mean']['psnr']:.2f} | {m['mean']['ms_ssim']:.3f} | {m['mean']['psnr']:.2f} |")
    t, d = report["timing_256"], report["determinism"]
    lines += ["", f"bpp strictly increasing in k: **{report['bpp_strictly_increasing']}**. 256x256 encode + decode "
              f"(all scales, 2 threads): {t['encode_s']:.3f} + {t['decode_s']:.3f} = **{t['total_s']:.3f} s**. "
              f"Decoding bit-exact across runs and thread counts 1/2 (greedy and seeded-sampled): **{d['bit_exact']}**.",
              "", "![codec RD](img/codec_rd.png)"]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
