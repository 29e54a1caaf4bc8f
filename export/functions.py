"""ONNX side of veil's layers: one ``veil``-domain node per layer, each backed by a model-local ONNX
function whose body uses standard ops only.

Any ONNX Runtime runs the model (it inlines the functions); the HE compiler recognises the layers by
(domain, op_type) and reads their attributes and constant inputs. ``TRANSLATIONS`` is the
``custom_translation_table`` for ``torch.onnx.export(dynamo=True)``; ``attach_functions`` adds the function
definitions to the exported model (the exporter cannot carry them itself: its opset conversion pass
fails on model-local functions with torch 2.13 / onnxscript 0.7).
"""

from __future__ import annotations

import onnx
import onnxscript
import torch
from onnx.defs import OpSchema
from onnxscript import opset20 as op
from onnxscript.values import Op, Opset

from . import ops  # noqa: F401  (registers torch.ops.veil.*)

DOMAIN = "veil"
DEFAULT_OPSET = 20  # the standard-op opset of the exported graphs and of the function bodies
VEIL = Opset(DOMAIN, 1)
_FLOATS = ["tensor(float)", "tensor(double)", "tensor(float16)"]


def _schema(name: str, inputs: list[str], attributes: dict[str, OpSchema.AttrType]) -> OpSchema:
    return OpSchema(name, DOMAIN, 1, inputs=[OpSchema.FormalParameter(i, "T") for i in inputs],
                    outputs=[OpSchema.FormalParameter("y", "T")], type_constraints=[("T", _FLOATS, "")],
                    attributes=[OpSchema.Attribute(a, t, a) for a, t in attributes.items()])


_F, _INTS = OpSchema.AttrType.FLOAT, OpSchema.AttrType.INTS
POLY_NORM = Op(VEIL, "PolyNorm", _schema("PolyNorm", ["x", "weight", "bias"],
                                         {"axes": _INTS, "a": _F, "b": _F, "c": _F, "mu": _F, "running_var": _F}))
POLY_ACT = Op(VEIL, "PolyAct", _schema("PolyAct", ["x", "coeffs"], {}))
LINEAR_ATTENTION = Op(VEIL, "LinearAttention", _schema("LinearAttention", ["q", "k", "v", "cos", "sin"], {}))


@onnxscript.script(VEIL, default_opset=op)
def PolyNorm(x, weight, bias, axes: list[int], a: float, b: float, c: float, mu: float, running_var: float):
    """(x - E[x]) * g(mu v) * sqrt(mu / Var_bar) * weight + bias; g(t) = a (t - b)^2 + c; v = Var[x] / Var_bar."""
    ax = op.Constant(value_ints=axes)
    centred = op.Sub(x, op.ReduceMean(x, ax, keepdims=1))
    rv = op.CastLike(op.Constant(value_float=running_var), x)
    scaled_var = op.Mul(op.CastLike(op.Constant(value_float=mu), x), op.Div(op.ReduceMean(op.Mul(centred, centred), ax, keepdims=1), rv))
    t = op.Sub(scaled_var, op.CastLike(op.Constant(value_float=b), x))
    g = op.Add(op.Mul(op.CastLike(op.Constant(value_float=a), x), op.Mul(t, t)), op.CastLike(op.Constant(value_float=c), x))
    gain = op.Sqrt(op.Div(op.CastLike(op.Constant(value_float=mu), x), rv))
    return op.Add(op.Mul(op.Mul(op.Mul(centred, g), gain), weight), bias)


@onnxscript.script(VEIL, default_opset=op)
def PolyAct(x, coeffs):
    """sum_i coeffs[i] x^i with coeffs (n + 1, 1, ...) broadcastable against (1, *x.shape)."""
    n = op.Shape(coeffs, start=0, end=1)  # (1,) = degree + 1
    exponents = op.CastLike(op.Range(op.Constant(value_int=0), op.Squeeze(n), op.Constant(value_int=1)), x)
    ones = op.ConstantOfShape(op.Shape(op.Shape(x)), value=onnx.helper.make_tensor("one", onnx.TensorProto.INT64, [1], [1]))
    powers = op.Pow(op.Unsqueeze(x, op.Constant(value_ints=[0])), op.Reshape(exponents, op.Concat(n, ones, axis=0)))
    return op.ReduceSum(op.Mul(powers, coeffs), op.Constant(value_ints=[0]), keepdims=0)


@onnxscript.script(VEIL, default_opset=op)
def LinearAttention(q, k, v, cos, sin):
    """RoPE(Q) (RoPE(K)^T V) / N for (B, H, N, hd) inputs; RoPE in the rotate-half convention."""
    q_lo, q_hi = op.Split(q, axis=-1, num_outputs=2)
    k_lo, k_hi = op.Split(k, axis=-1, num_outputs=2)
    rq = op.Add(op.Mul(q, cos), op.Mul(op.Concat(op.Neg(q_hi), q_lo, axis=-1), sin))
    rk = op.Add(op.Mul(k, cos), op.Mul(op.Concat(op.Neg(k_hi), k_lo, axis=-1), sin))
    kv = op.MatMul(op.Transpose(rk, perm=[0, 1, 3, 2]), v)  # (B, H, hd, hd)
    tokens = op.CastLike(op.Shape(k, start=2, end=3), q)
    return op.Div(op.MatMul(rq, kv), tokens)


FUNCTIONS = (PolyNorm, PolyAct, LinearAttention)


def _poly_norm(x, weight, bias, axes, a, b, c, mu, running_var):
    return POLY_NORM(x, weight, bias, axes=list(axes), a=a, b=b, c=c, mu=mu, running_var=running_var)


def _poly_act(x, coeffs):
    return POLY_ACT(x, coeffs)


def _linear_attention(q, k, v, cos, sin):
    return LINEAR_ATTENTION(q, k, v, cos, sin)


TRANSLATIONS = {
    torch.ops.veil.poly_norm.default: _poly_norm,
    torch.ops.veil.poly_act.default: _poly_act,
    torch.ops.veil.linear_attention.default: _linear_attention,
}


def attach_functions(model: onnx.ModelProto) -> onnx.ModelProto:
    """Add the definitions of the ``veil`` functions the graph uses, and the domain's opset import."""
    used = {n.op_type for n in model.graph.node if n.domain == DOMAIN}
    have = {f.name for f in model.functions if f.domain == DOMAIN}
    for fn in FUNCTIONS:
        proto = fn.to_function_proto()
        if proto.name in used and proto.name not in have:
            model.functions.append(proto)
    if used and not any(o.domain == DOMAIN for o in model.opset_import):
        model.opset_import.append(onnx.helper.make_opsetid(DOMAIN, 1))
    return model
