"""Rewrite the dynamo-exported padding mask of a transformers-5 BERT encoder into the form ORT's fusions match.

Why: ``onnxruntime.transformers.optimizer`` (model_type="bert") fuses self-attention into ``com.microsoft``
``Attention`` only when the additive mask before Softmax comes from one of the subgraphs it knows. transformers 5
builds the eager mask with ``sdpa_mask`` (vmapped index functions); torch.onnx (dynamo, optimize=True) lowers that
to ``Where(And(And(True, kv_idx >= 0), GatherND(Cast(attention_mask, bool), idx)), 0, finfo.min)``. ORT's
transformers-5 pattern expects ``Where <- Expand <- And <- Reshape <- Reshape <- Gather <- Flatten`` instead, so
``fusion_attention`` stops at "failed to match mask path" in every layer, and the Expand/GatherND chain also
makes ORT's symbolic shape inference fail, which disables SkipLayerNormalization fusion.

The fix is a graph pass, not a different export or a hand-written fusion: the mask tensor is replaced by the
classic BERT extended mask ``(1 - Cast(Unsqueeze(Unsqueeze(attention_mask)))) * fill`` (fill = the exported
``finfo.min``), which ORT matches, so ORT itself packs the QKV weights and builds the mask input. Before the
rewrite the old mask is evaluated on a probe batch (random padding, left padding, holes) and must equal
``attention_mask[:, None, None, :]`` exactly, so a causal or otherwise different mask is never replaced.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .swap import ExportError
from .validate import cpu_session

MASK_INPUT = "attention_mask"


def _constants(graph: onnx.GraphProto) -> dict[str, np.ndarray]:
    """Values of the initializers and Constant-node outputs of ``graph``, by name."""
    values = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            values[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
    return values


def _probe_feeds(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """A batch of 4 x 6 tokens: right, left and inner padding in the mask, zeros for every other input."""
    mask = np.array([[1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0], [0, 0, 1, 1, 1, 1], [1, 0, 1, 0, 0, 1]], dtype=np.int64)
    feeds = {}
    for value in model.graph.input:
        if value.type.tensor_type.elem_type != onnx.TensorProto.INT64:
            raise ExportError(f"graph input {value.name!r}: expected INT64 token inputs, received element type "
                              f"{onnx.TensorProto.DataType.Name(value.type.tensor_type.elem_type)}")
        feeds[value.name] = mask if value.name == MASK_INPUT else np.zeros_like(mask)
    return feeds


def _check_is_padding_mask(model: onnx.ModelProto, condition: str) -> None:
    """Raise ExportError unless ``condition`` evaluates to ``attention_mask[:, None, None, :]`` (broadcast)."""
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    del probe.graph.output[:]
    probe.graph.output.append(onnx.ValueInfoProto(name=condition))
    feeds = _probe_feeds(model)
    got = cpu_session(probe).run([condition], feeds)[0]
    expected = feeds[MASK_INPUT][:, None, None, :].astype(bool)
    if got.ndim != 4 or got.shape[0] != expected.shape[0] or got.shape[1] != 1 or got.shape[3] != expected.shape[3] \
            or not np.array_equal(got, np.broadcast_to(expected, got.shape)):
        raise ExportError(f"attention mask condition {condition!r}: expected attention_mask[:, None, None, :] "
                          f"(a padding mask) on the probe batch, received shape {list(got.shape)} with other values")


def canonicalize_bert_attention(model: onnx.ModelProto, head_size: int) -> tuple[onnx.ModelProto, dict[str, int]]:
    """A copy of ``model`` in the BERT form ORT's attention fusion matches; and how many of each rewrite were made.

    Each ``Softmax(Add(Mul(Q @ K^T, 1 / sqrt(head_size)), Where(condition, 0, fill)))`` gets
    ``Div(Q @ K^T, sqrt(head_size))`` (only for that scale, the one ORT's fused Attention assumes) and, with
    ``condition`` checked to be the broadcast ``attention_mask``, the mask
    ``Mul(Sub(1, Cast(Unsqueeze(Unsqueeze(attention_mask)))), fill)``. Mask nodes left unused are dropped. Both
    rewrites keep the graph's values; a graph without these blocks comes back unchanged (counts 0).
    """
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    producer = {o: n for n in graph.node for o in n.output}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    constants = _constants(graph)
    scales, wheres = [], {}
    for softmax in (n for n in graph.node if n.op_type == "Softmax"):
        add = producer.get(softmax.input[0])
        parents = [producer.get(i) for i in add.input] if add is not None and add.op_type == "Add" else []
        kinds = sorted(p.op_type for p in parents if p is not None)
        if kinds != ["Mul", "Where"]:
            continue
        mul, where = sorted((p for p in parents if p is not None), key=lambda p: p.op_type)
        factor = next((constants[i] for i in mul.input if i in constants), None)
        if factor is not None and factor.size == 1 and np.isclose(factor.item(), head_size ** -0.5, rtol=1e-6, atol=0):
            scales.append(mul)
        wheres[where.output[0]] = where
    if MASK_INPUT in {i.name for i in graph.input}:
        new_nodes = [_padding_mask(model, where, constants, consumers, f"veil_padding_mask_{k}")
                     for k, where in enumerate(wheres.values())]
    else:
        new_nodes, wheres = [], {}
    if scales:
        divisor = "veil_attention_sqrt_head_size"
        graph.initializer.append(numpy_helper.from_array(np.array(np.sqrt(head_size), np.float32), divisor))
        for mul in scales:
            scores = next(i for i in mul.input if i not in constants)
            mul.op_type = "Div"
            mul.input[:] = [scores, divisor]
    nodes = [n for block in new_nodes for n in block] + list(graph.node)
    del graph.node[:]
    graph.node.extend(_live_nodes(graph, nodes))
    used = {i for n in graph.node for i in n.input}
    kept = [i for i in graph.initializer if i.name in used]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    onnx.checker.check_model(out)
    return out, {"padding_masks": len(wheres), "score_scales": len(scales)}


def _padding_mask(model: onnx.ModelProto, where: onnx.NodeProto, constants: dict[str, np.ndarray],
                  consumers: dict[str, list[onnx.NodeProto]], prefix: str) -> list[onnx.NodeProto]:
    """Nodes computing ``(1 - float(attention_mask[:, None, None, :])) * fill``, rewired into where's consumers."""
    keep, fill = constants.get(where.input[1]), constants.get(where.input[2])
    if keep is None or fill is None or keep.size != 1 or fill.size != 1 or keep.item() != 0 or not fill.item() < 0:
        raise ExportError(f"attention mask {where.name!r}: expected Where(condition, 0, negative fill) with constant "
                          f"branches, received {where.input[1]!r}={keep}, {where.input[2]!r}={fill}")
    if any(c.op_type != "Add" for c in consumers[where.output[0]]):
        raise ExportError(f"attention mask {where.name!r}: expected only Add consumers (scores + mask), received "
                          f"{sorted({c.op_type for c in consumers[where.output[0]]})}")
    _check_is_padding_mask(model, where.input[0])
    dtype = fill.dtype

    def constant(name: str, value: np.ndarray) -> onnx.NodeProto:
        return helper.make_node("Constant", [], [f"{prefix}_{name}"], value=numpy_helper.from_array(value))

    nodes = [
        constant("axis1", np.array([1], np.int64)), constant("axis2", np.array([2], np.int64)),
        constant("one", np.array(1, dtype)), constant("fill", np.array(fill.item(), dtype)),
        helper.make_node("Unsqueeze", [MASK_INPUT, f"{prefix}_axis1"], [f"{prefix}_b1t"]),
        helper.make_node("Unsqueeze", [f"{prefix}_b1t", f"{prefix}_axis2"], [f"{prefix}_b11t"]),
        helper.make_node("Cast", [f"{prefix}_b11t"], [f"{prefix}_float"], to=helper.np_dtype_to_tensor_dtype(dtype)),
        helper.make_node("Sub", [f"{prefix}_one", f"{prefix}_float"], [f"{prefix}_masked"]),
        helper.make_node("Mul", [f"{prefix}_masked", f"{prefix}_fill"], [f"{prefix}_bias"]),
    ]
    for consumer in consumers[where.output[0]]:
        consumer.input[:] = [f"{prefix}_bias" if i == where.output[0] else i for i in consumer.input]
    return nodes


def _live_nodes(graph: onnx.GraphProto, nodes: list[onnx.NodeProto]) -> list[onnx.NodeProto]:
    """``nodes`` that a graph output depends on, in topological order (new nodes first, then the original order)."""
    needed = {o.name for o in graph.output}
    live = []
    for node in reversed(nodes):
        if any(o in needed for o in node.output):
            live.append(node)
            needed.update(node.input)
    return list(reversed(live))
