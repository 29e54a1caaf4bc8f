"""Measure the codec on a set of images (CompressAI ``eval_model``-style) and against the classical anchors.

Every rate is computed from the real bytes of the stream (header, chunk lengths and CRC included) over the
original pixels. Times are wall-clock seconds of one encode and one decode per image.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from veil.progress import progress as progress_bar

from .baselines import Anchor, available
from .metrics import ms_ssim, psnr
from .runtime import CodecRuntime


def _mean(rows: list[dict[str, Any]], keys: tuple[str, ...]) -> dict[str, float]:
    return {key: float(np.mean([r[key] for r in rows])) for key in keys}


def evaluate(runtime: CodecRuntime, images: dict[str, np.ndarray], k: int | None = None,
             target_bpp: float | None = None, mode: str = "greedy", seed: int = 0) -> dict[str, Any]:
    """bpp, PSNR, MS-SSIM, encode and decode seconds per image and their mean."""
    rows = []
    for name, pixels in images.items():
        start = time.perf_counter()
        encoded = runtime.encode(pixels, k=k, target_bpp=target_bpp, mode=mode, seed=seed)
        enc_s = time.perf_counter() - start
        start = time.perf_counter()
        out = runtime.decode(encoded.data)
        dec_s = time.perf_counter() - start
        rows.append({"image": name, "height": pixels.shape[0], "width": pixels.shape[1], "k": encoded.k,
                     "bytes": len(encoded.data), "bpp": encoded.bpp,
                     "cross_entropy_bpp": encoded.cross_entropy_bits / pixels.shape[0] / pixels.shape[1],
                     "raw_bpp": encoded.raw_bits / pixels.shape[0] / pixels.shape[1],
                     "psnr": psnr(pixels, out), "ms_ssim": ms_ssim(pixels, out),
                     "encoding_time": enc_s, "decoding_time": dec_s})
    keys = ("bpp", "cross_entropy_bpp", "raw_bpp", "psnr", "ms_ssim", "encoding_time", "decoding_time")
    return {"model_hash": runtime.hash, "mode": mode, "k": k, "target_bpp": target_bpp,
            "mean": _mean(rows, keys), "images": rows}


def curve(runtime: CodecRuntime, images: dict[str, np.ndarray], mode: str = "greedy",
          progress: bool = False) -> list[dict[str, Any]]:
    """Our rate-distortion curve: :func:`evaluate` at every number of scales sent, k = 1..K."""
    scales = progress_bar(range(1, runtime.geo.K + 1), desc=f"codec curve ({len(images)} images, k = 1..K)",
                          enabled=progress)
    return [evaluate(runtime, images, k=k, mode=mode) for k in scales]


def bench(runtime: CodecRuntime, images: dict[str, np.ndarray], targets: list[float],
          codecs: list[str] | None = None, mode: str = "greedy", progress: bool = False) -> dict[str, Any]:
    """Ours at each target (most scales within it) vs each anchor's best (quality x downscale) within it.

    With ``progress`` each target reports on stderr (a bar on a terminal, a line in a log)."""
    codecs = available() if codecs is None else codecs
    anchors = {codec: {name: Anchor(pixels, codec) for name, pixels in images.items()} for codec in codecs}
    rows: list[dict[str, Any]] = []
    for target in progress_bar(targets, desc=f"codec bench ({len(images)} images, {len(codecs)} anchors)",
                               enabled=progress):
        ours = evaluate(runtime, images, target_bpp=target, mode=mode)
        row: dict[str, Any] = {"target_bpp": target, "veil": ours}
        for codec in codecs:
            points = {name: anchor.best_at(target) for name, anchor in anchors[codec].items()}  # file sizes cached
            per_image = {name: (p.to_dict() if p else None) for name, p in points.items()}
            reached = [p for p in points.values() if p is not None]
            row[codec] = {"images": per_image, "reached": len(reached) == len(points),
                          "mean": None if len(reached) < len(points) else
                          {key: float(np.mean([getattr(p, key) for p in reached])) for key in ("bpp", "psnr", "ms_ssim")}}
        rows.append(row)
    return {"model_hash": runtime.hash, "mode": mode, "codecs": codecs, "targets": targets, "rows": rows}


def plot(results: dict[str, Any], path: str | Path) -> Path:
    """Rate-distortion curves (MS-SSIM and PSNR against bpp) of a bench result (with its ``curve``) to a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, metric in zip(axes, ("ms_ssim", "psnr"), strict=True):
        if results.get("curve"):
            ax.plot([c["mean"]["bpp"] for c in results["curve"]], [c["mean"][metric] for c in results["curve"]],
                    "o-", label="veil ARPC (k = 1..K)")
        for codec in results["codecs"]:
            pts = [(r["target_bpp"], r[codec]["mean"]) for r in results["rows"] if r[codec]["mean"]]
            if pts:
                ax.plot([m["bpp"] for _, m in pts], [m[metric] for _, m in pts], "s--", label=f"{codec} (best q x scale)")
        for r in results["rows"]:
            ax.axvline(r["target_bpp"], color="0.85", lw=0.8, zorder=0)
        ax.set_xscale("log")
        ax.set_xlabel("bpp (whole files / original pixels)")
        ax.set_ylabel({"ms_ssim": "MS-SSIM (RGB)", "psnr": "PSNR (dB, RGB)"}[metric])
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle("held-out images: rate-distortion")
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
