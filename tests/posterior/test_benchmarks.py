"""benchmarks/priorguide_*.py run end to end in a smoke setting and write only their own section."""

from __future__ import annotations

import json

import pytest


@pytest.mark.slow
def test_priorguide_gl_benchmark_quick(load_benchmark, tmp_path) -> None:
    module = load_benchmark("priorguide_gl")
    marker = "<!-- priorguide_gl:begin -->"
    (tmp_path / "results.md").write_text("# results\n\n<!-- other:begin -->\nkept text\n<!-- other:end -->\n")
    assert module.main(["--quick", "--out", str(tmp_path)]) == 0
    text = (tmp_path / "results.md").read_text()
    assert "kept text" in text and text.count(marker) == 1 and "| analytic | 2 | strong |" in text
    results = json.loads((tmp_path / "results" / "priorguide_gl.json").read_text())
    assert {e["prior"] for e in results["summary"]} == {"mild", "strong", "mixture"}
    assert {e["scores"] for e in results["summary"]} == {"analytic", "network"}
    assert all(e["scores"] != "analytic" or e["priorguide"]["c2st"] < 0.75 for e in results["summary"])
    assert (tmp_path / "img" / "priorguide_gl_langevin.png").stat().st_size > 5_000
