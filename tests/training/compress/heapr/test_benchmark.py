"""benchmarks/compress_heapr.py --quick runs and writes its JSON, plot and markdown section (slow: ~30 s)."""

from __future__ import annotations

import json

import pytest


@pytest.mark.slow
def test_compress_heapr_benchmark_quick(tmp_path, load_benchmark) -> None:
    bench = load_benchmark("compress_heapr")
    assert bench.main(["--quick", "--out", str(tmp_path)]) == 0
    results = json.loads((tmp_path / "results" / "compress_heapr.json").read_text())
    methods = {s["method"] for s in results["summary"]}
    assert {"unpruned", "heapr", "heapr_layerwise", "expert_prune", "random_atomic"} <= methods
    removed = {s["method"]: s["removed_fraction"] for s in results["summary"] if s["requested_ratio"] == 0.25}
    assert removed["heapr"] == pytest.approx(0.25) and removed["expert_prune"] == pytest.approx(0.25)
    assert set(results["targets"]["qwen2_moe"]) >= {"beats_expert_pruning", "within_5_percent"}
    assert (tmp_path / "img" / "compress_heapr_perplexity.png").is_file()
    assert "compress_heapr:begin" in (tmp_path / "results.md").read_text()
