"""export.validate.cpu_session: adapter-style models (graph inputs that default to initializers) log no warnings."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from veil.export.validate import cpu_session, shadowed_inputs


def _add_model(shadow: bool) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    b = helper.make_tensor_value_info("b", TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    init = [numpy_helper.from_array(np.array([1.0, 2.0], dtype=np.float32), "b")]
    graph = helper.make_graph([helper.make_node("Add", ["x", "b"], ["y"])], "g", [x, b] if shadow else [x], [y], init)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_shadowed_inputs_names_exactly_the_inputs_with_initializers() -> None:
    assert shadowed_inputs(_add_model(shadow=True)) == ["b"]
    assert shadowed_inputs(_add_model(shadow=False)) == []


@pytest.mark.parametrize("given", ["proto", "bytes", "path"])
def test_a_model_with_default_inputs_runs_without_ort_warnings(capfd: pytest.CaptureFixture, tmp_path, given: str) -> None:
    model = _add_model(shadow=True)
    onnx.save(model, str(tmp_path / "m.onnx"))
    session = cpu_session({"proto": model, "bytes": model.SerializeToString(), "path": str(tmp_path / "m.onnx")}[given])
    x = np.array([0.5, -1.0], dtype=np.float32)
    np.testing.assert_allclose(session.run(None, {"x": x})[0], x + np.array([1.0, 2.0], dtype=np.float32))
    np.testing.assert_allclose(session.run(None, {"x": x, "b": np.zeros(2, np.float32)})[0], x)  # the default overrides
    assert "appears in graph inputs" not in capfd.readouterr().err
