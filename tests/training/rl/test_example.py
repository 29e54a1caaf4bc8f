"""examples/grpo_toy.py runs end to end with small settings (Lopti on LoRA adapters)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "grpo_toy.py"


def test_grpo_toy_example_on_lora() -> None:
    done = subprocess.run([sys.executable, str(EXAMPLE), "--steps", "3", "--warm-steps", "10", "--lora", "--method", "lopti"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "held-out reward before:" in done.stdout and "step 3: train reward" in done.stdout
    assert "held-out reward after:" in done.stdout
