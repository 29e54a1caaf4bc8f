"""Swap veil's training modules for export wrappers that call the ``veil::*`` custom ops.

The wrappers hold frozen, eval-mode constants (running variance, polynomial coefficients, RoPE tables),
so the exported graph carries them as attributes or initializers that the HE compiler can read.
"""

from __future__ import annotations

import copy

import torch
from torch import nn
from veil.training.uldnet import LinearAttention, PolyAct, PolyNorm
from veil.training.uldnet.polynorm import clear_variances

from . import ops  # noqa: F401  (registers torch.ops.veil.*)
from .errors import ExportError


class PolyNormOp(nn.Module):
    """PolyNorm as one ``veil::poly_norm`` call (eval mode, Var_bar frozen)."""

    def __init__(self, norm: PolyNorm, name: str) -> None:
        super().__init__()
        if norm.exact:
            raise ExportError(f"{name}: PolyNorm is still in its LayerNorm warm-up (exact=True), which is not "
                              "polynomial; call veil.training.uldnet.polynorm.set_warmup(model, False) first")
        shape = (norm.num_features, 1, 1) if norm.layout == "channels" else (norm.num_features,)
        weight = norm.weight.detach() if norm.weight is not None else torch.ones(shape)
        bias = norm.bias.detach() if norm.bias is not None else torch.zeros(shape)
        self.register_buffer("weight", weight.clone())
        self.register_buffer("bias", bias.clone())
        self.layout, self.token_stats = norm.layout, norm.config.token_stats
        self.a, self.b, self.c, self.mu = norm.a, norm.b, norm.c, norm.config.mu
        self.running_var = float(norm.running_var)
        self.prenorm = norm.prenorm is not None  # eval-mode BatchNorm without affine: x * scale + shift per channel
        if self.prenorm:
            bn = norm.prenorm
            scale = torch.rsqrt(bn.running_var.detach() + bn.eps)
            self.register_buffer("pre_scale", scale.reshape(-1, 1, 1).clone())
            self.register_buffer("pre_shift", (-bn.running_mean.detach() * scale).reshape(-1, 1, 1).clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.prenorm:
            x = x * self.pre_scale + self.pre_shift  # constants: the HE compiler folds them (no level)
        if self.layout == "channels":
            axes = [1, 2, 3]
        else:
            axes = [1, 2] if x.dim() == 3 and self.token_stats == "sample" else [-1]
        return torch.ops.veil.poly_norm(x, self.weight, self.bias, axes, self.a, self.b, self.c, self.mu, self.running_var)


class PolyActOp(nn.Module):
    """PolyAct as one ``veil::poly_act`` call with its coefficients as a constant (n+1, C) table."""

    def __init__(self, act: PolyAct) -> None:
        super().__init__()
        self.register_buffer("table", act.coefficients().detach().T.contiguous().clone())  # (n+1, C)
        self.channel_dim = act.channel_dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n1, channels = self.table.shape
        if self.channel_dim == 1 and x.dim() > 2:
            shape = (n1, 1, channels) + (1,) * (x.dim() - 2)  # (n+1, 1, C, 1, 1)
        else:
            shape = (n1,) + (1,) * (x.dim() - 1) + (channels,)  # (n+1, 1, ..., C)
        return torch.ops.veil.poly_act(x, self.table.reshape(shape))


class LinearAttentionOp(nn.Module):
    """LinearAttention as one ``veil::linear_attention`` call with its RoPE tables."""

    def __init__(self, attention: LinearAttention) -> None:
        super().__init__()
        self.register_buffer("rope_cos", attention.rope_cos.clone())
        self.register_buffer("rope_sin", attention.rope_sin.clone())

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        n = q.shape[-2]
        return torch.ops.veil.linear_attention(q, k, v, self.rope_cos[:n], self.rope_sin[:n])


def swap_for_export(model: nn.Module) -> nn.Module:
    """A deep copy of ``model`` (eval mode) with every veil layer replaced by its custom-op wrapper."""
    clear_variances(model)  # the last training batch's variances hold an autograd graph
    model = copy.deepcopy(model).eval()
    for name, module in list(model.named_modules()):
        if isinstance(module, PolyNorm):
            replacement: nn.Module = PolyNormOp(module, name)
        elif isinstance(module, PolyAct):
            replacement = PolyActOp(module)
        elif isinstance(module, LinearAttention):
            replacement = LinearAttentionOp(module)
        else:
            continue
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, child, replacement)
    return model
