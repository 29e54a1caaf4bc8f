"""A tiny toy-sort policy (random-init Llama, no hub) shared by the RL tests."""

from __future__ import annotations

import pytest
import torch
from veil.training.rl.toy import ToySortConfig, build_policy, warm_start

TASK = ToySortConfig(num_symbols=6, length=3, hidden_size=32, layers=1, warm_steps=40, warm_batch=32)


def make_policy(seed: int = 0, warm: bool = True) -> torch.nn.Module:
    """The tiny policy, briefly warm-started so that its samples mix high- and low-probability tokens."""
    torch.manual_seed(seed)
    policy = build_policy(TASK, seed)
    if warm:
        warm_start(policy, TASK, seed)
    return policy.eval()


@pytest.fixture
def task() -> ToySortConfig:
    return TASK


@pytest.fixture
def policy_factory():
    return make_policy
