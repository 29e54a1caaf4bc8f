"""Tokens of the multi-scale bitwise residual quantizer, and the prior's input built from them (numpy only).

A token of scale ``k`` is a cell's ``bits[k]`` active bits (the group mask keeps the first ``bits[k]`` of the
``d`` channels; the masked ones are never sent and contribute 0). Its code value is ``alpha_k * (2 b - 1)``
per active channel. The sum of the upsampled codes of the scales is the quantized latent the decoder reads.

The prior sees, for every cell of scale ``k``, the 3x3 neighbourhood of the code accumulated over scales
``< k`` (area-downsampled to scale ``k``'s grid, VAR's next-scale input), sinusoidal features of the cell
centre, and the scale index. Encoder and decoder build it with this one function from the same tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .scales import down, neighbourhood, positions, scale_sizes, up


@dataclass(frozen=True)
class Geometry:
    """What both sides need to turn tokens into codes and prior inputs (read from codec.json)."""

    scales: tuple[int, ...]  # side lengths at the reference size (the last is the full latent grid)
    bits: tuple[int, ...]  # active bits per scale (the group mask)
    d: int  # channels of the latent (bits per token before masking)
    alphas: tuple[float, ...]  # code magnitude per scale (learned)
    stride: int  # pixels per latent cell
    n_freq: int  # sinusoidal frequencies per axis of the prior's position features
    quant: float  # grid of the prior's input features (1/quant)

    @property
    def K(self) -> int:
        return len(self.scales)

    def feature_dim(self) -> int:
        return 9 * self.d

    def pos_dim(self) -> int:
        return 4 * self.n_freq


def codes(bits: np.ndarray, k: int, geo: Geometry) -> np.ndarray:
    """(h_k, w_k, bits[k]) uint8 -> (d, h_k, w_k) float32 code of scale ``k`` (masked channels 0)."""
    hk, wk, m = bits.shape
    out = np.zeros((geo.d, hk, wk), np.float32)
    out[:m] = (np.float32(geo.alphas[k]) * (2.0 * bits.astype(np.float32) - 1.0)).transpose(2, 0, 1)
    return out


def accumulate(tokens: list[np.ndarray], h: int, w: int, geo: Geometry) -> np.ndarray:
    """(d, h, w) quantized latent: the sum of the upsampled codes of the given scales (in scale order)."""
    acc = np.zeros((geo.d, h, w), np.float32)
    for k, bits in enumerate(tokens):
        acc = acc + up(codes(bits, k, geo), (h, w))
    return acc


def prior_inputs(tokens: list[np.ndarray], h: int, w: int, geo: Geometry, upto: int
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Inputs of the prior for scales ``0..upto`` from the tokens of scales ``0..upto-1``.

    Returns:
        feats (1, L, 9d) float32, pos (1, L, 4F) float32, sid (1, L) int64, with L the cells of scales <= upto.
    """
    sizes = scale_sizes(h, w, geo.scales)
    acc = np.zeros((geo.d, h, w), np.float32)
    feats, pos, sid = [], [], []
    for k in range(upto + 1):
        hk, wk = sizes[k]
        feats.append(neighbourhood(down(acc, (hk, wk)), geo.quant))  # (hk*wk, 9d)
        pos.append(positions(hk, wk, geo.n_freq))  # (hk*wk, 4F)
        sid.append(np.full(hk * wk, k, np.int64))
        if k < upto:
            acc = acc + up(codes(tokens[k], k, geo), (h, w))
    return (np.concatenate(feats)[None], np.concatenate(pos)[None], np.concatenate(sid)[None])


def raw_bits(h: int, w: int, geo: Geometry, k: int) -> int:
    """Active bits of scales ``0..k-1`` before entropy coding (the raw budget of section A4)."""
    return sum(hk * wk * m for (hk, wk), m in zip(scale_sizes(h, w, geo.scales)[:k], geo.bits[:k], strict=True))
