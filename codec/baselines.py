"""Classical anchors through Pillow: JPEG, WebP and AVIF, each searched over quality AND downscale factor.

At the codec's rates (0.01-0.1 bpp) a full-resolution JPEG does not fit: its headers alone take hundreds of
bytes. The fair anchor (spec B2) is downscale -> encode -> decode -> upscale (bicubic), with the whole file
counted plus 4 bytes for the original size the receiver needs to upscale (when the image was downscaled).
For a bpp budget, :func:`best_at` keeps, per codec, the highest quality that fits at every factor and returns
the one with the best MS-SSIM; a codec that cannot fit at any factor is reported as unreachable.
"""

from __future__ import annotations

import io
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from PIL import Image, features

from .metrics import ms_ssim, psnr

FACTORS = (1, 2, 3, 4, 6, 8, 12, 16)
QUALITY = {"jpeg": (1, 95), "webp": (0, 100), "avif": (0, 100)}
SIZE_SIDE_INFO = 4  # bytes: the original H and W, needed to upscale a downscaled image


def available() -> list[str]:
    """The anchors this Pillow can write (AVIF needs Pillow built with libavif)."""
    return [c for c in QUALITY if c != "avif" or features.check("avif")]


@dataclass
class Point:
    """One classical encoding of one image."""

    codec: str
    quality: int
    factor: int
    bytes: int
    bpp: float
    psnr: float | None = None
    ms_ssim: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class Anchor:
    """Encodes one image with one classical codec at any (quality, factor), caching the file sizes."""

    def __init__(self, pixels: np.ndarray, codec: str) -> None:
        if codec not in available():
            raise ValueError(f"codec: expected one of {available()}, received {codec!r}")
        self.pixels, self.codec = pixels, codec
        self.height, self.width = pixels.shape[:2]
        self._small: dict[int, Image.Image] = {}
        self._files: dict[tuple[int, int], bytes] = {}

    def file(self, quality: int, factor: int) -> bytes:
        key = (quality, factor)
        if key not in self._files:
            if factor not in self._small:
                size = (max(1, round(self.width / factor)), max(1, round(self.height / factor)))
                self._small[factor] = Image.fromarray(self.pixels).resize(size, Image.Resampling.LANCZOS)
            buf = io.BytesIO()
            self._small[factor].save(buf, format=self.codec.upper(), quality=quality)
            self._files[key] = buf.getvalue()
        return self._files[key]

    def size_bytes(self, quality: int, factor: int) -> int:
        return len(self.file(quality, factor)) + (SIZE_SIDE_INFO if factor > 1 else 0)

    def decoded(self, quality: int, factor: int) -> np.ndarray:
        img = Image.open(io.BytesIO(self.file(quality, factor))).convert("RGB")
        if img.size != (self.width, self.height):
            img = img.resize((self.width, self.height), Image.Resampling.BICUBIC)
        return np.asarray(img)

    def point(self, quality: int, factor: int) -> Point:
        n = self.size_bytes(quality, factor)
        out = self.decoded(quality, factor)
        return Point(self.codec, quality, factor, n, n * 8 / (self.height * self.width), psnr(self.pixels, out),
                     ms_ssim(self.pixels, out))

    def highest_quality_within(self, max_bytes: int, factor: int) -> int | None:
        """Binary search (file size grows with quality) for the highest quality whose file fits."""
        lo, hi = QUALITY[self.codec]
        if self.size_bytes(lo, factor) > max_bytes:
            return None
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if self.size_bytes(mid, factor) <= max_bytes else (lo, mid - 1)
        return lo

    def best_at(self, bpp: float) -> Point | None:
        """Best MS-SSIM within ``bpp`` over every factor (each at its highest fitting quality); None: unreachable."""
        max_bytes = int(bpp * self.height * self.width / 8)
        best = None
        for factor in FACTORS:
            if min(self.height, self.width) / factor < 8:
                continue
            quality = self.highest_quality_within(max_bytes, factor)
            if quality is None:
                continue
            candidate = self.point(quality, factor)
            if best is None or candidate.ms_ssim > best.ms_ssim:
                best = candidate
        return best
