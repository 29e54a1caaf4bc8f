"""The compiler's lowering keeps affine maps sparse, so CIFAR-size convs compile in bounded memory (issue 35.5)."""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from onnx import numpy_helper
from torch import nn
from veil.export import export_graph
from veil.he.compiler import compile
from veil.he.layout import MAX_SLOTS
from veil.he.lowering import Affine, Builder, identity

compile_module = importlib.import_module("veil.he.compiler")  # the module (veil.he.compile is the function)
_SPEC = importlib.util.spec_from_file_location("he_test_conv", Path(__file__).with_name("test_conv.py"))
_CONV = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(_CONV)


def _conv_graph(conv: nn.Conv2d, shape: tuple[int, ...]):
    torch.manual_seed(0)
    return export_graph(nn.Sequential(conv).eval(), (torch.randn(2, *shape),), ["x"], ["y"], {"x": {0: "batch"}}).model


@pytest.mark.parametrize("conv", [nn.Conv2d(3, 5, 3, padding=1), nn.Conv2d(4, 6, 3, stride=2, padding=1),
                                  nn.Conv2d(2, 3, (3, 1), padding=(1, 0), dilation=(2, 1), bias=False),
                                  nn.Conv2d(4, 4, 3, padding=1, groups=2)])
def test_conv_matrix_from_weights_equals_the_probed_matrix(conv, monkeypatch) -> None:
    # the weight-built matrix (ungrouped 2-D convs) and the chunked identity-basis probe (everything else, and a
    # grouped conv) give the same sparse matrix; the probe in chunks of 3 basis vectors equals one chunk
    shape = (conv.in_channels, 9, 7)
    model = _conv_graph(conv, shape)
    node = model.graph.node[0]
    consts = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    n = int(np.prod(shape))

    def lowered() -> Affine:
        builder = Builder()
        x = Affine({builder.input(n, shape): identity(n)}, np.zeros(n), shape)
        return compile_module._affine_node(node, "conv", x, "x", dict(consts), list(model.opset_import))

    built = lowered()
    monkeypatch.setattr(compile_module, "_conv_matrix", lambda *a: None)
    probed = lowered()
    monkeypatch.setattr(compile_module, "PROBE_BYTES", 8 * 3 * max(n, built.features))
    chunked = lowered()
    (a,), (b,), (c,) = (e.terms.values() for e in (built, probed, chunked))
    assert isinstance(a, sp.csr_array) and a.nnz <= conv.out_channels * conv.in_channels // conv.groups * 9 * 63
    for other in (b, c):
        assert abs(a - other).max() <= 1e-12 * abs(a).max()
    np.testing.assert_allclose(built.bias, probed.bias, atol=1e-12)
    assert built.shape == probed.shape == tuple(conv(torch.zeros(1, *shape)).shape[1:])


def test_a_cifar_size_stride_2_block_fits_the_largest_ring() -> None:
    # 8 channels at 32 x 32 -> a stride-2 conv to 16 channels, each conv PolyNorm-ed (a sum of squares: the
    # plan needs a broadcast window of one block). The strided conv's in-place layout spreads 16 x 16 x 16 over
    # a 16384-slot block, which the window doubles past any 128-bit ring: the compact layout must be chosen
    # (before: "needs >= 32768 slots"); the matrices stay sparse (a dense one is 512 MB here)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), _CONV.norm(8), _CONV.act(8),
                          nn.Conv2d(8, 16, 3, stride=2, padding=1), _CONV.norm(16), _CONV.act(16)).eval()
    x = torch.randn(2, 8, 32, 32)
    graph = export_graph(model, (x,), ["x"], ["y"], {"x": {0: "batch"}}).model
    plan = compile(graph)
    assert plan.spec["period"] <= MAX_SLOTS
    assert plan.parameters().slots >= plan.spec["period"]
    simulated = _CONV.simulate(plan, x.numpy().astype(np.float64))
    expected = model(x).detach().numpy().reshape(2, -1)
    np.testing.assert_allclose(simulated.reshape(2, -1), expected, rtol=1e-4, atol=1e-4 * np.abs(expected).max())


def _node_graph(op: str, shape: tuple[int, ...], consts: dict[str, np.ndarray], swap: bool = False):
    """One ``op`` node reading x (B, *shape) and constant inputs, as an ONNX model with its initializers."""
    import onnx
    from onnx import helper

    names = ["x", *consts] if not swap else [*consts, "x"]
    node = helper.make_node(op, names, ["y"], **({"epsilon": 1e-5} if op == "BatchNormalization" else {}))
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [None, *shape])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(v, k) for k, v in consts.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


_RNG = np.random.default_rng(3)
_C = (_RNG.normal(size=(3, 1, 1)) + 2.0).astype(np.float32)


@pytest.mark.parametrize(("op", "consts", "swap", "diagonal"), [
    ("Mul", {"c": _C}, False, True), ("Add", {"c": _C}, True, True), ("Sub", {"c": _C}, True, True),
    ("Div", {"c": _C}, False, True), ("Neg", {}, False, True),
    ("Mul", {"c": np.array([0.0, 1.5, -2.0], np.float32).reshape(3, 1, 1)}, False, True),  # zeros dropped
    ("BatchNormalization", {"s": _C.ravel(), "b": -_C.ravel(), "m": _C.ravel() / 3, "v": _C.ravel() ** 2}, False, True),
    ("Add", {"c": _RNG.normal(size=(3, 4, 5)).astype(np.float32)}, False, False),  # x (3, 1, 5) grows: not diagonal
])
def test_an_elementwise_node_is_read_off_one_more_run(op, consts, swap, diagonal, monkeypatch) -> None:
    # a shape-keeping elementwise node's matrix is diag(f(1) - f(0)) from one more run; before, the identity basis
    # went through it in chunks (2 GiB and ~a minute per PolyNorm prenorm of a ResNet-20 stage-1 block, each time
    # the segment search compiled it); the result equals the probed matrix, and a node that changes the shape
    # still takes the basis
    shape = (3, 4, 5) if diagonal else (3, 1, 5)
    model = _node_graph(op, shape, consts, swap)
    node, n = model.graph.node[0], int(np.prod(shape))
    runs = []
    run = compile_module._run
    monkeypatch.setattr(compile_module, "_run", lambda *a: runs.append(1) or run(*a))
    monkeypatch.setattr(compile_module, "PROBE_BYTES", 8 * 7 * 120)  # the basis in chunks of 7 vectors

    def lowered() -> Affine:
        builder = Builder()
        x = Affine({builder.input(n, shape): identity(n)}, np.zeros(n), shape)
        runs.clear()
        return compile_module._affine_node(node, op, x, "x", dict(consts), list(model.opset_import))

    fast = lowered()
    fast_runs = len(runs)
    monkeypatch.setattr(compile_module, "ELEMENTWISE_OPS", set())
    probed = lowered()
    assert fast_runs == (3 if diagonal else len(runs)) and len(runs) > 3
    (a,), (b,) = (e.terms.values() for e in (fast, probed))
    assert a.shape == b.shape and abs(a - b).max() <= 1e-12 * abs(b).max() and a.nnz == b.nnz
    np.testing.assert_allclose(fast.bias, probed.bias, atol=1e-12)
    assert fast.shape == probed.shape
