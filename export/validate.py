"""Loud export validation: ONNX Runtime against PyTorch at shapes other than the export example.

Unlike Optimum, which only warns, a failed check raises ExportValidationError naming the output, the
input shapes, the observed and allowed difference and, where the graph allows it, the first ONNX node
whose value diverges (found by exposing intermediate values of the veil functions and comparing them
with the matching torch modules).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import torch
from torch import nn

from .errors import ExportValidationError

# (atol, rtol) by output dtype: |onnx - torch| <= atol + rtol * max|torch| must hold for every element.
TOLERANCES: dict[str, tuple[float, float]] = {"float32": (1e-4, 1e-3), "float16": (1e-2, 1e-2), "float64": (1e-8, 1e-6)}


def cpu_session(model: onnx.ModelProto | bytes | str) -> ort.InferenceSession:
    """A CPU session; errors-only logging for a model whose graph inputs default to initializers.

    An adapter model's LoRA and head inputs are such inputs by design (the base runs without them), and ORT warns
    once per input at every session ("Initializer ... appears in graph inputs"): at export that is noise.
    """
    if isinstance(model, onnx.ModelProto):
        proto, data = model, model.SerializeToString()
    elif isinstance(model, bytes):
        proto, data = onnx.load_model_from_string(model), model
    else:  # a path: ORT reads it itself (external data beside it); the graph is parsed once here, weights left out
        proto, data = onnx.load(model, load_external_data=False), model
    options = ort.SessionOptions()
    if shadowed_inputs(proto):
        options.log_severity_level = 3
    return ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])


def shadowed_inputs(model: onnx.ModelProto) -> list[str]:
    """Graph inputs that also have an initializer (ORT treats them as overridable defaults and warns)."""
    initializers = {t.name for t in model.graph.initializer}
    return [i.name for i in model.graph.input if i.name in initializers]


def symbolic_inputs(model: onnx.ModelProto) -> dict[str, list[int | str]]:
    """Input shapes as declared by the graph: ints for fixed dims, names for symbolic ones."""
    return {i.name: [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim] for i in model.graph.input}


def validate_export(torch_model: nn.Module, onnx_model: onnx.ModelProto, make_inputs: Callable[..., dict[str, torch.Tensor]],
                    cases: list[dict[str, int]], dynamic_dims: dict[str, dict[int, str]],
                    output_names: list[str]) -> dict[str, Any]:
    """Compare every output on every case; return the report, or raise ExportValidationError.

    Args:
        make_inputs: builds named torch inputs for one case, e.g. ``make_inputs(batch=3)``.
        cases: keyword sets for make_inputs; at least two, differing from the export example.
        dynamic_dims: the declared dynamic axes, checked to have stayed symbolic in the graph.
    """
    if len(cases) < 2:
        raise ExportValidationError(f"validation cases: expected >= 2 input shapes, received {len(cases)}")
    declared = symbolic_inputs(onnx_model)
    for name, axes in dynamic_dims.items():
        for axis, dim in axes.items():
            if not isinstance(declared[name][axis], str):
                raise ExportValidationError(f"input {name!r}: axis {axis} ({dim}) was specialised to "
                                            f"{declared[name][axis]} in the graph; expected a symbolic dimension")
    session = cpu_session(onnx_model)
    torch_model = torch_model.eval()
    report: dict[str, Any] = {"passed": True, "tolerances": TOLERANCES, "cases": [], "inputs": declared}
    for case in cases:
        inputs = make_inputs(**case)
        with torch.no_grad():
            expected = torch_model(*inputs.values())
        expected = expected if isinstance(expected, (tuple, list)) else (expected,)
        got = session.run(output_names, {k: v.numpy() for k, v in inputs.items()})
        entry = {"case": case, "shapes": {k: list(v.shape) for k, v in inputs.items()}, "outputs": {}}
        for name, ref, out in zip(output_names, expected, got, strict=True):
            ref = ref.detach().numpy()
            atol, rtol = TOLERANCES.get(str(ref.dtype), TOLERANCES["float32"])
            diff = float(np.max(np.abs(out.astype(np.float64) - ref))) if ref.size else 0.0
            allowed = atol + rtol * float(np.max(np.abs(ref))) if ref.size else atol
            entry["outputs"][name] = {"max_abs_diff": diff, "allowed": allowed, "shape": list(out.shape)}
            if out.shape != ref.shape or not diff <= allowed:
                report["passed"] = False
                where = first_diverging_node(torch_model, onnx_model, inputs)
                raise ExportValidationError(
                    f"output {name!r} at input shapes {entry['shapes']}: max |onnx - torch| = {diff:.3g} > allowed "
                    f"{allowed:.3g} (shapes onnx {list(out.shape)} vs torch {list(ref.shape)})"
                    + (f"; first diverging node: {where}" if where else ""))
        report["cases"].append(entry)
    return report


def first_diverging_node(torch_model: nn.Module, onnx_model: onnx.ModelProto, inputs: dict[str, torch.Tensor]) -> str | None:
    """The first veil-function node (graph order) whose output differs from its torch module's output.

    veil nodes are matched to modules of the same kind in execution order (PolyNorm, PolyAct,
    LinearAttention); None when the graph has no veil nodes or all of them agree.
    """
    from veil.training.uldnet import LinearAttention, PolyAct, PolyNorm

    kinds = {"PolyNorm": PolyNorm, "PolyAct": PolyAct, "LinearAttention": LinearAttention}
    nodes = [n for n in onnx_model.graph.node if n.domain == "veil" and n.op_type in kinds]
    if not nodes:
        return None
    captured: dict[str, list[np.ndarray]] = {k: [] for k in kinds}
    hooks = [m.register_forward_hook(lambda mod, _i, out, kind=kind: captured[kind].append(out.detach().numpy()))
             for m in torch_model.modules() for kind, cls in kinds.items() if isinstance(m, cls)]
    try:
        with torch.no_grad():
            torch_model(*inputs.values())
    finally:
        for h in hooks:
            h.remove()
    probe = onnx.ModelProto()
    probe.CopyFrom(onnx_model)
    for node in nodes:
        probe.graph.output.append(onnx.ValueInfoProto(name=node.output[0]))
    values = cpu_session(probe).run([n.output[0] for n in nodes], {k: v.numpy() for k, v in inputs.items()})
    seen = {k: 0 for k in kinds}
    for node, value in zip(nodes, values, strict=True):
        index = seen[node.op_type]
        seen[node.op_type] += 1
        if index >= len(captured[node.op_type]):
            return f"{node.name} ({node.op_type}): no matching torch module"
        ref = captured[node.op_type][index]
        if value.shape != ref.shape or not np.allclose(value, ref, atol=1e-4, rtol=1e-3):
            return f"{node.name} (veil.{node.op_type} #{index}, max diff {float(np.max(np.abs(value - ref))):.3g})"
    return None
