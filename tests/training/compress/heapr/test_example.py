"""examples/compress_moe_heapr.py runs end to end with small settings (a subprocess, as a user runs it)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[4] / "examples" / "compress_moe_heapr.py"


def test_compress_moe_heapr_example(tmp_path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, str(SCRIPT), "--steps", "30", "--out", str(tmp_path / "pruned")],
                          capture_output=True, text=True, timeout=180, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "qwen2_moe: 268,992 parameters" in done.stdout
    assert "HEAPr at 25%: 232,128 parameters" in done.stdout  # 192 of 768 atomic experts x 3 x 64 removed
    assert "expert pruning at 25%: 231,744 parameters" in done.stdout  # 6 experts + their router rows
    assert "reloaded sample:" in done.stdout
    assert (tmp_path / "pruned" / "model.safetensors").is_file()
