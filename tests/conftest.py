"""Shared pytest set-up: GPU tests skip without CUDA; Triton kernels run in its interpreter without CUDA;
``load_benchmark`` imports a benchmark script."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest
import torch

# Triton reads the flag when it is first imported and when a kernel is defined: set it before any test module
# (or a library it imports) gets there, so the kernel tests run on CPU (engine.md §3.4)
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="session")
def load_benchmark() -> Callable[[str], ModuleType]:
    """``load_benchmark(name)``: ``benchmarks/<name>.py`` as a fresh module (the scripts are not a package)."""
    def load(name: str) -> ModuleType:
        spec = importlib.util.spec_from_file_location(f"benchmark_{name}", BENCHMARKS / f"{name}.py")
        assert spec is not None and spec.loader is not None, name
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    return load


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = False
    if has_cuda:
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
