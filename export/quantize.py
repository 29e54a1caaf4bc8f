"""int8 quantization with ONNX Runtime's tools: static QDQ (calibrated) for CNNs, dynamic for transformers.

Both quantize weights per channel (S8S8, QDQ format, ORT's first choice on x86 CPUs) and only the
matrix-product operators (Conv, MatMul, Gemm): veil's polynomial functions are inlined first and their
element-wise arithmetic stays in float, where an int8 round trip would cost accuracy for no speed.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx.inliner import inline_local_functions
from onnxruntime.quantization import (
    CalibrationDataReader,
    CalibrationMethod,
    QuantFormat,
    QuantType,
    quantize_dynamic,
    quantize_static,
)

QUANTIZED_OPS = ["Conv", "MatMul", "Gemm"]


class _ArrayReader(CalibrationDataReader):
    """Feeds calibration samples in mini-batches of 32 under one input name."""

    def __init__(self, input_name: str, samples: np.ndarray) -> None:
        self.batches = iter([{input_name: samples[i:i + 32]} for i in range(0, len(samples), 32)])

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self.batches, None)


def quantize_static_int8(model: onnx.ModelProto, input_name: str, calibration: np.ndarray) -> onnx.ModelProto:
    """Static QDQ int8 (per-channel weights, MinMax-calibrated activations) of a float graph."""
    if calibration.ndim < 2 or len(calibration) < 8:
        raise ValueError(f"calibration: expected >= 8 samples shaped (N, ...), received shape {calibration.shape}")
    with tempfile.TemporaryDirectory() as tmp:
        src, dst = Path(tmp) / "fp32.onnx", Path(tmp) / "int8.onnx"
        onnx.save_model(inline_local_functions(model), str(src))
        quantize_static(str(src), str(dst), _ArrayReader(input_name, calibration.astype(np.float32)),
                        quant_format=QuantFormat.QDQ, activation_type=QuantType.QInt8, weight_type=QuantType.QInt8,
                        per_channel=True, op_types_to_quantize=QUANTIZED_OPS, calibrate_method=CalibrationMethod.MinMax)
        return onnx.load_model(str(dst))


def quantize_dynamic_int8(model: onnx.ModelProto, per_channel: bool = True) -> onnx.ModelProto:
    """Dynamic int8 (weights quantized offline, activation scales at run time) of a float graph."""
    with tempfile.TemporaryDirectory() as tmp:
        src, dst = Path(tmp) / "fp32.onnx", Path(tmp) / "int8.onnx"
        onnx.save_model(inline_local_functions(model), str(src))
        quantize_dynamic(str(src), str(dst), weight_type=QuantType.QInt8, per_channel=per_channel,
                         op_types_to_quantize=["MatMul", "Gemm"])
        return onnx.load_model(str(dst))
