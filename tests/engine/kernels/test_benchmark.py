"""benchmarks/gpu_kernels.py runs its CPU smoke (interpreter, tiny shapes) and never writes results.md from it."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("triton")


def test_gpu_kernels_benchmark_interpreter_smoke(tmp_path, load_benchmark) -> None:
    module = load_benchmark("gpu_kernels")
    assert module.main(["--interpret", "--out", str(tmp_path)]) == 0
    results = json.loads((tmp_path / "results" / "gpu_kernels_interpret.json").read_text())
    assert {r["kernel"] for r in results["rows"]} == {"lora", "lowrank", "linear_polyact"}
    assert all(r["fused_ms"] > 0 for r in results["rows"]) and not (tmp_path / "results.md").exists()
    assert module.roofline(2e12, 1e9, 1000.0, (989.0, 4.8))["roofline_frac"] == round(2.0 / min(989.0, 2000 * 4.8), 3)
