"""benchmarks/optim_grpo.py runs end to end in its smoke setting and writes only its own results section."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

BENCHMARK = Path(__file__).resolve().parents[1] / "benchmarks" / "optim_grpo.py"


@pytest.mark.slow
def test_optim_grpo_benchmark_quick(tmp_path) -> None:
    spec = importlib.util.spec_from_file_location("optim_grpo", BENCHMARK)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    (tmp_path / "results.md").write_text("# results\n\n<!-- other:begin -->\nkept text\n<!-- other:end -->\n")
    assert module.main(["--quick", "--out", str(tmp_path)]) == 0
    text = (tmp_path / "results.md").read_text()
    assert "kept text" in text and text.count("<!-- optim_grpo:begin -->") == 1 and "| ar_lopti |" in text
    results = json.loads((tmp_path / "results" / "optim_grpo.json").read_text())
    assert [r["method"] for r in results["summary"]] == ["grpo", "ar_lopti"]
    assert all(0 <= r["eval_final_mean"] <= 1 for r in results["summary"])
    assert (tmp_path / "img" / "optim_grpo_reward.png").stat().st_size > 10_000
    module.main(["--quick", "--out", str(tmp_path)])  # a rerun replaces the section
    assert (tmp_path / "results.md").read_text().count("<!-- optim_grpo:begin -->") == 1
