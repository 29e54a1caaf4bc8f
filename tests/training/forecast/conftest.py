"""Fixtures of the forecaster tests: numpy and torch on one thread (the machine is shared; threads only contend)."""

from __future__ import annotations

import pytest
import torch
from threadpoolctl import threadpool_limits


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    with threadpool_limits(limits=1):
        yield
    torch.set_num_threads(threads)
