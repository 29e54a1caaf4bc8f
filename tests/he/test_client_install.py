"""The encrypted-inference client installed on its own (issue 18 §1).

A fresh venv gets only ``pip install '<veil wheel>[client]'`` (pip's own configuration and cache, as a user's
machine would) and runs `veil he keygen → encrypt → infer → decrypt` against `veil serve`, which runs from the
full install with an HE-compiled tiny PolyMLP; the decrypted logits match ONNX Runtime on the plaintext, and
none of torch, onnx, onnxruntime, safetensors or transformers is importable in that venv.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import numpy as np
import pytest
import tomllib

import veil.cli
import veil.lazy

ROOT = Path(__file__).resolve().parents[2]
# what the client install must not bring (each alone is hundreds of MB, torch about 1 GB)
ABSENT = ("torch", "onnx", "onnxscript", "onnxruntime", "safetensors", "transformers", "fastapi", "sklearn")
INSTALL_TIMEOUT_S = 600  # pip reads its cache (or the package index) for numpy, tenseal, cryptography


def run(cmd: list[str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """Run ``cmd``; a non-zero status fails the test with the command's stderr."""
    done = subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{' '.join(map(str, cmd))}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done


def copy_sources(dest: Path) -> Path:
    """The files a wheel is built from (pyproject, README, every package folder), without caches."""
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    dest.mkdir(parents=True)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, dest / name)
    for folder in sorted(set(setuptools["package-dir"].values())):
        shutil.copytree(ROOT / folder, dest / folder, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return dest


def site_packages_mb(python: Path) -> int:
    """``du -sm`` of an interpreter's site-packages folder."""
    folder = run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], Path.cwd()).stdout.strip()
    return int(run(["du", "-sm", folder], Path.cwd()).stdout.split()[0])


@pytest.fixture(scope="module")
def client_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv holding veil's wheel with the ``client`` extra, and nothing else of veil's stack."""
    root = tmp_path_factory.mktemp("client-install")
    source = copy_sources((root / "src").resolve())
    run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", root / "dist",
         source], root)
    (wheel,) = (root / "dist").glob("veil-*.whl")
    venv.EnvBuilder(with_pip=True).create(root / "venv")
    python = root / "venv" / "bin" / "python"
    run([python, "-m", "pip", "install", "-q", f"{wheel}[client]"], root, timeout=INSTALL_TIMEOUT_S)
    return python


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, tiny_polymlp):
    """`veil serve` (full install) on an HE plan and the ONNX export of a tiny 3-class PolyMLP."""
    from veil.export import export_uldnet
    from veil.export.he import export_he

    from veil.demo import running_server

    checkpoint, data = tiny_polymlp
    root = tmp_path_factory.mktemp("served")
    export_uldnet(checkpoint, root / "repo", name="plain")
    export_he(checkpoint, root / "repo", "tiny-he", mode="latency")
    with running_server(root / "repo") as url:
        yield url, root / "repo", data.x_test[:3]


@pytest.mark.slow
def test_client_install_runs_encrypted_inference_without_the_stack(client_python: Path, served, tmp_path: Path) -> None:
    url, repo, x = served
    veil_cmd = client_python.parent / "veil"
    probe = (f"import importlib.util, json, veil, veil.he.client; print(json.dumps({{'veil': veil.__file__, "
             f"'importable': [m for m in {ABSENT!r} if importlib.util.find_spec(m)]}}))")
    found = json.loads(run([client_python, "-c", probe], tmp_path).stdout)
    assert found["importable"] == []
    assert Path(found["veil"]).is_relative_to(client_python.parents[1])  # the installed wheel, not the checkout

    assert "\n  he        encrypted inference client" in run([veil_cmd, "--help"], tmp_path).stdout
    keyring = tmp_path / "keys" / "tiny.keyring"
    np.save(tmp_path / "x.npy", x)
    keygen = json.loads(run([veil_cmd, "he", "keygen", "--server", url, "--model", "tiny-he", "--keyring", keyring],
                            tmp_path).stdout)  # keys made here, evaluation keys registered with the server
    assert len(keygen["key_id"]) == 64
    run([veil_cmd, "he", "encrypt", "--keyring", keyring, "--input", "x.npy", "--out", "request.bin"], tmp_path)
    run([veil_cmd, "he", "infer", "--keyring", keyring, "--request", "request.bin", "--out", "response.bin"], tmp_path)
    run([veil_cmd, "he", "decrypt", "--keyring", keyring, "--response", "response.bin", "--out", "y.npy"], tmp_path)

    import onnxruntime as ort

    expected = ort.InferenceSession(str(repo / "plain" / "1" / "model.onnx")).run(None, {"x": x})[0]
    logits = np.load(tmp_path / "y.npy")
    assert logits.shape == expected.shape == (3, 3)
    assert np.abs(logits - expected).max() < 1e-2
    assert np.array_equal(logits.argmax(1), expected.argmax(1))

    serve = subprocess.run([veil_cmd, "serve", "--repo", str(repo)], cwd=tmp_path, capture_output=True, text=True,
                           timeout=120)
    assert serve.returncode == 2 and "pip install 'veil[serve]'" in serve.stderr, serve.stderr
    print(f"\nsite-packages: client install {site_packages_mb(client_python)} MB, "
          f"full install {site_packages_mb(Path(sys.executable))} MB")


def test_a_missing_package_names_the_extra_that_brings_it(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    """A client install running `veil serve` gets one line naming `veil[serve]`, not a traceback."""
    def missing(target: str, default: str | None = None):
        raise ModuleNotFoundError("No module named 'fastapi'", name="fastapi")

    monkeypatch.setattr(veil.lazy, "import_object", missing)
    assert veil.cli.main(["serve", "--repo", "models"]) == 2
    err = capsys.readouterr().err
    assert "'fastapi'" in err and "pip install 'veil[serve]'" in err
    assert veil.cli.main(["export", "onnx", "runs/x"]) == 2
    assert "pip install 'veil[export]'" in capsys.readouterr().err


def test_a_missing_veil_module_is_not_blamed_on_the_install(monkeypatch: pytest.MonkeyPatch) -> None:
    """A bug inside veil (a module of its own that does not exist) still raises: no extra would fix it."""
    def missing(target: str, default: str | None = None):
        raise ModuleNotFoundError("No module named 'veil.nowhere'", name="veil.nowhere")

    monkeypatch.setattr(veil.lazy, "import_object", missing)
    with pytest.raises(ModuleNotFoundError, match=r"veil\.nowhere"):
        veil.cli.main(["serve", "--repo", "models"])
