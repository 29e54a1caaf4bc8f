"""Tiny byte-level MoE LMs (no hub) shared by the HEAPr tests: random-init ones and one trained on pydoc topics."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from veil.training.compress.calibration import Calibration
from veil.training.compress.heapr.workload import MoELMConfig, build_moe_lm, train_moe_lm
from veil.training.lm import load_pydoc_topics

TINY = dict(hidden_size=32, num_layers=2, num_heads=2, num_experts=4, top_k=2, expert_size=16, shared_expert_size=32,
            max_positions=64, batch_size=8, block_size=64, lr=5e-3)


def tiny_config(arch: str = "qwen2_moe", **changes: object) -> MoELMConfig:
    return MoELMConfig(arch=arch, **{**TINY, **changes})


def make_model(arch: str = "qwen2_moe", seed: int = 0, **changes: object) -> nn.Module:
    """A random-init tiny MoE LM in eval mode (fused transformers-v5 experts)."""
    return build_moe_lm(tiny_config(arch, **changes), seed=seed).eval()


def random_calibration(n: int = 8, length: int = 24, batch_size: int = 4, seed: int = 1) -> Calibration:
    g = torch.Generator().manual_seed(seed)
    return Calibration.from_tokens(torch.randint(0, 256, (n, length), generator=g), batch_size=batch_size)


@pytest.fixture(scope="session")
def corpus():
    return load_pydoc_topics()


@pytest.fixture(scope="session")
def trained(corpus) -> nn.Module:
    """A tiny Qwen2-MoE trained 150 steps on pydoc topics (a few seconds): experts with real structure."""
    torch.set_num_threads(1)
    model, _ = train_moe_lm(tiny_config(steps=400), corpus, eval_count=4)
    return model


@pytest.fixture
def trained_copy(trained) -> nn.Module:
    return copy.deepcopy(trained)


@pytest.fixture(scope="session")
def text_calibration(corpus) -> Calibration:
    return Calibration.from_bytes(corpus.train, seq_len=64, num_sequences=16, batch_size=8)


@pytest.fixture
def moe_factory():
    """make_model(arch="qwen2_moe", seed=0, **size changes) -> a random-init tiny MoE LM."""
    return make_model


@pytest.fixture
def calibration_factory():
    """random_calibration(n, length, batch_size, seed) -> a Calibration of random byte ids."""
    return random_calibration
