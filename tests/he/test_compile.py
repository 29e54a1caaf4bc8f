"""HE compiler: the plan computes what ONNX Runtime computes (checked by a numpy interpreter of the plan,
no encryption; in latency mode it runs the slot program itself: masks, rotations, block sums), levels
follow he.md §1.7, refusals name the node, plans round-trip with a stable hash."""

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
from veil.he.compiler import CompileError, compile
from veil.he.errors import ParameterError
from veil.he.packing import fold_steps, residue, rotation_uses, sum_steps, tile
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
    """The plan's ops in float64 numpy: what the evaluator computes (slot by slot in latency mode)."""
    if plan.mode == "latency":
        return simulate_slots(plan, x)
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
            mean = xs[0].shape[1] * xs[1] ** 2 if len(xs) == 2 else 0
            outs = [np.sum(xs[0] ** 2, axis=1, keepdims=True) - mean]
        values.update(zip(op["outputs"], outs, strict=True))
    return plan.decode_outputs(list(values[plan.spec["outputs"][0]["value"]].T), len(x))


def rot(v: np.ndarray, step: int) -> np.ndarray:
    """Left rotation of every ciphertext's slots (rows of v) by ``step``, as SEAL's rotate_vector."""
    return np.roll(v, -step, axis=-1)


def simulate_slots(plan: Plan, x: np.ndarray, uses: list[int] | None = None) -> np.ndarray:
    """Latency plan on plaintext slot vectors (ciphertexts, slots), with the evaluator's BSGS and block sums.

    ``uses`` collects every rotation step taken (babies once per input, giants once per output)."""
    slots, uses = plan.slots, uses if uses is not None else []

    def rotate(v: np.ndarray, step: int) -> np.ndarray:
        uses.append(step)
        return rot(v, step)

    def spread(v: np.ndarray, window: int) -> np.ndarray:
        for step in sum_steps(window, plan.spec["period"]):
            v = v + rotate(v, step)
        return v

    values = {plan.spec["inputs"][0]["value"]: np.stack(plan.encode_inputs(x))}
    for op in plan.ops:
        xs = [values[v] for v in op["inputs"]]
        if op["op"] == "linear":
            outs, babies = [], {}
            folds = op.get("folds") or [None] * len(op["biases"])
            for diagonals, broadcast, bias, fold in zip(op["diagonals"], op["broadcast"], op["biases"], folds,
                                                        strict=True):
                giants: dict[int, np.ndarray] = {}
                for k, part in enumerate(diagonals or []):
                    if part is None:
                        continue
                    offsets = np.asarray(part["offsets"])
                    for mask, b, delta in zip(plan.tensors[part["masks"]], residue(offsets, **_split(op)), offsets,
                                              strict=True):
                        g = int(delta - b)
                        if (k, int(b)) not in babies:
                            babies[k, int(b)] = rotate(xs[k], int(b)) if b else xs[k]
                        giants[g] = giants.get(g, 0) + tile(np.roll(mask, g), slots) * babies[k, int(b)]
                total = giants.pop(0, 0) + sum(rotate(v, g) for g, v in giants.items())
                for step in fold_steps(fold):
                    total = total + rotate(total, step)
                if broadcast:
                    total = total + spread(sum(tile(plan.tensors[t], slots) * xs[k] for k, t in enumerate(broadcast)
                                               if t is not None), op["window"])
                outs.append(total + tile(plan.tensors[bias], slots))
        elif op["op"] == "mul":
            outs = [xs[0] * xs[1]]
        elif op["op"] == "add":
            outs = [xs[0] + xs[1]]
        elif op["op"] == "add_const":
            outs = [xs[0] + tile(plan.tensors[op["const"]], slots)]
        else:  # sumsq
            n = plan.spec["values"][op["inputs"][0]]["features"]
            outs = [spread(xs[0] ** 2, op["window"]) - (n * xs[1] ** 2 if len(xs) == 2 else 0)]
        values.update(zip(op["outputs"], outs, strict=True))
    return plan.decode_outputs(list(values[plan.spec["outputs"][0]["value"]]), len(x))


def _split(op: dict) -> dict:
    return {"modulus": op["split"]["modulus"], "signed": op["split"]["signed"]}


# name -> levels: linear 1, PolyNorm 3 after its linear, PolyAct(2) 1, PolyAct(3) 2, PolyAct(1) 0 (folded)
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
    # the conv is one output (PolyAct(2) is q2 y (y + q1 / q2) + q0: q2 and q0 fold into the head, no twin of
    # the conv); pool + flatten + Linear + that gain fold into the last one
    assert [len(op["outputs"]) for op in linear] == [1, 1]
    # the conv's outputs stay in place (2 channels x 64 slots); the head reads them where they are
    conv_out = plan.spec["values"][linear[0]["outputs"][0]]
    assert conv_out["positions"] == list(range(128)) and conv_out["grid"]["gap"] == 1
    assert plan.spec["period"] == 128 and plan.batch_capacity == plan.slots // 128


def test_key_manifest_is_the_set_of_rotations_used() -> None:
    latency, throughput = compile(exported("mlp"), mode="latency"), compile(exported("mlp"), mode="throughput")
    assert throughput.galois_steps == []
    used: list[int] = []
    simulate_slots(latency, np.zeros((1, 1, 8, 8)), used)
    assert latency.galois_steps == sorted(set(used)) == sorted(rotation_uses(latency.ops, latency.spec["period"]))
    assert latency.spec["rotations"]["rotations"] == len(used)


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


def test_plans_of_the_previous_format_load_and_unknown_formats_are_refused(tmp_path) -> None:
    # a veil.he.plan/2 plan (no folds, no gather) still runs; an evaluator older than /3 refuses a /3 plan by
    # its format instead of running its folds as if they were not there
    plan = compile(exported("mlp"), mode="latency")
    old = Plan({**plan.spec, "format": "veil.he.plan/2"}, plan.tensors)
    assert Plan.load(old.save(tmp_path / "old")).spec["format"] == "veil.he.plan/2"
    with pytest.raises(ValueError, match="expected format one of"):
        Plan.load(Plan({**plan.spec, "format": "veil.he.plan/9"}, plan.tensors).save(tmp_path / "future"))


def test_encode_decode_layouts() -> None:
    x = np.arange(2 * 64, dtype=np.float64).reshape(2, 1, 8, 8)
    latency, throughput = compile(exported("mlp"), mode="latency"), compile(exported("mlp"), mode="throughput")
    vectors = latency.encode_inputs(x)
    period = latency.spec["period"]
    assert len(vectors) == 1 and vectors[0].shape == (latency.slots,)  # both images in one ciphertext
    np.testing.assert_array_equal(vectors[0][period: period + 64], x[1].reshape(-1))  # image 1 in block 1
    assert not np.any(vectors[0][2 * period:])  # no replication
    assert [v.shape for v in throughput.encode_inputs(x)] == [(2,)] * 64
    with pytest.raises(ValueError, match="expected shape"):
        latency.encode_inputs(x[:, 0])


def test_he_package_does_not_import_torch() -> None:
    code = ("import sys, veil.he.compiler, veil.he.evaluate, veil.he.plan; "
            "sys.exit(1 if 'torch' in sys.modules else 0)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


class _SquareOf(nn.Module):
    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x):
        y = self.inner(x)
        return y * y


@pytest.mark.parametrize("variant", ["folded", "zero_lead", "then_square"])
def test_polyact_gain_folds_into_the_consumer_or_falls_back_to_a_twin(variant: str) -> None:
    # PolyAct(2) = q2 y (y + q1/q2) + q0 with q2, q0 left for the next matrix; a channel with q2 = 0 takes the
    # twin form (y (q2 y + q1) + q0, a second output of the conv); a product consumer gets the gain as a twin
    torch.manual_seed(0)
    act = poly_act(2, 2, channel_dim=1)
    if variant == "zero_lead":
        with torch.no_grad():
            act.alpha[0, 2] = 0.0  # (channels, degree + 1): channel 0's x^2 coefficient
    body = nn.Sequential(nn.Conv2d(1, 2, 3, padding=1), act)
    model = nn.Sequential(_SquareOf(body), nn.Flatten(), nn.Linear(128, 10)) if variant == "then_square" else \
        nn.Sequential(body, nn.Flatten(), nn.Linear(128, 10))
    graph = export_graph(model.eval(), (torch.randn(4, 1, 8, 8),), ["x"], ["logits"], {"x": {0: "batch"}}).model
    plan = compile(graph, mode="latency")
    conv = next(op for op in plan.ops if op["op"] == "linear")
    assert len(conv["outputs"]) == (1 if variant == "folded" else 2)
    assert plan.levels == (4 if variant == "then_square" else 3)  # conv, act, [square], head: the gain costs none
    x = np.random.default_rng(2).normal(size=(3, 1, 8, 8))
    np.testing.assert_allclose(simulate(plan, x), ort_run(graph, x), atol=2e-4, rtol=1e-4)
