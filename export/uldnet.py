"""Export a ULD-Net checkpoint (veil train uldnet) into a model repository, validated and optionally int8."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from veil.training.checkpoint import checkpoint_hash
from veil.training.uldnet import (
    load_digits_preset,
    load_npz,
    load_photos32,
    load_uldnet,
    multiplicative_depth,
)

from veil.kinds import Kind

from .errors import ExportError
from .onnx_export import export_graph
from .quantize import quantize_static_int8
from .repository import TensorSpec, write_model
from .validate import cpu_session, validate_export

EXAMPLE_BATCH = 4
VALIDATION_CASES = [{"batch": 1}, {"batch": 3}, {"batch": 17}]
BUNDLED = {"preset:digits": load_digits_preset, "preset:photos32": load_photos32}  # data veil can reload


def input_contract(config: dict[str, Any]) -> dict[str, Any]:
    """What the model's input ``x`` must be (dtype, shape, value scale, normalisation), from the checkpoint's
    config; a checkpoint that predates the contract gets the digits one when it was trained on digits."""
    shape = list(config["model"]["input_shape"])
    contract = config["data"].get("input")
    if contract is None and config["data"]["source"] in BUNDLED:
        contract = BUNDLED[config["data"]["source"]]().contract()
    if contract is None:
        contract = {"dtype": "float32", "shape": shape, "scale": "unknown (checkpoint written before veil recorded it)",
                    "normalization": "unknown"}
    return {"name": "x", **contract}


def _reference_data(config: dict[str, Any], calibration: Path | None) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    """(calibration inputs, evaluation inputs, evaluation labels) for quantization."""
    if calibration is not None:
        data = load_npz(calibration)
        return data.x_train, data.x_test, data.y_test
    if config["data"]["source"] in BUNDLED:
        data = BUNDLED[config["data"]["source"]]()
        return data.x_val, data.x_test, data.y_test
    raise ExportError(f"--calibration: the checkpoint was trained on {config['data']['source']!r}, which veil cannot "
                      "reload; pass an .npz with x (and y) for int8 calibration")


def _validation_inputs(config: dict[str, Any], shape: list[int]) -> tuple[Any, str]:
    """Inputs of one validation case: rows of the checkpoint's own validation split when veil can reload it
    (a trained polynomial network is only bounded near its data: stacked PolyActs overflow float32 to NaN on
    standard-normal inputs), standard normal otherwise; seeded either way."""
    generator = torch.Generator().manual_seed(0)
    rows, source = None, config["data"]["source"]
    if source in BUNDLED:
        rows = torch.from_numpy(np.ascontiguousarray(BUNDLED[source]().x_val, dtype=np.float32))

    def make(batch: int) -> dict[str, torch.Tensor]:
        if rows is None:
            return {"x": torch.randn(batch, *shape, generator=generator)}
        return {"x": rows[torch.randint(len(rows), (batch,), generator=generator)]}

    preset = source.partition(":")[2]
    return make, "standard normal" if rows is None else f"rows of the {preset} preset's validation split"


def _accuracy(session, x: np.ndarray, y: np.ndarray) -> float:
    logits = np.concatenate([session.run(["logits"], {"x": x[i:i + 256]})[0] for i in range(0, len(x), 256)])
    return float((logits.argmax(axis=1) == y).mean())


def export_uldnet(checkpoint: str | Path, repo: str | Path, name: str | None = None, version: int = 1,
                  quantize: str | None = None, calibration: Path | None = None, max_batch_size: int = 64) -> dict[str, Any]:
    """Export, validate, (quantize) and write a ULD-Net checkpoint; returns the manifest written to veil.json."""
    model, config = load_uldnet(checkpoint)
    shape = list(config["model"]["input_shape"])
    name = name or Path(checkpoint).resolve().name
    graph = export_graph(model, (torch.randn(EXAMPLE_BATCH, *shape),), ["x"], ["logits"], {"x": {0: "batch"}})
    make_inputs, samples = _validation_inputs(config, shape)
    validation = validate_export(model, graph.model, make_inputs, VALIDATION_CASES, {"x": {0: "batch"}}, ["logits"])
    validation["samples"] = samples
    depth = multiplicative_depth(model)
    manifest: dict[str, Any] = {
        "name": name, "version": version,
        "kind": Kind.ULDNET_CLASSIFIER.value,
        "classes": config["data"]["classes"],
        "source": {"checkpoint": str(Path(checkpoint).resolve()), "sha256": checkpoint_hash(checkpoint),
                   "model": config["model"]},
        "export": graph.info,
        "validation": validation,
        "depth": depth.to_dict(),
        "precision": "fp32",
        "input": input_contract(config),  # also in the ONNX file's metadata_props as veil.input
    }
    served = graph.model
    if quantize == "int8":
        calib, x_eval, y_eval = _reference_data(config, calibration)
        served = quantize_static_int8(graph.model, "x", calib)
        quant: dict[str, Any] = {"scheme": "static QDQ S8S8, per-channel weights, MinMax calibration",
                                 "operators": ["Conv", "MatMul", "Gemm"], "calibration_samples": len(calib)}
        if y_eval is not None:
            fp32, int8 = _accuracy(cpu_session(graph.model), x_eval, y_eval), _accuracy(cpu_session(served), x_eval, y_eval)
            quant.update(fp32_accuracy=fp32, int8_accuracy=int8, accuracy_delta=int8 - fp32, evaluated_on=len(y_eval))
        manifest.update(precision="int8", quantization=quant)
    elif quantize is not None:
        raise ExportError(f"--quantize: expected 'int8' or nothing, received {quantize!r}")
    served.metadata_props.add(key="veil.input", value=json.dumps(manifest["input"], sort_keys=True))
    write_model(repo, name, version, served, [TensorSpec("x", "float32", [-1, *shape])],
                [TensorSpec("logits", "float32", [-1, len(config["data"]["classes"])])], manifest,
                max_batch_size=max_batch_size)
    return manifest
