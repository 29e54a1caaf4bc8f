"""examples/recommend.py runs end to end with small settings (issue 22)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "recommend.py"


@pytest.mark.slow
def test_recommend_example(tmp_path) -> None:
    done = subprocess.run([sys.executable, str(EXAMPLE), "--train-size", "32", "--shots", "16", "--repo",
                           str(tmp_path / "repo")], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "encrypted ranking equals plaintext: True" in done.stdout
    assert (tmp_path / "repo" / "topic" / "pave.json").is_file()
