"""benchmarks/compress_safety.py --quick writes its JSON and markdown section (slow smoke test)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[4] / "benchmarks" / "compress_safety.py"


@pytest.mark.slow
def test_benchmark_quick(tmp_path) -> None:
    spec = importlib.util.spec_from_file_location("compress_safety_bench", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main(["--quick", "--out", str(tmp_path)]) == 0
    results = json.loads((tmp_path / "results" / "compress_safety.json").read_text())
    assert set(results["summary"]["rows"]) >= {"aligned", "attacked", "patched", "control:universal"}
    assert set(results["summary"]["verdict"]) == {"attacked_asr", "patched_asr", "utility"}
    text = (tmp_path / "results.md").read_text()
    assert "<!-- compress_safety:begin -->" in text and "python benchmarks/compress_safety.py --quick" in text
    assert (tmp_path / "img" / "compress_safety_asr.png").is_file()
