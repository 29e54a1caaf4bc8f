"""export.repository publishes a model folder whole (issue 19, item 14): config.pbtxt and veil.json are in it
before it becomes visible, other versions are kept, and a failed export leaves the old model as it was."""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper
from veil.export import repository
from veil.export.repository import TensorSpec, write_model

SPECS = ([TensorSpec("x", "float32", [-1, 2])], [TensorSpec("y", "float32", [-1, 2])])


def identity() -> onnx.ModelProto:
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 2])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_failure_before_config_pbtxt_publishes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args, **kwargs):
        raise RuntimeError("killed before config.pbtxt")

    monkeypatch.setattr(repository, "config_pbtxt", broken)
    with pytest.raises(RuntimeError):
        write_model(tmp_path, "m", 1, identity(), *SPECS, {"kind": "test"})
    assert not (tmp_path / "m").exists()  # formerly: m/1/model.onnx visible without config.pbtxt or veil.json
    assert [p.name for p in tmp_path.iterdir()] == []


def test_the_model_folder_is_complete_at_the_instant_it_is_published(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from veil import atomic

    write_model(tmp_path, "m", 1, identity(), *SPECS, {"kind": "test", "tag": "v1"})
    seen = []
    publish = atomic.publish_dir

    def spy(tmp: Path, final: Path) -> None:
        seen.append(sorted(str(p.relative_to(tmp)) for p in tmp.rglob("*")))
        assert json.loads((final / "veil.json").read_text())["tag"] == "v1"  # readers still see the old model
        publish(tmp, final)

    monkeypatch.setattr(atomic, "publish_dir", spy)
    write_model(tmp_path, "m", 2, identity(), *SPECS, {"kind": "test", "tag": "v2"})
    assert seen == [["1", "1/model.onnx", "2", "2/model.onnx", "config.pbtxt", "veil.json"]]
    assert json.loads((tmp_path / "m" / "veil.json").read_text())["tag"] == "v2"
    assert (tmp_path / "m" / "1" / "model.onnx").is_file()  # the other version is kept
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]


def test_a_failed_re_export_leaves_the_old_model_untouched(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_model(tmp_path, "m", 1, identity(), *SPECS, {"kind": "test", "tag": "v1"})
    before = {p.name: p.read_bytes() for p in (tmp_path / "m").iterdir() if p.is_file()}

    def broken(model, path):
        Path(path).write_bytes(b"half a graph")
        raise RuntimeError("disk full")

    monkeypatch.setattr(onnx, "save_model", broken)
    with pytest.raises(RuntimeError):
        write_model(tmp_path, "m", 1, identity(), *SPECS, {"kind": "test", "tag": "v2"})
    assert {p.name: p.read_bytes() for p in (tmp_path / "m").iterdir() if p.is_file()} == before
    onnx.checker.check_model(onnx.load(str(tmp_path / "m" / "1" / "model.onnx")))


def test_model_level_files_are_published_with_the_model_and_replace_the_old_ones(tmp_path: Path) -> None:
    """`veil export adapters` used to publish the model, then adapters/, then rewrite config.pbtxt: three steps."""
    (tmp_path / "a.onnx_adapter").write_bytes(b"a")
    (tmp_path / "b.onnx_adapter").write_bytes(b"b")
    write_model(tmp_path / "repo", "m", 1, identity(), *SPECS, {"kind": "test"},
                model_files={"adapters/a.onnx_adapter": tmp_path / "a.onnx_adapter"}, config_extra="# one\n")
    write_model(tmp_path / "repo", "m", 1, identity(), *SPECS, {"kind": "test"},
                model_files={"adapters/b.onnx_adapter": tmp_path / "b.onnx_adapter"}, config_extra="# two\n")
    model = tmp_path / "repo" / "m"
    assert sorted(p.name for p in (model / "adapters").iterdir()) == ["b.onnx_adapter"]  # the old set is replaced
    assert (model / "config.pbtxt").read_text().endswith("# two\n")


def test_a_re_export_without_a_spec_drops_the_old_models_pave_specs(tmp_path: Path) -> None:
    """A spec describes the model the export wrote; before, a re-export without --spec kept the old pave.json and
    pave/<adapter>.json, and POST /v2/recommend ranked the new model by the old model's vector (issue 22)."""
    import numpy as np
    from veil.export.spec import write_spec
    from veil.pave import PaveVector, spec_paths

    ident = {"base": "b", "base_sha256": "0" * 64, "projection_seed": 1, "rank": 2}
    write_model(tmp_path, "m", 1, identity(), *SPECS, {"kind": "test"})
    write_spec(tmp_path, "m", PaveVector("model", ident, np.ones(3)))
    write_spec(tmp_path, "m", PaveVector("model", ident, np.ones(3)), adapter="a")
    assert [name for name, _ in spec_paths(tmp_path, "m")] == ["m", "m:a"]
    write_model(tmp_path, "m", 2, identity(), *SPECS, {"kind": "test"})
    assert spec_paths(tmp_path, "m") == [] and not (tmp_path / "m" / "pave").exists()
    assert (tmp_path / "m" / "1" / "model.onnx").is_file()  # the other version is kept
    assert "pave_spec" not in json.loads((tmp_path / "m" / "veil.json").read_text())
