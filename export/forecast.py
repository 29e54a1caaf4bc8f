"""Export a `veil train forecast` checkpoint: the whole forecaster as one affine map, in ONNX and as an HE plan.

The standardiser, the instance norm (mean, or RevIN on a channel-independent W without bias or learned affine,
whose std division cancels exactly) and W fold into y.flat = x.flat @ A + c on the series' own scale (spec §3.4), so the graph
is ``Reshape -> MatMul -> Add -> Reshape``: x (B, L, C) float32 -> y (B, H, C).

    export_forecast(ckpt, repo, name)                       <repo>/<name>/1/model.onnx, served by `veil serve`
    export_forecast_he(ckpt, repo, name, mode="throughput")  <repo>/<name>/1/plan.json: one plaintext-matrix
                                                            product, depth 1 (exact; no polynomial approximation)

A forecaster that is not affine (RevIN with a bias, a learned affine or a mixed W: the window's std no longer
cancels) is exported for plaintext serving as the un-collapsed graph (ReduceMean, Sqrt, Div: torch ->
ONNX), and refused for HE with NotAffineError: normalise on the client, or fit with ``instance_norm="mean"``
(docs/forecast.md).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper, numpy_helper
from torch import nn
from veil.training.checkpoint import checkpoint_hash
from veil.training.forecast import LinearForecaster, NotAffineError, load_forecaster

from veil.kinds import Kind

from .errors import ExportError, ExportValidationError
from .functions import DEFAULT_OPSET
from .onnx_export import export_graph, package_versions
from .repository import NAME_PATTERN, TensorSpec, write_model
from .validate import TOLERANCES, cpu_session


def affine_graph(a: np.ndarray, c: np.ndarray, lookback: int, horizon: int, channels: int) -> onnx.ModelProto:
    """x (B, L, C) -> (x.reshape(B, L*C) @ A + c).reshape(B, H, C) as a checked float32 ONNX model."""
    inits = [numpy_helper.from_array(a.astype(np.float32), "A"), numpy_helper.from_array(c.astype(np.float32), "c"),
             numpy_helper.from_array(np.array([-1, lookback * channels], np.int64), "flat_shape"),
             numpy_helper.from_array(np.array([-1, horizon, channels], np.int64), "out_shape")]
    nodes = [helper.make_node("Reshape", ["x", "flat_shape"], ["x_flat"], name="flatten"),
             helper.make_node("MatMul", ["x_flat", "A"], ["xa"], name="forecast"),
             helper.make_node("Add", ["xa", "c"], ["y_flat"], name="offset"),
             helper.make_node("Reshape", ["y_flat", "out_shape"], ["y"], name="unflatten")]
    graph = helper.make_graph(nodes, "forecast", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", lookback, channels])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", horizon, channels])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", DEFAULT_OPSET)], producer_name="veil")
    model.ir_version = 9
    onnx.checker.check_model(model, full_check=True)
    return model


class RawForecaster(nn.Module):
    """The un-collapsed forecaster in torch (float32): standardiser, instance norm, RevIN affine, W, b, and back.

    Only for plaintext export of a forecaster that is not one affine map; the rest export :func:`affine_graph`.
    """

    def __init__(self, forecaster: LinearForecaster) -> None:
        super().__init__()
        self.config = forecaster.config
        for name, value in forecaster.to_state().items():
            self.register_buffer(name, torch.from_numpy(np.asarray(value, np.float32)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, L, C) -> (B, H, C)
        z = (x - self.mean) / self.std
        m = z.mean(dim=1, keepdim=True)  # (B, 1, C)
        s = torch.sqrt(((z - m) ** 2).mean(dim=1, keepdim=True) + self.config.revin_eps) \
            if self.config.instance_norm == "revin" else torch.ones_like(m)
        if self.config.instance_norm == "none":
            m = torch.zeros_like(m)
        z = (z - m) / s
        if self.config.revin_affine:
            z = z * self.gamma + self.beta
        batch, lookback, channels = z.shape
        if self.config.channels == "shared":
            y = (z.permute(0, 2, 1) @ self.weight[0] + self.bias[0]).permute(0, 2, 1)  # (B, H, C)
        elif self.config.channels == "individual":
            y = torch.einsum("blc,clh->bhc", z, self.weight) + self.bias.T
        else:
            y = (z.reshape(batch, lookback * channels) @ self.weight[0] + self.bias[0]).reshape(batch, -1, channels)
        if self.config.revin_affine:
            y = (y - self.beta) / self.gamma
        return (y * s + m) * self.std + self.mean


def collapse(forecaster: LinearForecaster) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
    """(A, c) of the forecaster and how exactly they reproduce it (float64, random raw-scale windows)."""
    a, c = forecaster.affine(check=True)
    rng = np.random.default_rng(1)
    x = forecaster.mean + forecaster.std * rng.normal(size=(16, forecaster.config.lookback, forecaster.n_channels))
    want = forecaster.predict_raw(x).reshape(16, -1)
    err = float(np.abs(x.reshape(16, -1) @ a + c - want).max())
    return a, c, {"max_abs_diff": err, "max_abs_output": float(np.abs(want).max())}


def validate_graph(model: onnx.ModelProto, forecaster: LinearForecaster, batches: tuple[int, ...] = (1, 5)) -> dict[str, Any]:
    """ONNX Runtime (float32) against the un-collapsed numpy forecaster (float64) at several batch sizes."""
    session = cpu_session(model)
    atol, rtol = TOLERANCES["float32"]
    rng = np.random.default_rng(2)
    cases = []
    for batch in batches:
        x = forecaster.mean + forecaster.std * rng.normal(size=(batch, forecaster.config.lookback, forecaster.n_channels))
        want = forecaster.predict_raw(x)
        got = session.run(None, {"x": x.astype(np.float32)})[0]
        diff, allowed = float(np.abs(got - want).max()), atol + rtol * float(np.abs(want).max())
        if not diff <= allowed:
            raise ExportValidationError(f"forecast graph: output 'y' at batch {batch} differs from the forecaster by "
                                        f"{diff:.3g}, allowed {allowed:.3g}")
        cases.append({"batch": batch, "max_abs_diff": diff, "allowed": allowed})
    return {"reference": "numpy forecaster (float64, instance norm not collapsed)", "cases": cases}


def _load(checkpoint: str | Path) -> tuple[LinearForecaster, dict[str, Any]]:
    config_file = Path(checkpoint) / "config.json"
    if config_file.is_file() and json.loads(config_file.read_text()).get("kind") != "forecast":
        raise ExportError(f"checkpoint {str(checkpoint)!r}: expected a `veil train forecast` checkpoint (kind "
                          f"'forecast'), received kind {json.loads(config_file.read_text()).get('kind')!r}")
    return load_forecaster(checkpoint)


def _describe(forecaster: LinearForecaster, config: dict[str, Any], checkpoint: str | Path) -> dict[str, Any]:
    model = forecaster.config
    return {"lookback": model.lookback, "horizon": model.horizon, "channels": config["series"]["channels"],
            "layout": model.channels, "instance_norm": model.instance_norm, "fit": config["fit"],
            "source": {"checkpoint": str(Path(checkpoint).resolve()), "sha256": checkpoint_hash(checkpoint)}}


def export_forecast(checkpoint: str | Path, repo: str | Path, name: str | None = None, version: int = 1,
                    max_batch_size: int = 256) -> dict[str, Any]:
    """Collapse, export, validate and publish the plaintext forecaster; returns veil.json's content."""
    forecaster, config = _load(checkpoint)
    name = name or Path(checkpoint).name
    model = forecaster.config
    try:
        a, c, collapse_report = collapse(forecaster)
        graph = affine_graph(a, c, model.lookback, model.horizon, forecaster.n_channels)
        info = {"graph": "Reshape -> MatMul -> Add -> Reshape", "opset": DEFAULT_OPSET, "versions": package_versions()}
    except NotAffineError as exc:  # plaintext only: the normalisation stays in the graph
        collapse_report = {"affine": False, "why": str(exc)}
        example = torch.from_numpy(np.zeros((2, model.lookback, forecaster.n_channels), np.float32))
        exported = export_graph(RawForecaster(forecaster).eval(), (example,), ["x"], ["y"], {"x": {0: "batch"}})
        graph, info = exported.model, exported.info | {"graph": "un-collapsed (instance norm in the graph)"}
    report = validate_graph(graph, forecaster)
    manifest = {"kind": Kind.FORECAST.value, **_describe(forecaster, config, checkpoint), "collapse": collapse_report,
                "validation": report, "precision": "fp32", "export": info}
    spec_in = TensorSpec("x", "float32", [-1, model.lookback, forecaster.n_channels])
    spec_out = TensorSpec("y", "float32", [-1, model.horizon, forecaster.n_channels])
    write_model(repo, name, version, graph, [spec_in], [spec_out], manifest, max_batch_size=max_batch_size)
    return {"name": name, "version": version, **manifest}


def compile_forecast(forecaster: LinearForecaster, mode: str = "latency", precision_bits: int = 20,
                     client_normalisation: bool = False) -> Any:
    """The HE plan of the collapsed forecaster (``veil.he.compile`` on the same ONNX graph).

    With ``client_normalisation`` the plan is only the normalised-space map (:meth:`LinearForecaster.core_affine`):
    the client standardises and instance-normalises its window (``forecaster.normalise``) before encrypting and
    undoes it after decrypting (``forecaster.denormalise``), so any configuration, RevIN included, runs encrypted.
    """
    from veil.he.compiler import compile as he_compile

    a, c = forecaster.core_affine() if client_normalisation else collapse(forecaster)[:2]
    model = forecaster.config
    return he_compile(affine_graph(a, c, model.lookback, model.horizon, forecaster.n_channels), mode=mode,
                      precision_bits=precision_bits)


def export_forecast_he(checkpoint: str | Path, repo: str | Path, name: str, mode: str = "latency", version: int = 1,
                       precision_bits: int = 20, client_normalisation: bool = False) -> dict[str, Any]:
    """Compile the forecaster to an HE plan and publish it as a ``veil_he`` model (served encrypted).

    ``client_normalisation``: see :func:`compile_forecast`; veil.json records it under ``input``.
    """
    from .he import plan_manifest, write_plan_model

    if not NAME_PATTERN.match(name):
        raise ExportError(f"--name: expected letters, digits, '_', '.', '-', received {name!r}")
    forecaster, config = _load(checkpoint)
    plan = compile_forecast(forecaster, mode, precision_bits, client_normalisation)
    manifest = plan_manifest(name, version, mode, plan) | {
        "task": "forecast", **_describe(forecaster, config, checkpoint),
        "input_shape": [forecaster.config.lookback, forecaster.n_channels],
        "batch_capacity": plan.spec["batch_capacity"], "rounds": 1, "cuts": [],
        "input": ("client-normalised: z = (x - mean) / std per channel (train split), then the window's "
                  "instance norm; the client undoes both on the decrypted forecast" if client_normalisation
                  else "raw windows (normalisation folded into the plan)")}
    write_plan_model(repo, name, version, manifest, plan.save)
    return manifest
