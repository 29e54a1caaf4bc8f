"""Tiny models and problems shared by the optimizer tests (fp64 where a test compares to 1e-8)."""

from __future__ import annotations

import pytest
import torch
from torch import nn


class LoraPair(nn.Module):
    """One LoRA layer laid out as veil's ``LoraLinear`` stores it: ``lora_A`` (r, in), ``lora_B`` (out, r)."""

    def __init__(self, n_in: int, n_out: int, r: int, dtype: torch.dtype = torch.float64) -> None:
        super().__init__()
        self.lora_A = nn.Linear(n_in, r, bias=False, dtype=dtype)
        self.lora_B = nn.Linear(r, n_out, bias=False, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lora_B(self.lora_A(x))


class LoraNet(nn.Module):
    """A frozen two-layer net with LoRA pairs on both linears and a trainable output bias (a non-pair param)."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.w1 = nn.Parameter(torch.randn(16, 10, generator=g) / 3, requires_grad=False)
        self.w2 = nn.Parameter(torch.randn(4, 16, generator=g) / 4, requires_grad=False)
        self.l1, self.l2 = LoraPair(10, 16, 3, torch.float32), LoraPair(16, 4, 3, torch.float32)
        self.bias = nn.Parameter(torch.zeros(4))
        with torch.no_grad():
            for layer in (self.l1, self.l2):  # LoRA's own start: B = 0
                layer.lora_A.weight.copy_(torch.randn(layer.lora_A.weight.shape, generator=g) / 3)
                layer.lora_B.weight.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(x @ self.w1.T + self.l1(x))
        return h @ self.w2.T + self.l2(h) + self.bias


@pytest.fixture
def regression() -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs (128, 10) and targets (128, 4) of a teacher LoraNet whose adapters were perturbed."""
    g = torch.Generator().manual_seed(123)
    x = torch.randn(128, 10, generator=g)
    teacher = LoraNet(seed=0)
    with torch.no_grad():
        for layer in (teacher.l1, teacher.l2):
            layer.lora_B.weight.copy_(torch.randn(layer.lora_B.weight.shape, generator=g) / 2)
        teacher.bias.fill_(0.3)
        y = teacher(x)
    return x, y


def mlp(seed: int = 0) -> nn.Module:
    """A small MLP with matrices, biases and a 'classifier' head (an Adam-trained module for RACS)."""
    torch.manual_seed(seed)
    net = nn.Sequential()
    net.add_module("fc", nn.Linear(10, 24))
    net.add_module("act", nn.Tanh())
    net.add_module("classifier", nn.Linear(24, 4))
    return net


@pytest.fixture
def pair_factory():
    return LoraPair


@pytest.fixture
def lora_net_factory():
    return LoraNet


@pytest.fixture
def mlp_factory():
    return mlp
