"""examples/priorguide_*.py run end to end with small settings."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_priorguide_gaussian_linear_example() -> None:
    done = subprocess.run([sys.executable, str(EXAMPLES / "priorguide_gaussian_linear.py"), "--dim", "2",
                           "--steps", "300", "--simulations", "2000", "--draws", "300"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0].strip().startswith("priorguide: C2ST") and "unguided" in lines[1] and "reweighted" in lines[2]
    assert lines[3].startswith("diagnostics:") and '"nfe": 225' in lines[3]
