"""examples/codec_*.py run end to end with small settings."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_codec_progressive(tmp_path, codec_dir) -> None:
    done = subprocess.run([sys.executable, str(EXAMPLES / "codec_progressive.py"), "--model", str(codec_dir),
                           "--image", "chelsea", "--out", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0].startswith("chelsea 300x451") and len(lines) == 12
    sizes = [int(line.split()[1]) for line in lines[2:]]
    assert sizes == sorted(sizes) and len(set(sizes)) == 10
    assert (tmp_path / "chelsea_k10.png").is_file()
