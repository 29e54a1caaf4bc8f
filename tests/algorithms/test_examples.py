"""examples/cluster.py and examples/games.py run end to end with small settings."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def run(script: str, *args: str) -> str:
    done = subprocess.run([sys.executable, str(EXAMPLES / script), *args], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_cluster_example() -> None:
    out = run("cluster.py", "--n", "200", "--k", "3", "--phi", "0.25")
    assert out.startswith("k-means++ on exact distances: cost") and "coreset:" in out and "trust every answer:" in out


def test_games_example() -> None:
    out = run("games.py", "--iterations", "300")
    assert "mi-sprm+: gap(300) =" in out and "raised its regret floor to R =" in out
