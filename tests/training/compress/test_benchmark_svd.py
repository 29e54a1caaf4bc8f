"""benchmarks/compress_svd.py --quick runs end to end and writes its results (slow: trains a micro LM, compresses
MiniLM three times and exports)."""

from __future__ import annotations

import json

import pytest


@pytest.mark.slow
def test_compress_svd_benchmark_quick(tmp_path, load_benchmark) -> None:
    module = load_benchmark("compress_svd")
    assert module.main(["--quick", "--out", str(tmp_path / "docs"), "--cache", str(tmp_path / "cache")]) == 0
    results = json.loads((tmp_path / "docs" / "results" / "compress_svd.json").read_text())
    for part in ("lm", "minilm"):
        assert {r["method"] for r in results[part]["runs"]} == {"svd", "svd_llm", "saes_svd"}
        assert results[part]["export"]["removal40"]["size_vs_uncompressed"] < 1
    assert "compress_svd:begin" in (tmp_path / "docs" / "results.md").read_text()
