"""ONNX graph (as ``veil.export`` writes it) -> HE :class:`~veil.he.plan.Plan`.

Every node with one ciphertext-dependent input and constant other inputs, from an allow-list of affine
ops (Gemm, MatMul, Conv, AveragePool, Flatten, Reshape, ...), is turned into its per-sample matrix
by running it with ``onnx.reference`` on the identity basis (and checked to be affine on a random input),
then folded into the pending affine map (see :mod:`veil.he.lowering`). ``veil.PolyNorm`` and
``veil.PolyAct`` are lowered to plan ops; anything else is refused with the node's name and a hint.
Latency plans are then laid out in slots (:mod:`veil.he.layout`): each linear op becomes masked
rotations over the non-zero entries only, so a convolution costs about k^2 + C rotations, not a dense
layer's, and several images share a ciphertext.

Example:
    >>> plan = compile("model.onnx", mode="latency", rotation_keys="pow2")
    >>> plan.levels, plan.galois_steps[:4], plan.spec["rotations"]
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import scipy.sparse as sp
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator
from veil.he.attention import lower_linear_attention
from veil.he.errors import CompileError, ParameterError  # CompileError: still importable from here
from veil.he.latency import pack_latency
from veil.he.layout import MAX_SLOTS
from veil.he.lowering import Affine, Builder, identity, sparse
from veil.he.packing import key_manifest, parse_key_mode, rotation_counts, rotation_uses
from veil.he.plan import FORMAT, REPLICATED_FORMAT, Mode, Plan
from veil.he.stem import conv_taps, im2col_gather, stem_conv, stem_may_grow, stem_patches

AFFINE_OPS = {"Gemm", "MatMul", "Conv", "AveragePool", "GlobalAveragePool", "Flatten", "Reshape", "Transpose",
              "Squeeze", "Unsqueeze", "Identity", "Add", "Sub", "Mul", "Div", "Neg", "Pad", "ReduceMean",
              "ReduceSum", "BatchNormalization", "Dropout", "Slice", "Gather"}
HINTS = {
    "Relu": "use PolyAct (train with `veil train uldnet`)", "Gelu": "use PolyAct", "Sigmoid": "use PolyAct",
    "Tanh": "use PolyAct", "Elu": "use PolyAct", "LeakyRelu": "use PolyAct",
    "MaxPool": "MaxPool -> AveragePool", "GlobalMaxPool": "GlobalMaxPool -> GlobalAveragePool",
    "Softmax": "use veil.LinearAttention or drop the softmax (argmax is unchanged)",
    "LayerNormalization": "use PolyNorm (train with `veil train uldnet`)", "Sqrt": "use PolyNorm",
    "Div": "division by a ciphertext is not polynomial; use PolyNorm",
}


def compile(onnx_model: onnx.ModelProto | str | Path, mode: Mode = "latency", precision_bits: int = 20,
            rotation_keys: str = "exact", input_im2col: bool = True, replicate: bool = False) -> Plan:
    """Compile a polynomial ONNX model into an HE plan for ``mode`` ("latency" or "throughput").

    Args:
        onnx_model: the exported model, or a path to it; one input (B, *shape) and one output (B, *shape).
        mode: "latency" (each image in its own block of slots, ``plan.spec["batch_capacity"]`` images per
            ciphertext, masked-diagonal BSGS products) or "throughput" (one ciphertext per feature, up to
            N/2 samples per call, no rotations).
        precision_bits: fractional bits wanted after a multiply; passed to ``select_parameters``.
        rotation_keys: the key manifest of a latency plan: "exact" (one Galois key per rotation step: the
            fastest), "pow2" (signed powers of two only, each rotation in non-adjacent form), "binary"
            (positive powers of two only: the fewest keys, at most log2(N/2)) or "budget:K" (exact keys
            for the K most used steps, signed powers of two for the rest).
        input_im2col: latency mode, when the input feeds one Conv only: the client encrypts the conv's
            im2col patches (the plan's ``inputs[0]["gather"]``: an input index or -1 per encrypted feature,
            as TenSEAL's ``enc_matmul_encoding`` does) so the first conv is a 1x1 channel mix on ciphertexts:
            a few rotations instead of one per tap and stride offset (a stride-2 stem's 829 masks -> ~60).
        replicate: latency: one sample per ciphertext, its block tiled over every slot by the client, so
            steps count modulo the period ("binary": log2(period) keys, not log2(N/2)); no batching. With one
            image a request, a stem's im2col patches may take a larger block than the stem's own (a batching plan
            refuses that: fewer images per ciphertext): the plan with the lower he/cost.py objective (predicted
            seconds, the keys' one-time cost spread over requests) is kept, and under "binary" keys only if it needs
            no more keys (TenSEAL's 28x28 tutorial net, "exact": 52 -> 43 rotations, 0.456 -> 0.350 s an image,
            docs/results.md § he_cnn).

    Raises:
        CompileError: an op that is not polynomial or not supported, named with a hint.
        ParameterError: the plan needs more levels than any 128-bit parameter set offers.
    """
    if mode not in ("latency", "throughput"):
        raise CompileError(f"compile: `mode` expected 'latency' or 'throughput', received {mode!r}")
    if replicate and mode != "latency":
        raise CompileError(f"compile: `replicate` expected only with mode 'latency', received mode {mode!r}")
    try:
        parse_key_mode(rotation_keys)
    except ValueError as exc:
        raise CompileError(f"compile: {exc}") from None
    model = onnx_model if isinstance(onnx_model, onnx.ModelProto) else onnx.load(str(onnx_model))
    plan = _compile(model, mode, precision_bits, rotation_keys, input_im2col, replicate, grow_stem=False)
    if replicate and input_im2col and "gather" not in plan.spec["inputs"][0] \
            and stem_may_grow(model.graph, _sample_shape(model.graph)):
        from veil.he.cost import objective, plan_cost

        grown = _compile(model, mode, precision_bits, rotation_keys, input_im2col, replicate, grow_stem=True)
        fewest = rotation_keys == "binary" and len(grown.galois_steps) > len(plan.galois_steps)  # asked: fewest keys
        if not fewest and objective([plan_cost(grown)]) < objective([plan_cost(plan)]):  # seconds, keys spread
            return grown
    return plan


def _compile(model: onnx.ModelProto, mode: Mode, precision_bits: int, rotation_keys: str, input_im2col: bool,
             replicate: bool, grow_stem: bool) -> Plan:
    """:func:`compile` of a loaded model; ``grow_stem``: the stem's patches may take any block up to the largest
    ring's slots (:func:`_lower_gathered_conv`)."""
    graph = model.graph
    source, shape = graph.input[0], _sample_shape(graph)
    builder = Builder()
    features = int(np.prod(shape))
    tensors: dict[str, Any] = {source.name: Affine({builder.input(features, shape): identity(features)},
                                                   np.zeros(features), shape)}
    consts = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    opsets = list(model.opset_import)
    gather: list[int] | None = None
    stem = stem_conv(graph, source.name) if mode == "latency" and input_im2col else None
    for node in graph.node:
        if node is stem:
            gather = _lower_gathered_conv(node, tensors, consts, builder, opsets, grow_stem)
            if gather is not None:
                continue
        _lower(node, tensors, consts, builder, opsets)
    result = tensors.get(graph.output[0].name)
    if not isinstance(result, Affine):
        raise CompileError(f"compile: output {graph.output[0].name!r} does not depend on the input")
    out = builder.materialize(result, "output")
    digest = hashlib.sha256(model.SerializeToString(deterministic=True)).hexdigest()
    return finish(builder, {"name": source.name, "value": "v0", "shape": list(shape),
                            **({"gather": gather} if gather is not None else {})},
                  {"name": graph.output[0].name, "value": out, "shape": list(result.shape)}, mode,
                  precision_bits, rotation_keys, digest, replicate)


def _sample_shape(graph: onnx.GraphProto) -> tuple[int, ...]:
    """The static per-sample dims of the one graph input (one input and one output, or a CompileError)."""
    if len(graph.input) != 1 or len(graph.output) != 1:
        raise CompileError(f"compile: expected one graph input and one output, received "
                           f"{[i.name for i in graph.input]} -> {[o.name for o in graph.output]}")
    dims = graph.input[0].type.tensor_type.shape.dim
    shape = tuple(d.dim_value for d in dims[1:])
    if not shape or min(shape) < 1:
        raise CompileError(f"compile: input {graph.input[0].name!r} expected static per-sample dims (B, ...), "
                           f"received {[d.dim_param or d.dim_value for d in dims]}")
    return shape


def finish(builder: Builder, source: dict[str, Any], target: dict[str, Any], mode: Mode, precision_bits: int = 20,
           rotation_keys: str = "exact", onnx_sha256: str = "", replicate: bool = False) -> Plan:
    """The plan of a lowered program: layout (latency), parameters, key manifest and rotation counts.

    ``source`` / ``target``: {name, value, shape} of the plan's input and output; ``replicate`` as :func:`compile`.
    """
    from veil.he.params import select_parameters

    levels = max(v["level"] for v in builder.values.values())
    packed = pack_latency(builder, source["value"], replicate) if mode == "latency" else \
        {"ops": builder.ops, "values": builder.values, "period": 0, "window": 0,  # dense (out, in) weights
         "tensors": {k: v.toarray() if sp.issparse(v) else v for k, v in builder.tensors.items()}}
    try:
        params = select_parameters(levels, precision_bits=precision_bits, min_slots=packed["period"])
    except ParameterError as exc:
        raise ParameterError(f"compile: the plan needs {levels} levels ({_level_summary(builder)}); "
                             f"no 128-bit parameter set offers them: {exc}") from exc
    values = packed["values"]
    ends = [{**end, "features": values[end["value"]]["features"],
             **({"positions": values[end["value"]].get("positions", [0])} if mode == "latency" else {})}
            for end in (source, target)]
    spec = {
        "format": REPLICATED_FORMAT if replicate else FORMAT, "mode": mode, "levels": levels,
        "period": packed["period"], "window": packed["window"],
        "batch_capacity": (1 if replicate else params.slots // packed["period"]) if mode == "latency" else params.slots,
        "precision_bits": precision_bits, "inputs": [ends[0]], "outputs": [ends[1]], "values": values,
        "ops": packed["ops"], "parameters": params.to_dict(), "onnx_sha256": onnx_sha256,
        "rotation_keys": rotation_keys if mode == "latency" else "none",
        **({"replicated": True} if replicate else {}),
    }
    plan = Plan({**spec, "galois_steps": []}, packed["tensors"])
    return _with_keys(plan, rotation_keys) if mode == "latency" else \
        Plan({**plan.spec, "rotations": {"rotations": 0, "key_switches": 0}}, plan.tensors)


def with_key_manifest(plan: Plan, rotation_keys: str) -> Plan:
    """The same latency plan under another key manifest: layout, weights and levels do not depend on it, only
    which Galois keys exist and how many key switches each rotation takes (throughput plans have none)."""
    if plan.mode != "latency" or plan.spec["rotation_keys"] == rotation_keys:
        return plan
    return _with_keys(plan, rotation_keys)


def _with_keys(plan: Plan, rotation_keys: str) -> Plan:
    """``plan`` with the key manifest and rotation counts of ``rotation_keys`` (steps modulo its key modulus)."""
    period, modulus = plan.spec["period"], plan.key_modulus
    steps = key_manifest(rotation_uses(plan.ops, period), rotation_keys, modulus)
    spec = {**plan.spec, "rotation_keys": rotation_keys, "galois_steps": steps,
            "rotations": rotation_counts(plan.ops, period, steps, modulus)}
    return Plan(spec, plan.tensors)


def _level_summary(builder: Builder) -> str:
    per_node: dict[str, int] = {}
    for op in builder.ops:
        per_node[op["node"]] = max(per_node.get(op["node"], 0), op["level"])
    return ", ".join(f"{k} -> {v}" for k, v in per_node.items())


def _lower(node: onnx.NodeProto, tensors: dict[str, Any], consts: dict[str, np.ndarray], builder: Builder,
           opsets: list[onnx.OperatorSetIdProto]) -> None:
    """Fold one node into ``tensors`` (name -> Affine for ciphertext-dependent tensors, arrays in ``consts``)."""
    name = node.name or node.output[0]
    dynamic = [i for i in node.input if i in tensors]
    if not dynamic:  # constant folding (Constant, Shape arithmetic on initializers, ...)
        outs = _run(node, {i: consts[i] for i in node.input if i}, opsets)
        consts.update(zip(node.output, outs, strict=True))
        return
    if node.domain == "veil":
        tensors[node.output[0]] = _lower_veil(node, name, tensors, consts, builder)
        return
    if node.op_type in ("Mul", "Pow") and _is_product(node, tensors, consts):
        a, b = (tensors[node.input[0]], tensors[node.input[0]] if node.op_type == "Pow" else tensors[node.input[1]])
        va = builder.materialize(a, name)
        vb = va if b is a else builder.materialize(b, name)  # x * x: one linear op, then a square
        value = builder.mul(va, vb, name)
        tensors[node.output[0]] = Affine({value: identity(a.features)}, np.zeros(a.features), a.shape)
        return
    if node.op_type in ("Add", "Sub") and len(dynamic) == 2:
        a, b = tensors[node.input[0]], tensors[node.input[1]]
        try:
            shape = tuple(np.broadcast_shapes(a.shape, b.shape))
        except ValueError:
            raise CompileError(f"node {name!r} ({node.op_type}): expected broadcastable shapes, received {a.shape} "
                               f"and {b.shape}") from None
        sign = -1.0 if node.op_type == "Sub" else 1.0
        tensors[node.output[0]] = _broadcast(a, shape, 1.0).plus(_broadcast(b, shape, sign))
        return
    if node.op_type not in AFFINE_OPS or len(dynamic) != 1 or (node.op_type == "Div" and node.input[1] in tensors):
        hint = HINTS.get(node.op_type, "only polynomial ops (affine maps, products, veil.PolyNorm, veil.PolyAct)")
        raise CompileError(f"node {name!r} ({node.domain + '.' if node.domain else ''}{node.op_type}) is not "
                           f"supported in encrypted inference: {hint}. Train with `veil train uldnet`.")
    tensors[node.output[0]] = _affine_node(node, name, tensors[dynamic[0]], dynamic[0], consts, opsets)


def _lower_gathered_conv(node: onnx.NodeProto, tensors: dict[str, Any], consts: dict[str, np.ndarray],
                         builder: Builder, opsets: list[onnx.OperatorSetIdProto], grow: bool = False
                         ) -> list[int] | None:
    """Lower the stem Conv on im2col patches the client encrypts (the input value v0 becomes the patches);
    None (nothing changed) for a conv :func:`~veil.he.stem.stem_patches` does not cover or whose patches would need
    a larger block than its input and output (a stride-1 conv: kh * kw times the input), unless ``grow`` (one image
    a request: the block may grow up to the largest ring's slots)."""
    x = tensors[node.input[0]]
    patched = stem_patches(node, x.shape, consts)
    if patched is None:
        return None
    index, patch_shape, weight, block, own = patched
    if block > (MAX_SLOTS if grow else own):  # patches would grow the conv's block: fewer images per ciphertext
        return None
    positions = int(np.prod(patch_shape[1:]))
    conv = _affine_node(node, node.name or node.output[0], x, node.input[0], consts, opsets)
    (value, dense), = conv.terms.items()
    rows, entry, taps = conv_taps(weight, index, positions)
    patches = sparse(sp.csr_array((taps, (rows, entry)), shape=(dense.shape[0], len(index))))
    valid = np.flatnonzero(index >= 0)
    select = sp.csr_array((np.ones(len(valid)), (valid, index[valid])), shape=(len(index), x.features))
    error = abs(patches @ select - dense)
    if error.nnz and error.max() > 1e-9 * max(abs(dense).max(), 1e-300):
        return None  # the conv's matrix is not tap-local in this order: keep the plain lowering
    builder.values[value].update(features=len(index), shape=list(patch_shape))
    tensors[node.output[0]] = Affine({value: patches}, conv.bias, conv.shape)
    return index.tolist()


def _broadcast(x: Affine, shape: tuple[int, ...], gain: float) -> Affine:
    """``gain * x`` broadcast (numpy rules) to ``shape``: a (y - mean(y)) reads the mean for every feature."""
    if x.shape == shape and gain == 1.0:
        return x
    source = np.broadcast_to(np.arange(x.features).reshape(x.shape), shape).reshape(-1)
    matrix = sp.csr_array((np.full(len(source), gain), (np.arange(len(source)), source)),
                          shape=(len(source), x.features))
    return x.then(matrix, np.zeros(len(source)), shape)


def _is_product(node: onnx.NodeProto, tensors: dict[str, Any], consts: dict[str, np.ndarray]) -> bool:
    if node.op_type == "Mul":
        return node.input[0] in tensors and node.input[1] in tensors
    exponent = consts.get(node.input[1])
    if exponent is None or exponent.size != 1 or float(exponent) != 2.0:
        raise CompileError(f"node {node.name!r} (Pow): only a constant exponent 2 is polynomial here, "
                           f"received {exponent}")
    return True


def _lower_veil(node: onnx.NodeProto, name: str, tensors: dict[str, Any], consts: dict[str, np.ndarray],
                builder: Builder) -> Any:
    if node.op_type == "LinearAttention" and all(i in tensors for i in node.input[:3]) \
            and not any(i in tensors for i in node.input[3:]):
        q, k, v = (tensors[i] for i in node.input[:3])
        return lower_linear_attention(builder, q, k, v, consts[node.input[3]], consts[node.input[4]], name)
    x = tensors[node.input[0]]
    if any(i in tensors for i in node.input[1:]) or node.op_type not in ("PolyNorm", "PolyAct"):
        hint = HINTS.get(node.op_type, "unknown veil function")
        raise CompileError(f"node {name!r} (veil.{node.op_type}) is not supported in encrypted inference: {hint}")
    sample = (1, *x.shape)
    if node.op_type == "PolyAct":
        coeffs = consts[node.input[1]]  # (n + 1, 1, ...broadcast)
        per_feature = np.stack([np.broadcast_to(c, sample).reshape(-1) for c in coeffs]).astype(np.float64)
        return builder.polyact(x, per_feature, name)
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    axes = sorted(int(a) % len(sample) for a in attrs["axes"])
    if axes != list(range(1, len(sample))):
        raise CompileError(f"node {name!r} (veil.PolyNorm): statistics over axes {attrs['axes']} of a "
                           f"(B, {', '.join(map(str, x.shape))}) tensor; the HE compiler supports per-sample "
                           f"statistics over every non-batch axis only")
    weight, bias = (np.broadcast_to(consts[i], sample).reshape(-1).astype(np.float64) for i in node.input[1:3])
    return builder.polynorm(x, weight, bias, attrs, name)


PROBE_BYTES = 1 << 28  # the identity basis is pushed through a node in chunks of at most this many output bytes
ELEMENTWISE_OPS = {"Add", "Sub", "Mul", "Div", "Neg", "Identity", "Dropout", "BatchNormalization"}


def _elementwise_matrix(node: onnx.NodeProto, x: Affine, x_name: str, feeds: dict[str, np.ndarray], zero: np.ndarray,
                        opsets: list[onnx.OperatorSetIdProto]) -> tuple[sp.csr_array, np.ndarray] | None:
    """``diag(f(1) - f(0))`` and ``f(0)`` for an elementwise node keeping its input's shape (x * c, an inference
    BatchNormalization...): one more run, not the identity basis (2 GiB through 16384 features); else None."""
    if node.op_type not in ELEMENTWISE_OPS or zero.shape != (1, *x.shape):
        return None
    slope = (_run(node, {**feeds, x_name: np.ones((1, *x.shape))}, opsets)[0] - zero).reshape(-1)
    keep = np.flatnonzero(slope)
    return sp.csr_array((slope[keep], (keep, keep)), shape=(slope.size, slope.size)), zero.reshape(-1)


def _affine_node(node: onnx.NodeProto, name: str, x: Affine, x_name: str, consts: dict[str, np.ndarray],
                 opsets: list[onnx.OperatorSetIdProto]) -> Affine:
    """The node as ``z -> A z + b`` on flattened samples (A sparse), composed after ``x``.

    A 2-D Conv's matrix is built from its weights (:func:`_conv_matrix`), an elementwise node's from one more run
    (:func:`_elementwise_matrix`); any other node is run on the identity basis in chunks (memory bounded by
    :data:`PROBE_BYTES`). Either way the node is then run on a random input and must match: that is the check
    that it is affine and that the matrix is right."""
    n = x.features
    feeds = {i: consts[i].astype(np.float64) if consts[i].dtype == np.float32 else consts[i]
             for i in node.input if i and i != x_name}
    probe = np.random.default_rng(0).normal(size=(1, *x.shape))
    try:
        zero = _run(node, {**feeds, x_name: np.zeros((1, *x.shape))}, opsets)[0]
        check = _run(node, {**feeds, x_name: probe}, opsets)[0]
        built = _conv_matrix(node, x.shape, consts) or _elementwise_matrix(node, x, x_name, feeds, zero, opsets)
        if built is not None:
            matrix, bias = built
        else:
            bias = zero.reshape(-1)
            chunk = max(1, min(n, PROBE_BYTES // (8 * max(bias.size, n))))
            rows, cols, vals = [], [], []
            for start in range(0, n, chunk):
                stop = min(n, start + chunk)
                basis = np.zeros((stop - start, n))
                basis[np.arange(stop - start), np.arange(start, stop)] = 1.0
                out = _run(node, {**feeds, x_name: basis.reshape(-1, *x.shape)}, opsets)[0]
                out = out.reshape(stop - start, -1) - bias
                j, i = np.nonzero(out)
                rows.append(i)
                cols.append(j + start)
                vals.append(out[j, i])
            matrix = sp.csr_array((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))),
                                  shape=(bias.size, n))
    except Exception as exc:  # the reference evaluator's errors are generic; name the node
        raise CompileError(f"node {name!r} ({node.op_type}): could not be evaluated per sample "
                           f"(is the batch dimension dynamic?): {exc}") from exc
    if not np.allclose(check.reshape(-1), matrix @ probe.reshape(-1) + bias, rtol=1e-6, atol=1e-8):
        raise CompileError(f"node {name!r} ({node.op_type}) is not affine in its input; "
                           "only polynomial ops are supported in encrypted inference")
    return x.then(matrix, bias, tuple(zero.shape[1:]))


def _conv_matrix(node: onnx.NodeProto, shape: tuple[int, ...], consts: dict[str, np.ndarray]
                 ) -> tuple[sp.csr_array, np.ndarray] | None:
    """(matrix, bias) of a 2-D, ungrouped Conv with constant weights on a (C, H, W) sample, from its weights
    and :func:`~veil.he.stem.im2col_gather`; None for any other node (it is probed instead)."""
    if node.op_type != "Conv" or node.domain or len(shape) != 3 or len(node.input) < 2 \
            or node.input[1] not in consts:
        return None
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    weight = consts[node.input[1]]
    if weight.ndim != 4 or weight.shape[1] != shape[0] or attrs.get("group", 1) != 1 \
            or attrs.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
        return None
    index, patch_shape = im2col_gather(shape, tuple(weight.shape[2:]), tuple(attrs.get("strides", (1, 1))),
                                       tuple(attrs.get("pads", (0, 0, 0, 0))), tuple(attrs.get("dilations", (1, 1))))
    out_channels, positions = weight.shape[0], int(np.prod(patch_shape[1:]))
    rows, entry, taps = conv_taps(weight, index, positions)
    matrix = sp.csr_array((taps, (rows, index[entry])), shape=(out_channels * positions, int(np.prod(shape))))
    bias = consts[node.input[2]].astype(np.float64) if len(node.input) > 2 and node.input[2] else \
        np.zeros(out_channels)
    return matrix, np.repeat(bias, positions)


def _run(node: onnx.NodeProto, feeds: dict[str, np.ndarray], opsets: list[onnx.OperatorSetIdProto]) -> list[np.ndarray]:
    """Evaluate one standard node with the pure-numpy ONNX reference evaluator."""
    inputs = [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), None) for k, v in feeds.items()]
    outputs = [helper.make_tensor_value_info(o, onnx.TensorProto.UNDEFINED, None) for o in node.output]
    model = helper.make_model(helper.make_graph([node], "node", inputs, outputs),
                              opset_imports=[o for o in opsets if o.domain in ("", "ai.onnx")])
    return ReferenceEvaluator(model).run(None, feeds)
