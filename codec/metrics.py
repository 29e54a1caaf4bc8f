"""Distortion metrics on 8-bit RGB: PSNR and MS-SSIM (weight-free, as CompressAI's psnr-rgb / ms-ssim-rgb).

MS-SSIM uses ``pytorch_msssim`` (imported inside the function, so veil.codec loads without torch). Its five
scales need a smaller side above 160 pixels with the standard 11-tap window; smaller images use the largest
odd window that fits (down to 3 taps) and say so in :func:`ms_ssim_window`.
"""

from __future__ import annotations

import numpy as np


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    """PSNR in dB of two (H, W, 3) uint8 images (peak 255); inf when identical."""
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return float("inf") if mse == 0 else 10.0 * np.log10(255.0 ** 2 / mse)


def ms_ssim_window(height: int, width: int) -> int:
    """The Gaussian window MS-SSIM uses at this size: 11 (standard) when the smaller side exceeds 160."""
    side = min(height, width)
    win = 11
    while win > 3 and (win - 1) * 16 >= side:
        win -= 2
    if (win - 1) * 16 >= side:
        raise ValueError(f"MS-SSIM: expected a smaller side > 32 pixels, received {height}x{width}")
    return win


def ms_ssim(a: np.ndarray, b: np.ndarray) -> float:
    """MS-SSIM of two (H, W, 3) uint8 images (data range 255, five scales)."""
    import torch
    from pytorch_msssim import ms_ssim as _ms_ssim

    win = ms_ssim_window(*a.shape[:2])
    x = torch.from_numpy(np.ascontiguousarray(a.transpose(2, 0, 1))).float()[None]
    y = torch.from_numpy(np.ascontiguousarray(b.transpose(2, 0, 1))).float()[None]
    with torch.no_grad():
        return float(_ms_ssim(x, y, data_range=255, win_size=win))
