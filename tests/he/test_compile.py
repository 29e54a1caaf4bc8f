"""HE compiler: the plan computes what ONNX Runtime computes (checked by a numpy interpreter of the plan,
no encryption), levels follow he.md §1.7, refusals name the node, plans round-trip with a stable hash."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from torch import nn
from veil.export import export_graph
from veil.he.compile import CompileError, compile
from veil.he.errors import ParameterError
from veil.he.plan import Plan
from veil.training.uldnet import (
    ModelConfig,
    PolyAct,
    PolyActConfig,
    PolyCNN,
    PolyMLP,
    PolyNorm,
    PolyNormConfig,
)


class Residual(nn.Module):
    """lin1 -> (y * y + y) -> lin2: a ct x ct product and a residual add of two ciphertext tensors."""

    def __init__(self) -> None:
        super().__init__()
        self.lin1, self.lin2 = nn.Linear(64, 12), nn.Linear(12, 10)

    def forward(self, x):  # (B, 1, 8, 8) -> (B, 10)
        y = self.lin1(x.flatten(1))
        return self.lin2(y * y + y)


def poly_act(channels: int, degree: int, channel_dim: int = -1) -> PolyAct:
    act = PolyAct(channels, PolyActConfig(degree=degree), channel_dim=channel_dim)
    with torch.no_grad():
        act.alpha.add_(0.1 * torch.randn_like(act.alpha))
    return act


def build(name: str) -> nn.Module:
    """The tiny test models, one per supported op family."""
    torch.manual_seed(0)
    if name == "mlp":  # Linear -> PolyNorm -> PolyAct(2) -> Linear
        return PolyMLP(ModelConfig(arch="mlp", input_shape=[1, 8, 8], width=16, depth=1))
    if name == "conv":  # Conv -> PolyAct(2) -> AvgPool -> Flatten -> Linear
        return nn.Sequential(nn.Conv2d(1, 2, 3, padding=1), poly_act(2, 2, channel_dim=1), nn.AvgPool2d(2),
                             nn.Flatten(), nn.Linear(32, 10))
    if name == "norm_conv":  # Conv -> PolyNorm (channels) -> GAP -> Linear
        norm = PolyNorm(2, PolyNormConfig(), layout="channels")
        norm.running_var.fill_(0.3)
        return nn.Sequential(nn.Conv2d(1, 2, 3, padding=1), norm, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2, 10))
    if name == "cubic":  # Linear -> PolyAct(3) -> Linear -> PolyAct(1) -> Linear
        return nn.Sequential(nn.Flatten(), nn.Linear(64, 8), poly_act(8, 3), nn.Linear(8, 8), poly_act(8, 1),
                             nn.Linear(8, 10))
    if name == "residual":
        return Residual()
    if name == "relu":
        return nn.Sequential(nn.Flatten(), nn.Linear(64, 8), nn.ReLU(), nn.Linear(8, 10))
    if name == "maxpool":
        return nn.Sequential(nn.Conv2d(1, 2, 3, padding=1), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(32, 10))
    if name == "deep_cnn":
        return PolyCNN(ModelConfig(arch="cnn", input_shape=[1, 8, 8], width=4, depth=1))
    raise KeyError(name)


_CACHE: dict[str, onnx.ModelProto] = {}


def exported(name: str) -> onnx.ModelProto:
    if name not in _CACHE:
        model = build(name).eval()
        _CACHE[name] = export_graph(model, (torch.randn(4, 1, 8, 8),), ["x"], ["logits"], {"x": {0: "batch"}}).model
    return _CACHE[name]


def ort_run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    return ort.InferenceSession(model.SerializeToString()).run(None, {"x": x.astype(np.float32)})[0]


def simulate(plan: Plan, x: np.ndarray) -> np.ndarray:
    """The plan's ops in float64 numpy, on flattened samples (B, F): what the evaluator computes."""
    values = {plan.spec["inputs"][0]["value"]: x.reshape(len(x), -1).astype(np.float64)}
    for op in plan.ops:
        xs = [values[v] for v in op["inputs"]]
        if op["op"] == "linear":
            outs = [sum(v @ plan.tensors[w].T for v, w in zip(xs, row, strict=True)) + plan.tensors[b]
                    for row, b in zip(op["weights"], op["biases"], strict=True)]
        elif op["op"] == "mul":
            outs = [xs[0] * xs[1]]
        elif op["op"] == "add":
            outs = [xs[0] + xs[1]]
        elif op["op"] == "add_const":
            outs = [xs[0] + plan.tensors[op["const"]]]
        else:  # sumsq
            outs = [np.sum(xs[0] ** 2, axis=1, keepdims=True)]
        values.update(zip(op["outputs"], outs, strict=True))
    return plan.decode_outputs(list(values[plan.spec["outputs"][0]["value"]].T), len(x)) if plan.mode == "throughput" \
        else values[plan.spec["outputs"][0]["value"]].reshape(len(x), *plan.spec["outputs"][0]["shape"])


# name -> levels: linear 1, PolyNorm 3 after its linear, PolyAct(2) 1, PolyAct(3) 2, PolyAct(1) 0 (twins)
LEVELS = {"mlp": 6, "conv": 3, "norm_conv": 5, "cubic": 5, "residual": 3}


@pytest.mark.parametrize("name", sorted(LEVELS))
@pytest.mark.parametrize("mode", ["latency", "throughput"])
def test_plan_matches_onnx_runtime(name: str, mode: str) -> None:
    model = exported(name)
    plan = compile(model, mode=mode)
    assert plan.levels == LEVELS[name]
    x = np.random.default_rng(1).normal(size=(5, 1, 8, 8))
    np.testing.assert_allclose(simulate(plan, x), ort_run(model, x), atol=2e-4, rtol=1e-4)


def test_linear_ops_fold_into_one_affine_map() -> None:
    plan = compile(exported("conv"), mode="latency")
    linear = [op for op in plan.ops if op["op"] == "linear"]
    # conv + its PolyAct twin share one op; pool + flatten + Linear fold into the last one
    assert [len(op["outputs"]) for op in linear] == [2, 1]
    assert plan.spec["period"] == 128 and plan.tensors[linear[1]["weights"][0][0]].shape == (10, 128)


def test_key_manifest_lists_only_bsgs_and_slot_sum_steps() -> None:
    latency, throughput = compile(exported("mlp"), mode="latency"), compile(exported("mlp"), mode="throughput")
    assert throughput.galois_steps == []
    assert latency.galois_steps == [1, 2, 3, 4, 5, 6, 7, 8, 16, 24, 32, 40, 48, 56]  # period 64, 8 baby steps


@pytest.mark.parametrize(("name", "op"), [("relu", "Relu"), ("maxpool", "MaxPool")])
def test_non_polynomial_node_is_refused_by_name(name: str, op: str) -> None:
    model = exported(name)
    node = next(n for n in model.graph.node if n.op_type == op)
    with pytest.raises(CompileError, match=rf"node '{node.name}' \({op}\).*veil train uldnet"):
        compile(model)


def test_too_deep_model_is_refused_with_its_level_count() -> None:
    # A width-4 digits PolyCNN needs 28 levels after folding (the foundation's cost model counts 33 for the
    # width-32 preset); no 128-bit set without bootstrapping offers more than about 22 at 20 bits.
    with pytest.raises(ParameterError, match=r"needs 2\d levels"):
        compile(exported("deep_cnn"))


def test_unknown_mode_is_refused() -> None:
    with pytest.raises(CompileError, match="mode"):
        compile(exported("mlp"), mode="fast")  # type: ignore[arg-type]


def test_plan_save_load_round_trip_and_hash(tmp_path) -> None:
    plan = compile(exported("mlp"), mode="latency")
    again = compile(exported("mlp"), mode="latency")
    assert plan.hash() == again.hash()  # deterministic compilation
    loaded = Plan.load(plan.save(tmp_path / "plan"))
    assert loaded.hash() == plan.hash() and loaded.spec["onnx_sha256"] == plan.spec["onnx_sha256"]
    x = np.random.default_rng(2).normal(size=(2, 1, 8, 8))
    np.testing.assert_array_equal(simulate(loaded, x), simulate(plan, x))
    (tmp_path / "plan" / "plan.json").write_text((tmp_path / "plan" / "plan.json").read_text().replace(
        '"levels": 6', '"levels": 5'))
    with pytest.raises(ValueError, match="plan_hash"):
        Plan.load(tmp_path / "plan")


def test_encode_decode_layouts() -> None:
    x = np.arange(2 * 64, dtype=np.float64).reshape(2, 1, 8, 8)
    latency, throughput = compile(exported("mlp"), mode="latency"), compile(exported("mlp"), mode="throughput")
    vectors = latency.encode_inputs(x)
    assert len(vectors) == 2 and vectors[1].shape == (latency.slots,)
    np.testing.assert_array_equal(vectors[1][64:128], x[1].reshape(-1))  # replicated with period 64
    assert [v.shape for v in throughput.encode_inputs(x)] == [(2,)] * 64
    with pytest.raises(ValueError, match="expected shape"):
        latency.encode_inputs(x[:, 0])


def test_he_package_does_not_import_torch() -> None:
    code = ("import sys, veil.he.compile, veil.he.evaluate, veil.he.plan; "
            "sys.exit(1 if 'torch' in sys.modules else 0)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
