"""examples/train_tiny_lm.py runs end to end with small settings (a subprocess, as a user runs it)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[3] / "examples" / "train_tiny_lm.py"


def test_train_tiny_lm_example(tmp_path) -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), "--preset", "micro", "--steps", "20", "--optimizer", "racs",
                           "--out", str(tmp_path / "lm")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "racs (lr 0.05), 139,584 parameters, 20 steps: held-out loss" in done.stdout
    assert "optimizer state:" in done.stdout and "sample:\nThe " in done.stdout
    assert (tmp_path / "lm" / "model.safetensors").is_file()
