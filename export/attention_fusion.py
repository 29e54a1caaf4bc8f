"""Rewrite transformers-5 BERT attention, as torch.onnx (dynamo) exports it, into the form ORT's fusions match.

Why: ``onnxruntime.transformers.optimizer`` (model_type="bert") fuses self-attention into ``com.microsoft``
``Attention`` only when the scores before Softmax come from subgraphs it knows, and the dynamo graph of
all-MiniLM-L6-v2 differs in two places (ORT 1.32, fusion_attention.py):

* the mask. transformers 5 builds it with ``sdpa_mask`` (vmapped index functions), which the exporter
  (optimize=True) lowers to ``Where(And(And(True, kv_idx >= 0), GatherND(Cast(attention_mask, bool), idx)),
  0, finfo.min)``; ORT's transformers-5 pattern wants ``Where <- Expand <- And <- Reshape <- Reshape <- Gather
  <- Flatten``, so every layer stops at "failed to match mask path".
* the scale. The exporter emits ``Mul(Q @ K^T, 1/sqrt(d))``. ORT's "Mul" score path and its classic mask path
  ``Mul(Sub(1, Cast(Unsqueeze(Unsqueeze(mask)))), fill)`` both take the *first* Mul parent of the Add, so with
  a Mul scale the mask match finds the scale ("Expect Sub, Got MatMul"). With ``Div(Q @ K^T, sqrt(d))``, the
  form of transformers-4 BERT, both match. ORT's fused op never reads that constant (it assumes 1/sqrt(d)), so
  only that scale is rewritten.

So a graph pass, not another export (the encoder's eager attention is what the training side loads) nor a
hand-written fusion (ORT packs the QKV weights and builds the mask input itself). The old mask is replaced only
after it is evaluated on a probe batch (right, left and inner padding) and equals ``attention_mask[:, None,
None, :]``, so a causal or otherwise different mask stays as it is (with a warning) and that block stays unfused.
"""

from __future__ import annotations

import warnings

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .validate import cpu_session

MASK_INPUT = "attention_mask"


def _constants(graph: onnx.GraphProto) -> dict[str, np.ndarray]:
    """Values of the initializers and Constant-node outputs of ``graph``, by name."""
    values = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            values[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
    return values


def _padding_condition_mismatch(model: onnx.ModelProto, condition: str) -> str | None:
    """Why ``condition`` is not ``attention_mask[:, None, None, :]`` (broadcast) on a probe batch; None if it is.

    The probe is 4 x 6 tokens with right, left and inner padding in the mask and zeros in the other inputs.
    """
    mask = np.array([[1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0], [0, 0, 1, 1, 1, 1], [1, 0, 1, 0, 0, 1]], dtype=np.int64)
    others = [i for i in model.graph.input if i.name != MASK_INPUT and i.type.tensor_type.elem_type != onnx.TensorProto.INT64]
    if others:
        return f"expected INT64 token inputs to probe the mask, received non-INT64 input {others[0].name!r}"
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    del probe.graph.output[:]
    probe.graph.output.append(onnx.ValueInfoProto(name=condition))
    feeds = {i.name: mask if i.name == MASK_INPUT else np.zeros_like(mask) for i in model.graph.input}
    got = cpu_session(probe).run([condition], feeds)[0]
    expected = mask[:, None, None, :].astype(bool)
    if got.ndim != 4 or got.shape[0] != expected.shape[0] or got.shape[1] != 1 or got.shape[3] != expected.shape[3] \
            or not np.array_equal(got, np.broadcast_to(expected, got.shape)):
        return (f"expected condition {condition!r} to equal attention_mask[:, None, None, :] (a padding mask) on the "
                f"probe batch, received shape {list(got.shape)} with other values")
    return None


def canonicalize_bert_attention(model: onnx.ModelProto, head_size: int) -> tuple[onnx.ModelProto, dict[str, int]]:
    """A copy of ``model`` in the BERT form ORT's attention fusion matches; and how many of each rewrite were made.

    Each ``Softmax(Add(Mul(Q @ K^T, 1 / sqrt(head_size)), Where(condition, 0, fill)))`` gets
    ``Div(Q @ K^T, sqrt(head_size))`` (only for that scale, the one ORT's fused Attention assumes) and, with
    ``condition`` checked to be the broadcast ``attention_mask``, the mask
    ``Mul(Sub(1, Cast(Unsqueeze(Unsqueeze(attention_mask)))), fill)``. Mask nodes left unused are dropped. Both
    rewrites keep the graph's values; a graph without these blocks comes back unchanged (counts 0), and a Where
    that is not such a padding mask is kept, with a warning saying why.
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
    new_nodes = []
    if MASK_INPUT in {i.name for i in graph.input}:
        for index, where in enumerate(list(wheres.values())):
            reason = _padding_mask_mismatch(model, where, constants, consumers)
            if reason is None:
                new_nodes += _padding_mask(where, constants[where.input[2]], consumers, f"veil_padding_mask_{index}")
            else:
                warnings.warn(f"attention mask {where.name!r} kept (attention stays unfused): {reason}", stacklevel=2)
                del wheres[where.output[0]]
    else:
        wheres = {}
    if scales:
        divisor = "veil_attention_sqrt_head_size"
        graph.initializer.append(numpy_helper.from_array(np.array(np.sqrt(head_size), np.float32), divisor))
        for mul in scales:
            scores = next(i for i in mul.input if i not in constants)
            mul.op_type = "Div"
            mul.input[:] = [scores, divisor]
    nodes = new_nodes + list(graph.node)
    del graph.node[:]
    graph.node.extend(_live_nodes(graph, nodes))
    used = {i for n in graph.node for i in n.input}
    kept = [i for i in graph.initializer if i.name in used]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    onnx.checker.check_model(out)
    return out, {"padding_masks": len(wheres), "score_scales": len(scales)}


def _padding_mask_mismatch(model: onnx.ModelProto, where: onnx.NodeProto, constants: dict[str, np.ndarray],
                           consumers: dict[str, list[onnx.NodeProto]]) -> str | None:
    """Why ``where`` is not ``Where(padding condition, 0, negative fill)`` added to scores; None if it is."""
    keep, fill = constants.get(where.input[1]), constants.get(where.input[2])
    if keep is None or fill is None or keep.size != 1 or fill.size != 1 or keep.item() != 0 or not fill.item() < 0:
        return (f"expected Where(condition, 0, negative fill) with constant branches, received "
                f"{where.input[1]!r}={keep}, {where.input[2]!r}={fill}")
    if any(c.op_type != "Add" for c in consumers[where.output[0]]):
        return f"expected only Add consumers (scores + mask), received {sorted({c.op_type for c in consumers[where.output[0]]})}"
    return _padding_condition_mismatch(model, where.input[0])


def _padding_mask(where: onnx.NodeProto, fill: np.ndarray, consumers: dict[str, list[onnx.NodeProto]],
                  prefix: str) -> list[onnx.NodeProto]:
    """Nodes computing ``(1 - float(attention_mask[:, None, None, :])) * fill``, rewired into where's consumers."""
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
