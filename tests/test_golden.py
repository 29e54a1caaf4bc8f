"""Golden files (CompressAI's ``tests/expected/``): fixed inputs and fixed weights, pinned byte for byte.

- codec: a tiny ARPC codec's exported ONNX files are committed (``tests/expected/codec_tiny/``), with a bitstream
  encoded from them (``codec_tiny.vc``) and the SHA-256 of the image decoded from it. Nothing here is trained in the
  test session: PyTorch's CPU kernels do not give bit-identical floats across processors (vector width, FMA,
  oneDNN code paths), so weights trained here would differ from the machine that wrote the golden file. The test
  checks (a) encoding the fixed crop with the committed model reproduces the committed stream byte for byte and
  (b) decoding the committed stream reproduces the committed image hash: the cross-machine decoding check
  docs/codec.md describes.
- HE: the plan hash (``Plan.hash``: canonical spec + every pre-encoded tensor) of a seeded 6-4-3 polynomial ONNX
  graph compiled by ``veil.he.compile`` in both modes (numpy only, weights from a seeded generator, no training;
  compile only: no keys, no encryption).

A change of format, coder, layout or compiler shows up here as a hash change. If it is intended, regenerate with
``VEIL_REGEN_GOLDEN=1 pytest tests/test_golden.py`` and commit the new files with the change that caused them
(the codec's stream and hashes are re-encoded from the committed model; delete ``tests/expected/codec_tiny/`` first
to train and export a new tiny model); a missing golden file is a failure, never silently written.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

EXPECTED = Path(__file__).resolve().parent / "expected"
REGEN = os.environ.get("VEIL_REGEN_GOLDEN") == "1"
CODEC_MODEL = EXPECTED / "codec_tiny"  # the committed version folder: codec.json + encoder/decoder/prior.onnx
CODEC_STREAM = EXPECTED / "codec_tiny.vc"


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


def golden_crop() -> np.ndarray:
    """The fixed input: a (32, 48, 3) uint8 crop of skimage's astronaut photo."""
    import skimage.data

    return np.ascontiguousarray(skimage.data.astronaut()[100:132, 180:228])


def train_tiny_codec(tmp: Path) -> None:
    """Regeneration only: train and export the tiny codec of tests/codec/conftest.py and commit its version folder."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("codec_conftest", Path(__file__).parent / "codec" / "conftest.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    shutil.copytree(module.tiny_codec(tmp), CODEC_MODEL)


def test_codec_bitstream_and_decoded_image(tmp_path: Path) -> None:
    from veil.codec.runtime import CodecRuntime

    if REGEN and not CODEC_MODEL.is_dir():
        train_tiny_codec(tmp_path)
    assert CODEC_MODEL.is_dir(), f"the committed tiny codec {CODEC_MODEL} is missing"
    codec = CodecRuntime(CODEC_MODEL, threads=1)
    encoded = codec.encode(golden_crop())
    if REGEN:
        CODEC_STREAM.write_bytes(encoded.data)
    assert CODEC_STREAM.is_file(), f"the committed stream {CODEC_STREAM} is missing"
    committed = CODEC_STREAM.read_bytes()
    decoded = codec.decode(committed)
    assert decoded.shape == golden_crop().shape and decoded.dtype == np.uint8
    assert np.array_equal(codec.decode(committed), decoded)  # same stream, same image (no hidden state)
    check_golden("codec_tiny", {"model_hash": codec.hash, "bitstream_sha256": sha256(committed),
                                "bitstream_bytes": len(committed), "scales_sent": encoded.k,
                                "decoded_sha256": sha256(decoded.tobytes())})
    assert encoded.data == committed, (f"encoding the fixed crop with the committed model no longer reproduces "
                                       f"{CODEC_STREAM.name} ({len(encoded.data)} vs {len(committed)} bytes)")


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
    from veil.he.compiler import compile as he_compile

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


def test_one_flipped_bit_of_the_committed_stream_fails_the_codec_golden_check() -> None:
    from veil.codec.errors import CodecError
    from veil.codec.runtime import CodecRuntime

    codec, committed = CodecRuntime(CODEC_MODEL, threads=1), bytearray(CODEC_STREAM.read_bytes())
    expected = json.loads((EXPECTED / "codec_tiny.json").read_text())
    for bit in (8 * len(committed) // 2, 8 * len(committed) - 1):  # one bit in the payload, the stream's last bit
        flipped = bytearray(committed)
        flipped[bit // 8] ^= 1 << (bit % 8)
        assert sha256(bytes(flipped)) != expected["bitstream_sha256"]
        try:
            decoded_sha = sha256(codec.decode(bytes(flipped)).tobytes())
        except CodecError:
            continue  # refused: the check fails too
        observed = dict(expected, bitstream_sha256=sha256(bytes(flipped)), decoded_sha256=decoded_sha)
        with pytest.raises(AssertionError, match="changed"):
            check_golden("codec_tiny", observed)


@pytest.mark.parametrize("coretype", ["Prescott", "SkylakeX"])
def test_the_plan_hash_does_not_depend_on_the_blas_kernel(coretype: str) -> None:
    """numpy's OpenBLAS picks its kernels by processor; forcing the SSE3-only (Prescott) and the AVX-512 (SkylakeX)
    ones stands in for another machine: the compiler's weight products must give the same plan either way."""
    import subprocess
    import sys

    if coretype == "SkylakeX" and "avx512f" not in _cpu_flags():
        pytest.skip("this processor has no AVX-512: OpenBLAS's SkylakeX kernels would die of SIGILL")
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import test_golden as g; "
            "from veil.he.compiler import compile as c; print(c(g.tiny_poly_onnx(), mode='latency').hash())")
    env = dict(os.environ, OPENBLAS_CORETYPE=coretype)
    out = subprocess.run([sys.executable, "-c", code, str(Path(__file__).parent)], env=env, capture_output=True,
                         text=True, timeout=120, check=True).stdout.split()[-1]
    assert out == json.loads((EXPECTED / "he_plan_tiny_poly.json").read_text())["latency_plan_hash"]


def _cpu_flags() -> set[str]:
    """The processor's feature flags (/proc/cpuinfo; empty where there is none)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    return next((set(line.split(":", 1)[1].split()) for line in text.splitlines() if line.startswith("flags")), set())
