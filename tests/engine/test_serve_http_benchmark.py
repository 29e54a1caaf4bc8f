"""benchmarks/serve_http.py runs end to end with --quick and writes its section without touching others."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "serve_http.py"


@pytest.mark.slow
def test_serve_http_benchmark_quick(tmp_path) -> None:
    spec = importlib.util.spec_from_file_location("serve_http", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    (tmp_path / "results.md").write_text("# results\n\n<!-- other:begin -->\nkept text\n<!-- other:end -->\n")
    assert module.main(["--quick", "--out", str(tmp_path)]) == 0
    text = (tmp_path / "results.md").read_text()
    assert "kept text" in text and text.count(module.SECTION_BEGIN) == 1 and "bare `InferenceSession.run`" in text
    results = json.loads((tmp_path / "results" / "serve_http.json").read_text())
    assert {"runtime", "http", "batching"} <= set(results) and len(results["batching"]) == 2
    module.main(["--quick", "--out", str(tmp_path)])  # a rerun replaces the section
    assert (tmp_path / "results.md").read_text().count(module.SECTION_BEGIN) == 1
