"""torch -> ONNX with ``torch.onnx.export(dynamo=True)``, veil's layers as ``veil``-domain ONNX functions.

Dynamic dimensions are declared by name; example inputs must have size >= 2 on every dynamic dimension so
that nothing is specialised to 1 (torch.export treats sizes 0 and 1 as constants).
"""

from __future__ import annotations

import importlib.metadata as md
import logging
import warnings
from dataclasses import dataclass, field
from typing import Any

import onnx
import torch
from torch import nn

from .errors import ExportError
from .functions import DEFAULT_OPSET, TRANSLATIONS, attach_functions
from .swap import swap_for_export

EXPORTER = "torch.onnx.export(dynamo=True)"
# Node metadata the exporter records that names files on the exporting machine: dropped, so that an export is a
# function of the model (the same bytes from any checkout) and leaks no local paths into a published artifact.
SOURCE_LOCATION_KEYS = frozenset({"pkg.torch.onnx.stack_trace"})


@dataclass
class ExportedGraph:
    """An exported, checked ONNX model and what was recorded about its export."""

    model: onnx.ModelProto
    info: dict[str, Any] = field(default_factory=dict)


def package_versions() -> dict[str, str]:
    versions = {}
    for name in ("veil", "torch", "onnx", "onnxscript", "onnxruntime", "transformers"):
        try:
            versions[name] = md.version(name)
        except md.PackageNotFoundError:
            continue
    return versions


def strip_source_locations(proto: onnx.ModelProto) -> onnx.ModelProto:
    """Remove ``SOURCE_LOCATION_KEYS`` from every node of the graph, its subgraphs and its functions (in place)."""
    def clean(nodes) -> None:
        for node in nodes:
            kept = [p for p in node.metadata_props if p.key not in SOURCE_LOCATION_KEYS]
            if len(kept) != len(node.metadata_props):
                del node.metadata_props[:]
                node.metadata_props.extend(kept)
            for attribute in node.attribute:
                for graph in ([attribute.g] if attribute.HasField("g") else []) + list(attribute.graphs):
                    clean(graph.node)

    clean(proto.graph.node)
    for function in proto.functions:
        clean(function.node)
    return proto


def export_graph(model: nn.Module, example_inputs: tuple[torch.Tensor, ...], input_names: list[str],
                 output_names: list[str], dynamic_dims: dict[str, dict[int, str]]) -> ExportedGraph:
    """Export ``model`` (eval mode) to ONNX and check it; raise ExportError naming what went wrong.

    Args:
        model: the torch module; veil layers are swapped for ``veil::*`` ops on a copy.
        example_inputs: positional inputs; every dynamic dimension must have size >= 2.
        input_names / output_names: graph names, in forward() order.
        dynamic_dims: ``{input_name: {axis: "dim_name"}}``, e.g. ``{"x": {0: "batch"}}``.
    """
    if len(input_names) != len(example_inputs):
        raise ExportError(f"input_names: expected {len(example_inputs)} names (one per example input), received {input_names}")
    for name, tensor in zip(input_names, example_inputs, strict=True):
        for axis, dim in dynamic_dims.get(name, {}).items():
            if tensor.shape[axis] < 2:
                raise ExportError(f"example input {name!r}: dynamic axis {axis} ({dim}) needs size >= 2 so it is not "
                                  f"specialised to a constant, received {tensor.shape[axis]}")
    logging.getLogger("torch.onnx._internal.exporter._registration").setLevel(logging.ERROR)  # torchvision notices
    swapped = swap_for_export(model)
    dynamic_shapes = tuple(dynamic_dims.get(name, {}) for name in input_names)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*LeafSpec.*", category=FutureWarning)  # exporter internals
        warnings.filterwarnings("ignore", message="# The axis name", category=UserWarning)
        try:
            program = torch.onnx.export(swapped, example_inputs, dynamo=True, dynamic_shapes=dynamic_shapes,
                                        input_names=input_names, output_names=output_names, opset_version=DEFAULT_OPSET,
                                        custom_translation_table=TRANSLATIONS, optimize=True, verbose=False)
        except Exception as exc:  # the exporter's own errors are long; keep the first lines and re-raise typed
            summary = "\n".join(str(exc).splitlines()[:6])
            raise ExportError(f"torch.onnx.export(dynamo=True) failed for {type(model).__name__}: {summary}") from exc
    proto = strip_source_locations(attach_functions(program.model_proto))
    proto.producer_name = "veil"
    onnx.checker.check_model(proto, full_check=True)
    constraints = {str(k): str(v) for k, v in program.exported_program.range_constraints.items()}
    info = {
        "exporter": EXPORTER,
        "opset": DEFAULT_OPSET,
        "veil_functions": sorted({f.name for f in proto.functions if f.domain == "veil"}),
        "dynamic_dims": dynamic_dims,
        "range_constraints": constraints,
        "example_shapes": {n: list(t.shape) for n, t in zip(input_names, example_inputs, strict=True)},
        "versions": package_versions(),
    }
    return ExportedGraph(proto, info)
