"""Where a deep ONNX graph can be cut between refresh rounds, and each piece as a model of its own.

A cut point is an ONNX tensor that is the only ciphertext-dependent value alive between the nodes before it and
the nodes after it (for sequential and residual CNNs: between blocks); :mod:`veil.he.segments` searches over them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import onnx


def cut_candidates(model: onnx.ModelProto) -> list[str]:
    """Tensors where the only ciphertext-dependent value alive between earlier and later nodes is that tensor.

    Walks the (topologically sorted) nodes; a tensor is dynamic when it depends on the graph input. After
    node i the live set is every dynamic tensor made at or before i that a later node (or the graph
    output) reads. Constants computed by earlier nodes do not count: extraction copies them.
    """
    graph = model.graph
    source, sink = graph.input[0].name, graph.output[0].name
    dynamic, made_at = {source}, {source: -1}
    for i, node in enumerate(graph.node):
        if any(t in dynamic for t in node.input):
            for t in node.output:
                dynamic.add(t)
                made_at[t] = i
    last_use = {t: (len(graph.node) if t == sink else -1) for t in dynamic}
    for i, node in enumerate(graph.node):
        for t in node.input:
            if t in dynamic:
                last_use[t] = max(last_use[t], i)
    candidates = []
    for i in range(len(graph.node) - 1):
        live = [t for t in dynamic if made_at[t] <= i < last_use[t]]
        if len(live) == 1 and live[0] not in (source, sink) and live[0] not in candidates:
            candidates.append(live[0])
    return candidates


def with_shapes(model: onnx.ModelProto, names: list[str]) -> onnx.ModelProto:
    """The model with value_info for ``names`` (shape inference when the exporter did not record them)."""
    import onnx

    known = {v.name for v in (*model.graph.value_info, *model.graph.input, *model.graph.output)}
    return model if all(n in known for n in names) else onnx.shape_inference.infer_shapes(model)


def extract_segment(model: onnx.ModelProto, start: str, end: str) -> onnx.ModelProto:
    """The nodes from tensor ``start`` to tensor ``end`` as a one-input, one-output model (initializers,
    local functions and opsets kept). ``start`` keeps its (batch, ...) value info, so compile sees static
    per-sample dims."""
    import onnx.utils

    extractor = onnx.utils.Extractor(model)
    segment = extractor.extract_model([start], [end])
    segment.ir_version = model.ir_version
    return segment
