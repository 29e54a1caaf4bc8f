"""examples/safety_realign_tiny.py runs end to end with small settings (a subprocess, as a user runs it)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[4] / "examples" / "safety_realign_tiny.py"


def test_safety_realign_tiny_example() -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    args = ["--preset", "micro", "--pretrain-steps", "5", "--align-steps", "20", "--align-benign", "64", "--align-harmful", "32",
            "--attack-harmful", "8", "--attack-task", "8", "--attack-benign", "8", "--attack-epochs", "1",
            "--candidates", "2", "--lr-grid", "1e-3", "--val-prompts", "2", "--eval-harmful", "4", "--eval-benign", "4",
            "--eval-downstream", "2", "--max-new-bytes", "8", "--compress-ratios", "0.3", "0.5"]
    done = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0].startswith("micro preset, seed 0; one example (bilevel): ")
    assert [" ".join(line.split()[:2]) for line in lines[5:9]] == ["+svd 0.3", "+repatch 0.3", "+svd 0.5",
                                                                    "+repatch 0.5"]  # one row pair per ratio
    assert [line.split()[0] for line in lines[2:5]] == ["aligned", "attacked", "patched"]
    assert lines[9].startswith("patch: 10 steps in ")
