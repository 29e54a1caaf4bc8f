"""Tiny ONNX models and model repositories, built with ``onnx.helper``, for tests, examples and benchmarks.

Nothing here is needed to serve a real repository; it lets ``examples/serve_and_query.py``, the
``benchmarks/serve_http.py`` run and the tests build a Triton-layout repository in a temporary folder:

    >>> write_repository("/tmp/repo", {"affine": affine_model()}, max_batch_size=8)
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from veil import kinds
from veil.kinds import Backend, Tensor

from .protocol import datatype_to_triton

_ONNX_TYPES = {"FP32": TensorProto.FLOAT, "FP16": TensorProto.FLOAT16, "INT64": TensorProto.INT64,
               "BOOL": TensorProto.BOOL, "BYTES": TensorProto.STRING, "INT32": TensorProto.INT32}
OPSET = 17


def _model(nodes: list, inputs: list, outputs: list, initializers: list | None = None) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "veil_toy", inputs, outputs, initializer=initializers or [])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 8  # readable by every onnxruntime >= 1.10
    onnx.checker.check_model(model)
    return model


def affine_weights(n_in: int = 4, n_out: int = 3, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n_in, n_out)).astype(np.float32), rng.normal(size=n_out).astype(np.float32)


def affine_model(n_in: int = 4, n_out: int = 3, seed: int = 0) -> onnx.ModelProto:
    """``y = x @ W + b`` with x FP32 [batch, n_in] -> y FP32 [batch, n_out] (weights from :func:`affine_weights`)."""
    w, b = affine_weights(n_in, n_out, seed)
    return _model([helper.make_node("MatMul", ["x", "W"], ["xw"]), helper.make_node("Add", ["xw", "b"], ["y"])],
                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", n_in])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", n_out])],
                  [numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "b")])


def dtypes_model() -> onnx.ModelProto:
    """Four inputs, four outputs, one per datatype family: INT64 x2, NOT of BOOL, FP16 x2, BYTES identity."""
    two = numpy_helper.from_array(np.array(2, dtype=np.int64), "two")
    nodes = [helper.make_node("Mul", ["ids", "two"], ["ids2"]), helper.make_node("Not", ["mask"], ["not_mask"]),
             helper.make_node("Add", ["half", "half"], ["half2"]), helper.make_node("Identity", ["text"], ["text_out"])]
    spec = [("ids", "INT64", "ids2"), ("mask", "BOOL", "not_mask"), ("half", "FP16", "half2"),
            ("text", "BYTES", "text_out")]
    return _model(nodes, [helper.make_tensor_value_info(i, _ONNX_TYPES[t], ["batch", 3]) for i, t, _ in spec],
                  [helper.make_tensor_value_info(o, _ONNX_TYPES[t], ["batch", 3]) for _, t, o in spec], [two])


def digits_model(hidden: int = 64, seed: int = 0) -> onnx.ModelProto:
    """A digits-sized classifier: x FP32 [batch, 1, 8, 8] -> Conv 3x3 (16) -> x² -> Flatten -> MatMul -> logits [batch, 10].

    Stands in for an exported ULD-Net PolyCNN of the same input/output contract (polynomial activation).
    """
    rng = np.random.default_rng(seed)
    conv_w = (rng.normal(size=(16, 1, 3, 3)) / 3).astype(np.float32)
    fc1 = (rng.normal(size=(16 * 8 * 8, hidden)) / 32).astype(np.float32)
    fc2 = (rng.normal(size=(hidden, 10)) / 8).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "conv_w"], ["c"], pads=[1, 1, 1, 1]),  # (B, 16, 8, 8)
             helper.make_node("Mul", ["c", "c"], ["c2"]),
             helper.make_node("Flatten", ["c2"], ["f"], axis=1),  # (B, 1024)
             helper.make_node("MatMul", ["f", "fc1"], ["h"]),  # (B, hidden)
             helper.make_node("Mul", ["h", "h"], ["h2"]),
             helper.make_node("MatMul", ["h2", "fc2"], ["logits"])]  # (B, 10)
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 1, 8, 8])],
                  [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 10])],
                  [numpy_helper.from_array(a, n) for a, n in ((conv_w, "conv_w"), (fc1, "fc1"), (fc2, "fc2"))])


def config_pbtxt(name: str, model: onnx.ModelProto, max_batch_size: int = 0, batching: str | None = None,
                 extra: str = "") -> str:
    """A Triton ``config.pbtxt`` declaring the graph's inputs/outputs (batch dim dropped when batched), written by
    :func:`veil.kinds.config_pbtxt` as every exporter's is."""
    def tensors(values: list) -> list[Tensor]:
        rows = []
        for v in values:
            datatype = next(k for k, t in _ONNX_TYPES.items() if t == v.type.tensor_type.elem_type)
            dims = [d.dim_value if d.HasField("dim_value") else -1 for d in v.type.tensor_type.shape.dim]
            rows.append(Tensor(v.name, datatype_to_triton(datatype), dims[1:] if max_batch_size > 0 else dims))
        return rows

    return kinds.config_pbtxt(name, Backend.ONNXRUNTIME, tensors(list(model.graph.input)),
                              tensors(list(model.graph.output)), max_batch_size=max_batch_size,
                              batching=batching) + extra


def write_repository(repo: str | Path, models: dict[str, onnx.ModelProto], max_batch_size: int | dict[str, int] = 0,
                     batching: dict[str, str] | None = None, versions: tuple[int, ...] = (1,)) -> Path:
    """Write ``<repo>/<name>/config.pbtxt`` and ``<repo>/<name>/<version>/model.onnx`` for each model.

    Args:
        repo: the repository folder (created).
        models: name -> ONNX model.
        max_batch_size: written into every config, or name -> value (0 or absent: no batch dim).
        batching: name -> the body of its ``dynamic_batching { }`` block (absent: no batching).
        versions: version folders to write (the same graph in each).
    """
    repo = Path(repo)
    for name, model in models.items():
        folder = repo / name
        for version in versions:
            (folder / str(version)).mkdir(parents=True, exist_ok=True)
            onnx.save(model, folder / str(version) / "model.onnx")
        body = (batching or {}).get(name)
        mbs = max_batch_size.get(name, 0) if isinstance(max_batch_size, dict) else max_batch_size
        (folder / "config.pbtxt").write_text(config_pbtxt(name, model, mbs, body))
    return repo
