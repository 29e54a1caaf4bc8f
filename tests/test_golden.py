"""Golden files (CompressAI's ``tests/expected/``): what a fixed tiny model produces, pinned by hash.

- codec: the seeded tiny ARPC codec of tests/codec (trained 40 + 40 steps on one thread, float32, CPU), exported
  to ONNX; the SHA-256 of the bitstream of a fixed 32x48 photo crop, of the image decoded from it, the length.
- HE: the plan hash (``Plan.hash``: canonical spec + every pre-encoded tensor) of a seeded 6-4-3 polynomial ONNX
  graph compiled by ``veil.he.compile`` in both modes (compile only: no keys, no encryption).

A change of format, coder, layout or compiler shows up here as a hash change. If it is intended, regenerate with
``VEIL_REGEN_GOLDEN=1 pytest tests/test_golden.py`` and commit the new files with the change that caused them; a
missing golden file is a failure, never silently written.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

EXPECTED = Path(__file__).resolve().parent / "expected"
REGEN = os.environ.get("VEIL_REGEN_GOLDEN") == "1"


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def check_golden(name: str, observed: dict[str, Any]) -> None:
    """Compare ``observed`` with ``tests/expected/<name>.json`` (written instead under VEIL_REGEN_GOLDEN=1)."""
    path = EXPECTED / f"{name}.json"
    if REGEN:
        EXPECTED.mkdir(exist_ok=True)
        path.write_text(json.dumps(observed, indent=2, sort_keys=True) + "\n")
        return
    assert path.is_file(), (f"golden file {path} is missing; generate it with VEIL_REGEN_GOLDEN=1 "
                            f"pytest {Path(__file__).name} and commit it")
    expected = json.loads(path.read_text())
    assert observed == expected, (f"{path.name}: the output changed (expected {expected}, received {observed}); "
                                  f"if intended, regenerate with VEIL_REGEN_GOLDEN=1 and commit the file")


def tiny_codec(base: Path) -> Path:
    """The tiny codec tests/codec/conftest.py trains (40 + 40 steps, one thread, seeded) and exports once per
    session under ``base``: shared, so the suite pays its ONNX export (minutes on 2 busy cores) once."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("codec_conftest", Path(__file__).parent / "codec" / "conftest.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.tiny_codec(base)


def test_codec_bitstream_and_decoded_image(tmp_path_factory: pytest.TempPathFactory) -> None:
    import skimage.data
    from veil.codec.runtime import CodecRuntime

    image = np.ascontiguousarray(skimage.data.astronaut()[100:132, 180:228])  # (32, 48, 3) uint8
    codec = CodecRuntime(tiny_codec(tmp_path_factory.getbasetemp()), threads=1)
    encoded = codec.encode(image)
    decoded = codec.decode(encoded.data)
    assert decoded.shape == image.shape and decoded.dtype == np.uint8
    assert np.array_equal(codec.decode(encoded.data), decoded)  # same stream, same image (no hidden state)
    check_golden("codec_tiny", {"bitstream_sha256": sha256(encoded.data), "bitstream_bytes": len(encoded.data),
                                          "scales_sent": encoded.k, "decoded_sha256": sha256(decoded.tobytes())})


def tiny_poly_onnx():
    """x (B, 6) -> Gemm(4) -> square -> Gemm(3): a seeded degree-2 polynomial network as plain ONNX."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w1, b1 = rng.normal(size=(4, 6)).astype(np.float32), rng.normal(size=4).astype(np.float32)
    w2, b2 = rng.normal(size=(3, 4)).astype(np.float32), rng.normal(size=3).astype(np.float32)
    nodes = [helper.make_node("Gemm", ["x", "w1", "b1"], ["h"], transB=1),
             helper.make_node("Mul", ["h", "h"], ["h2"]),
             helper.make_node("Gemm", ["h2", "w2", "b2"], ["y"], transB=1)]
    graph = helper.make_graph(nodes, "tiny_poly", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["B", 3])],
                              [numpy_helper.from_array(a, n) for a, n in ((w1, "w1"), (b1, "b1"), (w2, "w2"),
                                                                          (b2, "b2"))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    onnx.checker.check_model(model)
    return model


def test_he_plan_hash() -> None:
    from veil.he.compile import compile as he_compile

    model = tiny_poly_onnx()
    plans = {mode: he_compile(model, mode=mode) for mode in ("latency", "throughput")}
    assert plans["latency"].hash() == he_compile(model, mode="latency").hash()  # compile is a function of the graph
    check_golden("he_plan_tiny_poly", {f"{mode}_plan_hash": plan.hash() for mode, plan in plans.items()}
                 | {"levels": plans["latency"].spec.get("levels")})


def test_a_missing_golden_file_is_a_failure(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(f"{__name__}.EXPECTED", tmp_path)
    monkeypatch.setattr(f"{__name__}.REGEN", False)
    with pytest.raises(AssertionError, match="missing"):
        check_golden("absent", {"x": 1})
    (tmp_path / "present.json").write_text('{"x": 1}')
    check_golden("present", {"x": 1})
    with pytest.raises(AssertionError, match="changed"):
        check_golden("present", {"x": 2})
