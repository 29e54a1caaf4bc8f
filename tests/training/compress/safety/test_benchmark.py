"""benchmarks/compress_safety.py --quick writes its JSON and markdown section (slow smoke test)."""

from __future__ import annotations

import json

import pytest


@pytest.mark.slow
def test_benchmark_quick(tmp_path, load_benchmark) -> None:
    module = load_benchmark("compress_safety")
    assert module.main(["--quick", "--out", str(tmp_path)]) == 0
    results = json.loads((tmp_path / "results" / "compress_safety.json").read_text())
    assert set(results["summary"]["rows"]) >= {"aligned", "attacked", "patched", "control:universal"}
    assert set(results["summary"]["verdict"]) == {"attacked_asr", "patched_asr", "utility"}
    text = (tmp_path / "results.md").read_text()
    assert "<!-- compress_safety:begin -->" in text and "python benchmarks/compress_safety.py --quick" in text
    assert (tmp_path / "img" / "compress_safety_asr.png").is_file()
