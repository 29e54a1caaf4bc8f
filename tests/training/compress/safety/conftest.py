"""Shared fixtures: a micro byte-level Llama (seeded) for the safety tests."""

from __future__ import annotations

import pytest
import torch
from veil.training.lm import PRESETS, LMModelConfig, build_lm


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


@pytest.fixture
def micro_lm() -> torch.nn.Module:
    return build_lm(LMModelConfig(**PRESETS["micro"]), seed=0)
