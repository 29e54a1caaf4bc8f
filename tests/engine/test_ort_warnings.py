"""ONNX Runtime's log at model load: an adapter model's expected warnings are off, errors and other models' are not.

`veil serve` on a repository from `veil export adapters` printed one ORT warning per LoRA/head graph input at every
session ("Initializer lora.<module>.A appears in graph inputs and will not be treated as constant value/weight"):
those inputs have zero defaults by design, so the base runs without an adapter.
"""

from __future__ import annotations

import shutil

import onnx
import pytest
from veil.engine.dataplane import DataPlane
from veil.engine.errors import ModelLoadFailed
from veil.engine.metrics import Metrics
from veil.engine.runtime import ORT_LOG_ENV, RuntimeOptions

ORT_WARNING = "[W:onnxruntime"


def load(repo) -> DataPlane:
    plane = DataPlane(repo, RuntimeOptions(intra_op_threads=1), Metrics())
    plane.load_all()
    return plane


def test_an_adapter_model_loads_without_ort_warnings(tmp_path, write_lora_toy, capfd, monkeypatch) -> None:
    monkeypatch.delenv(ORT_LOG_ENV, raising=False)
    write_lora_toy(tmp_path / "tiny")
    capfd.readouterr()
    assert load(tmp_path).models["tiny"]["1"].adapters is not None
    assert ORT_WARNING not in capfd.readouterr().err

    monkeypatch.setenv(ORT_LOG_ENV, "2")  # the documented way to see them again (and the test can fail)
    load(tmp_path)
    err = capfd.readouterr().err
    assert err.count(ORT_WARNING) >= 2 and "Initializer lora.A appears in graph inputs" in err


def test_other_models_keep_ort_warnings(tmp_path, write_lora_toy, capfd, monkeypatch) -> None:
    """The same graph without adapters/ is not an adapter model: ORT's warnings about it are shown as before."""
    monkeypatch.delenv(ORT_LOG_ENV, raising=False)
    write_lora_toy(tmp_path / "tiny")
    shutil.rmtree(tmp_path / "tiny" / "adapters")
    capfd.readouterr()
    assert load(tmp_path).models["tiny"]["1"].adapters is None
    assert "Initializer lora.A appears in graph inputs" in capfd.readouterr().err


def test_a_broken_adapter_model_still_reports_its_error(tmp_path, write_lora_toy, monkeypatch) -> None:
    monkeypatch.delenv(ORT_LOG_ENV, raising=False)
    write_lora_toy(tmp_path / "tiny")
    path = tmp_path / "tiny" / "1" / "model.onnx"
    model = onnx.load(path)
    model.graph.node[2].op_type = "NoSuchOp"
    onnx.save(model, path)
    with pytest.raises(ModelLoadFailed, match=r"model 'tiny' version 1: .*NoSuchOp"):
        load(tmp_path)


def test_a_bad_log_severity_names_the_variable(tmp_path, write_lora_toy, monkeypatch) -> None:
    monkeypatch.setenv(ORT_LOG_ENV, "loud")
    write_lora_toy(tmp_path / "tiny")
    with pytest.raises(ModelLoadFailed, match=f"model 'tiny': {ORT_LOG_ENV}: expected one of 0 .* received 'loud'"):
        load(tmp_path)
