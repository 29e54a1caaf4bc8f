"""The rules of ARCHITECTURE.md that code can break: import boundaries and the namespace mapping."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_front_door_and_he_do_not_import_torch() -> None:
    code = "import sys, veil, veil.cli, veil.config, veil.he; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)


def test_engine_never_imports_training() -> None:
    pattern = re.compile(r"^\s*(from|import)\s+(veil\.training|\.\.training|training)\b", re.MULTILINE)
    offenders = [str(p.relative_to(ROOT)) for p in (ROOT / "engine").rglob("*.py") if pattern.search(p.read_text())]
    assert offenders == []


def test_rooms_import_under_the_veil_namespace() -> None:
    import veil.engine
    import veil.export
    import veil.he
    import veil.training

    for module, folder in ((veil.training, "training"), (veil.export, "export"), (veil.he, "he"), (veil.engine, "engine")):
        assert Path(module.__file__).resolve().parent == ROOT / folder


def test_every_package_folder_is_listed_in_pyproject() -> None:
    """A non-editable install ships only the listed packages: every folder with an __init__.py must be there."""
    import tomllib

    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    found = set()
    for package, folder in setuptools["package-dir"].items():
        for init in (ROOT / folder).rglob("__init__.py"):
            parts = init.parent.relative_to(ROOT / folder).parts
            found.add(".".join((package, *parts)))
    assert sorted(found - set(setuptools["packages"])) == []
    assert sorted(set(setuptools["packages"]) - found) == []
