"""Scale geometry of the multi-scale residual quantizer, shared by training (torch) and the runtime (numpy).

A latent grid of ``h x w`` cells (the image padded to a multiple of ``stride`` pixels, divided by it) is
quantized at ``K`` scales. Scale ``k`` has ``ceil(h * s_k / s_K) x ceil(w * s_k / s_K)`` cells, so a scale
always covers the same physical stride in pixels whatever the image size (a 512x512 image with stride 16
and ``scales=(1,2,3,4,6,8,12,16,24,32)`` gets exactly those side lengths). Resampling between a scale and the
latent grid is a pair of small matrices (adaptive area averaging down, bilinear with half-pixel centres up,
as ``torch.nn.functional.interpolate(mode="area"|"bilinear", align_corners=False)``); the same matrices are
used by torch in training and by numpy in the runtime, so both sides compute the same thing.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np


def latent_size(height: int, width: int, stride: int) -> tuple[int, int]:
    """Latent grid of an image padded up to a multiple of ``stride`` pixels."""
    return math.ceil(height / stride), math.ceil(width / stride)


def scale_sizes(h: int, w: int, scales: tuple[int, ...] | list[int]) -> list[tuple[int, int]]:
    """``(h_k, w_k)`` for every scale of an ``h x w`` latent grid; the last scale is the grid itself."""
    top = scales[-1]
    return [(math.ceil(h * s / top), math.ceil(w * s / top)) for s in scales]


@lru_cache(maxsize=256)
def area_matrix(n_out: int, n_in: int) -> np.ndarray:
    """(n_out, n_in) float32: adaptive average pooling along one axis (torch's ``area`` bins)."""
    m = np.zeros((n_out, n_in), np.float64)
    for i in range(n_out):
        start, end = (i * n_in) // n_out, -((-(i + 1) * n_in) // n_out)  # floor, ceil
        m[i, start:end] = 1.0 / (end - start)
    m.setflags(write=False)
    return m.astype(np.float32)


@lru_cache(maxsize=256)
def bilinear_matrix(n_out: int, n_in: int) -> np.ndarray:
    """(n_out, n_in) float32: linear interpolation with half-pixel centres (align_corners=False) along one axis."""
    m = np.zeros((n_out, n_in), np.float64)
    scale = n_in / n_out
    for i in range(n_out):
        src = max((i + 0.5) * scale - 0.5, 0.0)
        lo = min(math.floor(src), n_in - 1)
        hi = min(lo + 1, n_in - 1)
        frac = src - lo
        m[i, lo] += 1.0 - frac
        m[i, hi] += frac
    return m.astype(np.float32)


def down(x: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """(C, H, W) -> (C, h, w) area average; einsum without BLAS, so the sum order never depends on threads."""
    a, b = area_matrix(size[0], x.shape[1]), area_matrix(size[1], x.shape[2])
    return np.einsum("ih,chw,jw->cij", a, x, b, optimize=False).astype(np.float32)


def up(x: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """(C, h, w) -> (C, H, W) bilinear; einsum without BLAS (thread-independent)."""
    a, b = bilinear_matrix(size[0], x.shape[1]), bilinear_matrix(size[1], x.shape[2])
    return np.einsum("ih,chw,jw->cij", a, x, b, optimize=False).astype(np.float32)


def positions(hk: int, wk: int, n_freq: int) -> np.ndarray:
    """(hk*wk, 4*n_freq) float32 sinusoidal features of the normalised cell centres (rows, then columns)."""
    y = (np.arange(hk, dtype=np.float64) + 0.5) / hk
    x = (np.arange(wk, dtype=np.float64) + 0.5) / wk
    yy, xx = np.meshgrid(y, x, indexing="ij")
    freqs = np.pi * 2.0 ** np.arange(n_freq, dtype=np.float64)  # (F,)
    parts = [f(c.reshape(-1, 1) * freqs) for c in (yy, xx) for f in (np.sin, np.cos)]
    return np.concatenate(parts, axis=1).astype(np.float32)


def neighbourhood(feat: np.ndarray, quant: float) -> np.ndarray:
    """(C, h, w) -> (h*w, 9*C): each cell's 3x3 neighbourhood (zero padded), rounded to a 1/quant grid.

    Rounding makes the prior's input a function of the integer tokens alone in practice: tiny float
    differences in how the accumulated code was summed cannot change it.
    """
    c, h, w = feat.shape
    padded = np.pad(np.round(feat * quant) / quant, ((0, 0), (1, 1), (1, 1)))
    taps = [padded[:, dy:dy + h, dx:dx + w] for dy in range(3) for dx in range(3)]  # 9 x (C, h, w)
    return np.stack(taps, 0).reshape(9 * c, h * w).T.astype(np.float32)  # (h*w, 9C)
