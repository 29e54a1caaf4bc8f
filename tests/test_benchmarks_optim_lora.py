"""benchmarks/optim_lora.py runs end to end in its --quick setting and writes only its own results section."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "optim_lora.py"


@pytest.mark.slow
def test_optim_lora_benchmark_quick(tmp_path) -> None:
    spec = importlib.util.spec_from_file_location("optim_lora", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    (tmp_path / "results.md").write_text("# results\n\n<!-- other:begin -->\nkept text\n<!-- other:end -->\n")
    assert module.main(["--quick", "--out", str(tmp_path)]) == 0
    text = (tmp_path / "results.md").read_text()
    assert "kept text" in text and text.count("<!-- optim_lora:begin -->") == 1
    assert "python benchmarks/optim_lora.py --quick" in text
    summary = json.loads((tmp_path / "results" / "optim_lora.json").read_text())["summary"]
    assert set(summary["mean"]) == {"adamw", "adams", "lracs", "lracs_bc"}
    assert summary["state_bytes"]["lracs"] < summary["state_bytes"]["adamw"] < summary["state_bytes"]["adams"]
    assert (tmp_path / "img" / "optim_lora_loss.png").stat().st_size > 10_000
