"""PolyNorm (ULD-Net, ICLR 2026): per-sample normalization whose inverse square root is a local quadratic.

    PolyNorm[x] = (x - E[x]) * g(mu * v) * sqrt(mu / Var_bar),   v = Var[x] / Var_bar
    g(x) = a (x - b)^2 + c,  a = -1 / (4 (1 - k) mu^(5/2)),  b = k mu,  c = (5 - k) / (4 sqrt(mu))

Var_bar is the running mean of the per-sample variance, tracked in training and frozen in eval. During
warm-up the layer is an exact LayerNorm over the same axes (it still tracks Var_bar), which is how the
paper initialises Var_bar before switching to the polynomial. Reference: ../shared/specs/he.md §1.2-1.3.

``PolyNormConfig.channel_prenorm`` (veil's addition, not the paper's) puts a BatchNorm2d without gain or bias in
front: each channel standardized with batch statistics in training and running ones in eval, then the per-sample
statistics as above. In eval it is a per-channel affine map, so the exported graph stays polynomial and the HE
compiler folds it into the preceding linear op (no level). On photos32 it is worth 12.5 points to the PolyResNet-20
at 8 epochs (docs/results.md § uldnet_ablation): per-sample statistics alone leave channels of different scales
to share one normalization.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import nn

from .config import PolyNormConfig

Layout = Literal["channels", "tokens"]


class PolyNorm(nn.Module):
    """Polynomial per-sample normalization.

    Args:
        num_features: channels C of a (B, C, H, W) map, or the feature size D of (B, D) / (B, N, D) inputs.
        config: PolyNormConfig (k, mu, momentum, statistics axis for tokens).
        layout: "channels" for feature maps (statistics over C, H, W), "tokens" for (B, D) or (B, N, D).

    Example:
        >>> norm = PolyNorm(16, PolyNormConfig(), layout="channels")
        >>> norm(torch.randn(4, 16, 8, 8)).shape
        torch.Size([4, 16, 8, 8])
    """

    def __init__(self, num_features: int, config: PolyNormConfig, layout: Layout = "tokens") -> None:
        super().__init__()
        self.config, self.layout, self.num_features = config, layout, num_features
        a, b, c = config.quadratic()
        self.a, self.b, self.c = a, b, c
        self.exact = False  # True during the LayerNorm warm-up
        self.register_buffer("running_var", torch.ones(()))
        self.register_buffer("num_batches_tracked", torch.zeros((), dtype=torch.long))
        shape = (num_features, 1, 1) if layout == "channels" else (num_features,)
        self.weight = nn.Parameter(torch.ones(shape)) if config.affine else None
        self.bias = nn.Parameter(torch.zeros(shape)) if config.affine else None
        self.last_v: torch.Tensor | None = None  # relative variances of the last training batch (penalties)
        if config.channel_prenorm and layout != "channels":
            raise ValueError(f"PolyNormConfig.channel_prenorm: expected only for feature maps (layout 'channels'), "
                             f"received layout {layout!r}")
        self.prenorm = nn.BatchNorm2d(num_features, affine=False) if config.channel_prenorm else None

    def g(self, x: torch.Tensor) -> torch.Tensor:
        """The quadratic stand-in for 1/sqrt(x)."""
        return self.a * (x - self.b) ** 2 + self.c

    def _reduce_dims(self, x: torch.Tensor) -> tuple[int, ...]:
        if self.layout == "channels":
            if x.dim() != 4:
                raise ValueError(f"PolyNorm(layout='channels'): expected input (B, C, H, W), received shape {tuple(x.shape)}")
            return (1, 2, 3)
        if x.dim() == 3 and self.config.token_stats == "sample":
            return (1, 2)
        return (-1,)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dims = self._reduce_dims(x)
        if self.prenorm is not None:
            x = self.prenorm(x)
        var, mean = torch.var_mean(x, dim=dims, correction=0, keepdim=True)  # per-sample (population) statistics
        if self.training:
            with torch.no_grad():
                m = self.config.momentum if self.num_batches_tracked > 0 else 1.0
                self.running_var.lerp_(var.mean().to(self.running_var.dtype), m)
                self.num_batches_tracked += 1
        v = var / self.running_var
        if self.training:
            self.last_v = v  # the penalties' input (the trainer uses it after warm-up, or throughout)
        if self.exact:
            scale = torch.rsqrt(var + self.config.eps)
        else:
            scale = self.g(self.config.mu * v) * torch.sqrt(self.config.mu / self.running_var)
            if self.training and self.config.train_fallback:
                scale = torch.where(self.config.mu * v > self.b, torch.rsqrt(var + self.config.eps), scale)
        # (x - E[x]) * scale * weight + bias as one fused pass over x: the per-sample factors are small tensors
        if self.weight is not None:
            scale = scale * self.weight
            return torch.addcmul(self.bias - mean * scale, x, scale)
        return (x - mean) * scale

    def extra_repr(self) -> str:
        return (f"{self.num_features}, layout={self.layout}, g(x)={self.a:.6f}(x-{self.b:g})^2+{self.c:.6f}, "
                f"mode={'layernorm-warmup' if self.exact else 'polynomial'}")


def set_warmup(model: nn.Module, exact: bool) -> None:
    """Switch every PolyNorm of ``model`` to the exact LayerNorm (warm-up) or to the polynomial."""
    for module in model.modules():
        if isinstance(module, PolyNorm):
            module.exact = exact


def variance_penalty(model: nn.Module, lambda1: float, lambda2: float) -> torch.Tensor | None:
    """L1 = lambda1 * mean_i v_i and L2 = lambda2 * mean_i (v_i - 1)^2 over the PolyNorm layers' last batch."""
    terms = [(m.last_v.mean(), ((m.last_v - 1.0) ** 2).mean()) for m in model.modules()
             if isinstance(m, PolyNorm) and m.last_v is not None]
    if not terms:
        return None
    l1 = torch.stack([t[0] for t in terms]).mean()
    l2 = torch.stack([t[1] for t in terms]).mean()
    return lambda1 * l1 + lambda2 * l2


def clear_variances(model: nn.Module) -> None:
    """Drop the stored relative variances (they hold the autograd graph of the last batch)."""
    for module in model.modules():
        if isinstance(module, PolyNorm):
            module.last_v = None


def output_std(v: float, config: PolyNormConfig) -> float:
    """Output std of PolyNorm for an input whose variance is v times Var_bar: sqrt(v) g(mu v) sqrt(mu)."""
    a, b, c = config.quadratic()
    return math.sqrt(v) * (a * (config.mu * v - b) ** 2 + c) * math.sqrt(config.mu)
