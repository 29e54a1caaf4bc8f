"""benchmarks/optim_lm.py runs end to end in its quick setting and writes only its own outputs."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "optim_lm.py"


@pytest.mark.slow
def test_optim_lm_benchmark_quick(tmp_path) -> None:
    spec = importlib.util.spec_from_file_location("optim_lm", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    (tmp_path / "results.md").write_text("# results\n\nkept text\n")
    assert module.main(["--quick", "--out", str(tmp_path)]) == 0
    text = (tmp_path / "results.md").read_text()
    assert "kept text" in text and text.count("<!-- optim_lm:begin -->") == 1
    assert "python benchmarks/optim_lm.py --quick" in text and "| alice |" in text
    report = json.loads((tmp_path / "results" / "optim_lm.json").read_text())
    rows = report["summary"]["rows"]
    assert {"adamw", "racs", "alice"} <= set(rows) and rows["adamw"]["state_vs_adamw"] == 1.0
    assert all(r["held_out_loss"] < 5.0 for r in rows.values())  # every optimizer learned (init: ~5.55)
    assert rows["racs"]["state_vs_adamw"] < 0.5
    assert (tmp_path / "img" / "optim_lm_loss.png").stat().st_size > 10_000
    module.main(["--quick", "--out", str(tmp_path)])  # a rerun replaces the section
    assert (tmp_path / "results.md").read_text().count("<!-- optim_lm:begin -->") == 1
