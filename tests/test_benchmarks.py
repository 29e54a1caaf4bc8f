"""benchmarks/uldnet_digits.py runs end to end (one seed, a few epochs) and writes its table and plot."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "uldnet_digits.py"


@pytest.mark.slow
def test_uldnet_digits_benchmark_smoke(tmp_path) -> None:
    spec = importlib.util.spec_from_file_location("uldnet_digits", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    (tmp_path / "results.md").write_text("# results\n\nkept text\n")
    assert module.main(["--seeds", "0", "--epochs", "2", "--out", str(tmp_path)]) == 0
    text = (tmp_path / "results.md").read_text()
    assert "kept text" in text and text.count("<!-- uldnet_digits:begin -->") == 1 and "| PolyCNN |" in text
    summary = json.loads((tmp_path / "results" / "uldnet_digits.json").read_text())["summary"]
    assert {row["arch"] for row in summary} == {"mlp", "cnn", "vit"}
    assert (tmp_path / "img" / "uldnet_digits_val.png").stat().st_size > 10_000
    module.main(["--seeds", "0", "--epochs", "2", "--out", str(tmp_path)])  # rerun replaces the section
    assert (tmp_path / "results.md").read_text().count("<!-- uldnet_digits:begin -->") == 1
