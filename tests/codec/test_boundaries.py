"""veil.codec stays light: no torch for the format, coder and runtime, and never veil.training."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_codec_runtime_needs_no_torch() -> None:
    code = ("import sys, veil.codec.bitstream, veil.codec.coder, veil.codec.runtime, veil.codec.cli, "
            "veil.codec.images, veil.codec.baselines; assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)


def test_codec_never_imports_training() -> None:
    pattern = re.compile(r"^\s*(from|import)\s+(veil\.training|\.\.training|training)\b", re.MULTILINE)
    assert [p.name for p in (ROOT / "codec").rglob("*.py") if pattern.search(p.read_text())] == []
