"""examples/compress_tiny_lm.py runs end to end with small settings (a subprocess, as a user runs it)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[3] / "examples" / "compress_tiny_lm.py"


def test_compress_tiny_lm_example(tmp_path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, str(SCRIPT), "--steps", "30", "--out", str(tmp_path / "lm")],
                          capture_output=True, text=True, timeout=180, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    for method in ("svd", "svd_llm", "saes_svd"):
        assert f"{method}: perplexity" in done.stdout
    assert "reloaded 14 factorised layers; ONNX MatMul pairs 14, ORT == torch: True" in done.stdout
    assert (tmp_path / "lm" / "report.md").is_file() and (tmp_path / "lm" / "repo" / "lm-saes" / "1").is_dir()
