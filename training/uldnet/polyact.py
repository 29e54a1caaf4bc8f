"""PolyAct (ULD-Net, ICLR 2026): a trainable polynomial activation of degree <= 3.

    PolyAct(x) = Dropout( sum_{i=0..n} alpha_i c_i x^i )

alpha_i are trained; c_i are fixed factors that act as per-coefficient learning-rate scalers. The
coefficients start from a least-squares fit of ReLU (or GELU) under x ~ N(0, 1), which is where PolyNorm
puts its outputs. Evaluated by Horner's rule, so degree n costs n levels with plaintext coefficients.
Reference: ../shared/specs/he.md §1.4.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
import torch
from torch import nn

from .config import PolyActConfig


@lru_cache(maxsize=16)
def gaussian_fit(target: str, degree: int) -> tuple[float, ...]:
    """Coefficients (c_0..c_degree) minimising E[(p(x) - f(x))^2] for x ~ N(0, 1), f = relu or gelu."""
    # A dense grid with the kink of ReLU on a node: Gauss-Hermite quadrature converges slowly on kinks.
    nodes = np.linspace(-12.0, 12.0, 240_001)
    weights = np.exp(-0.5 * nodes**2)
    if target == "relu":
        values = np.maximum(nodes, 0.0)
    elif target == "gelu":
        values = 0.5 * nodes * (1.0 + np.vectorize(math.erf)(nodes / math.sqrt(2.0)))
    else:
        raise ValueError(f"gaussian_fit.target: expected 'relu' or 'gelu', received {target!r}")
    vander = np.vander(nodes, degree + 1, increasing=True)
    sw = np.sqrt(weights)[:, None]
    coeffs, *_ = np.linalg.lstsq(vander * sw, values * sw[:, 0], rcond=None)
    return tuple(float(c) for c in coeffs)


def initial_coefficients(config: PolyActConfig) -> list[float]:
    """The polynomial PolyAct starts from, as plain coefficients c_0..c_n."""
    n = config.degree
    if config.init == "relu_fit":
        return list(gaussian_fit("relu", n))
    if config.init == "gelu_fit":
        return list(gaussian_fit("gelu", n))
    if config.init == "identity":
        return [0.0, 1.0, 0.0, 0.0][: n + 1]
    return [0.0, 0.0, 1.0, 0.0][: n + 1]  # "square"


class PolyAct(nn.Module):
    """Trainable polynomial activation.

    Args:
        num_channels: channels of the input (dim 1 of (B, C, H, W), last dim otherwise); used when
            ``config.per_channel`` is set.
        config: PolyActConfig.
        channel_dim: 1 for feature maps, -1 for (B, D) / (B, N, D).

    Example:
        >>> act = PolyAct(8, PolyActConfig(degree=2))
        >>> act(torch.randn(3, 8)).shape
        torch.Size([3, 8])
    """

    def __init__(self, num_channels: int, config: PolyActConfig, channel_dim: int = -1) -> None:
        super().__init__()
        self.config, self.channel_dim = config, channel_dim
        scales = torch.tensor(config.scales[: config.degree + 1], dtype=torch.float32)
        coeffs = torch.tensor(initial_coefficients(config), dtype=torch.float32)
        channels = num_channels if config.per_channel else 1
        alpha = (coeffs / scales).repeat(channels, 1)  # (channels, degree + 1)
        self.register_buffer("scales", scales)
        if config.trainable:
            self.alpha = nn.Parameter(alpha)
        else:
            self.register_buffer("alpha", alpha)
        self.dropout = nn.Dropout(config.dropout) if config.dropout > 0 else nn.Identity()

    def coefficients(self) -> torch.Tensor:
        """Effective coefficients alpha_i * c_i, shape (channels, degree + 1)."""
        return self.alpha * self.scales

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        coeffs = self.coefficients()
        if self.channel_dim == 1 and x.dim() > 2:
            coeffs = coeffs.reshape(coeffs.shape[0], *([1] * (x.dim() - 2)), coeffs.shape[1])  # (C, 1, 1, n+1)
        if self.config.degree == 0:
            return self.dropout(coeffs[..., 0].expand_as(x))
        y = torch.addcmul(coeffs[..., -2], x, coeffs[..., -1])  # Horner: (((a3 x + a2) x + a1) x + a0), fused
        for i in range(self.config.degree - 2, -1, -1):
            y = torch.addcmul(coeffs[..., i], y, x)
        return self.dropout(y)

    def extra_repr(self) -> str:
        return f"degree={self.config.degree}, per_channel={self.config.per_channel}, init={self.config.init}"
