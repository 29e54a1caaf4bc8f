"""The rules of ARCHITECTURE.md that code can break: import boundaries and the namespace mapping."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


# what `pip install 'veil[client]'` does not install: the client path must not import any of them
HEAVY = ("torch", "onnx", "onnxscript", "onnxruntime", "safetensors", "transformers", "sklearn", "fastapi")
CLIENT_MODULES = ("veil", "veil.cli", "veil.config", "veil.atomic", "veil.lazy", "veil.registry", "veil.he",
                  "veil.he.client", "veil.he.keys", "veil.he.galois", "veil.he.envelope", "veil.he.serialize",
                  "veil.he.sealbytes", "veil.he.params", "veil.he.plan", "veil.he.keystore", "veil.he.errors",
                  "veil.he.contract", "veil.he.cli", "veil.pave")
CLIENT_PACKAGES = {"numpy", "tenseal", "cryptography"}


def test_client_path_imports_none_of_the_heavy_packages() -> None:
    """Each client module, and `veil --help` / `veil he VERB --help`, in a fresh interpreter: which heavy
    packages it loaded (issue 18: `import veil.he.client` pulled in onnx and safetensors)."""
    code = f"""
import contextlib, importlib, io, json, sys
heavy = {HEAVY!r}
loaded = {{}}
for name in {CLIENT_MODULES!r}:
    importlib.import_module(name)
    loaded[name] = sorted(m for m in heavy if m in sys.modules)
import veil.cli
with contextlib.redirect_stdout(io.StringIO()):
    veil.cli.main(["--help"])
    for verb in ("keygen", "encrypt", "infer", "decrypt"):
        veil.cli.main(["he", verb, "--help"])
loaded["veil --help, veil he VERB --help"] = sorted(m for m in heavy if m in sys.modules)
print(json.dumps(loaded))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    loaded = json.loads(done.stdout.splitlines()[-1])
    assert {name: mods for name, mods in loaded.items() if mods} == {}
    assert len(loaded) == len(CLIENT_MODULES) + 1


def test_model_side_names_of_veil_he_load_on_first_use() -> None:
    """`veil.he.compile` & co. stay reachable from the package although it no longer imports them eagerly."""
    import veil.he
    from veil.he.compiler import CompileError, compile
    from veil.he.evaluate import PlanEvaluator
    from veil.he.plan import Plan

    assert (veil.he.compile, veil.he.CompileError, veil.he.PlanEvaluator, veil.he.Plan) == (
        compile, CompileError, PlanEvaluator, Plan)
    assert set(veil.he.__all__) <= set(dir(veil.he))
    with pytest.raises(AttributeError, match="no attribute 'not_a_name'"):
        veil.he.not_a_name  # noqa: B018


def _requirement_names(requirements: list[str]) -> set[str]:
    return {re.split(r"[<>=!~;\[ ]", r, maxsplit=1)[0].lower() for r in requirements}


def test_the_base_install_is_the_client_and_dev_installs_everything() -> None:
    """`pip install 'veil[client]'` = the base list (numpy, tenseal, cryptography); `.[dev]` (what make installs)
    reaches every extra but the GPU one through `veil[all]`."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    assert _requirement_names(project["dependencies"]) == CLIENT_PACKAGES
    assert _requirement_names(extras["client"]) == CLIENT_PACKAGES
    assert "veil[all]" in extras["dev"]
    (everything,) = extras["all"]
    named = set(re.fullmatch(r"veil\[(.*)\]", everything).group(1).split(","))
    assert named == set(extras) - {"all", "dev", "client", "gpu"}
    full = set().union(*(_requirement_names(extras[name]) for name in named))
    assert {"torch", "onnx", "onnxruntime", "safetensors", "transformers", "fastapi"} <= full


ROOMS = {"training": "veil.training", "engine": "veil.engine", "he": "veil.he", "export": "veil.export",
         "pave": "veil.pave"}


def imported_modules(source: str, package: str) -> set[str]:
    """Every module ``source`` (a file of ``package``) imports: top level, inside functions, relative ones
    resolved; ``from a import b`` counts as ``a`` and ``a.b``."""
    here = package.split(".")
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = here[:len(here) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
    return found


def package_of(path: Path) -> str:
    """The dotted package a room's file belongs to (``training/uldnet/cli.py`` -> ``veil.training.uldnet``)."""
    room = path.relative_to(ROOT).parts[0]
    return ".".join([ROOMS[room], *path.relative_to(ROOT / room).parent.parts])


def offenders(room: str, forbidden: tuple[str, ...]) -> dict[str, list[str]]:
    """Files of ``room`` that import a module under one of ``forbidden`` (with what they import)."""
    out = {}
    for path in sorted((ROOT / room).rglob("*.py")):
        bad = sorted(m for m in imported_modules(path.read_text(), package_of(path)) if any(m == f or m.startswith(f + ".") for f in forbidden))
        if bad:
            out[str(path.relative_to(ROOT))] = bad
    return out


@pytest.mark.parametrize(("room", "forbidden"), [
    ("training", ("veil.export", "veil.engine", "veil.he")),  # data flows one way: training -> export -> engine
    ("engine", ("veil.training",)),
    ("he", ("torch", "veil.training", "veil.export", "veil.engine")),
    # the PAVE specification every room shares: numpy only, below all of them (issue 32)
    ("pave", ("torch", "onnx", "tenseal", "veil.training", "veil.export", "veil.he", "veil.engine", "veil.codec",
              "veil.posterior", "veil.recommend")),
])
def test_imports_flow_one_way(room: str, forbidden: tuple[str, ...]) -> None:
    """ARCHITECTURE.md "Data flows one way", checked on every import statement (also inside functions)."""
    assert offenders(room, forbidden) == {}


def test_the_import_scan_sees_relative_and_function_level_imports() -> None:
    """The scan that guards the flow resolves ``from ..x import y`` and finds imports inside functions."""
    source = "import torch\nfrom . import config\ndef main():\n    from ...export.codec import export_codec\n"
    modules = imported_modules(source, "veil.training.codec")
    assert {"torch", "veil.training.codec.config", "veil.export.codec", "veil.export.codec.export_codec"} <= modules
    assert package_of(ROOT / "training" / "uldnet" / "cli.py") == "veil.training.uldnet"


def test_rooms_import_under_the_veil_namespace() -> None:
    import veil.engine
    import veil.export
    import veil.he
    import veil.pave
    import veil.training

    for module, folder in ((veil.training, "training"), (veil.export, "export"), (veil.he, "he"), (veil.engine, "engine"),
                           (veil.pave, "pave")):
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


def library_files() -> list[Path]:
    """Every source file of the installed packages (the folders pyproject's package-dir maps into ``veil``)."""
    import tomllib

    folders = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"].values()
    return sorted({path for folder in folders for path in (ROOT / folder).rglob("*.py")})


def test_no_library_file_is_over_400_lines() -> None:
    """STYLE.md's size budget, held since issue 32 (it was broken by engine/ray_serve.py, veil/config.py,
    he/segments.py, he/keys.py and he/layout.py): split a file by concern before it passes 400 lines."""
    long = {str(p.relative_to(ROOT)): n for p in library_files() if (n := len(p.read_text().splitlines())) > 400}
    assert long == {}


# public class names defined in two rooms for the same role, each room's own (its data splits, its trainer's
# result); any other name means one thing in the whole library
SHARED_ROLE_NAMES = {"Splits", "TrainResult"}


def test_each_public_class_name_has_one_meaning() -> None:
    """Issue 32: ModelConfig, Stage, LoraLinear and Prior were each defined twice with different meanings."""
    defined: dict[str, list[str]] = {}
    for path in library_files():
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                defined.setdefault(node.name, []).append(str(path.relative_to(ROOT)))
    twice = {name: paths for name, paths in defined.items() if len(paths) > 1 and name not in SHARED_ROLE_NAMES}
    assert twice == {}
