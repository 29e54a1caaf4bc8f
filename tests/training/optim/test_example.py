"""examples/optim_lora_minilm.py runs end to end with tiny settings."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "optim_lora_minilm.py"


def test_optim_lora_minilm_example() -> None:
    done = subprocess.run([sys.executable, str(EXAMPLE), "--train-size", "32", "--epochs", "1"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    for name in ("adamw", "adams", "lracs"):
        assert f"{name}: lr" in done.stdout and "test accuracy" in done.stdout
    assert "LoRA pairs, e.g. model.bert.encoder.layer.0.attention.self.query" in done.stdout
