"""PolyNormConfig.channel_prenorm: a per-channel standardization before the per-sample statistics, polynomial at
inference (a per-channel affine map the HE compiler folds: the same levels, the same encrypted result as ORT)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn
from veil.training.uldnet import ModelConfig, PolyNorm, PolyNormConfig, build_model, multiplicative_depth

torch.set_num_threads(1)
_SPEC = importlib.util.spec_from_file_location("he_test_compile", Path(__file__).parents[2] / "he" / "test_compile.py")
_HE = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(_HE)


def _trained_like(model: nn.Module, shape: tuple[int, ...]) -> nn.Module:
    """Running statistics from a few shifted, scaled batches (so the prenorm is not the identity), then eval."""
    torch.manual_seed(0)
    model.train()
    with torch.no_grad():
        for _ in range(4):
            model(3.0 * torch.randn(16, *shape) + 1.5)
    return model.eval()


def test_eval_is_polynorm_of_the_channel_standardized_input() -> None:
    with_pre = _trained_like(PolyNorm(4, PolyNormConfig(channel_prenorm=True), layout="channels"), (4, 5, 5))
    plain = PolyNorm(4, PolyNormConfig(), layout="channels")
    plain.load_state_dict({k: v for k, v in with_pre.state_dict().items() if not k.startswith("prenorm.")})
    plain.eval()
    bn = with_pre.prenorm
    assert not torch.allclose(bn.running_mean, torch.zeros(4)) and not torch.allclose(bn.running_var, torch.ones(4))
    x = torch.randn(3, 4, 5, 5) * 2 + 1
    standardized = (x - bn.running_mean[:, None, None]) / torch.sqrt(bn.running_var[:, None, None] + bn.eps)
    with torch.no_grad():
        torch.testing.assert_close(with_pre(x), plain(standardized))


def test_only_feature_maps_take_a_channel_prenorm() -> None:
    with pytest.raises(ValueError, match=r"channel_prenorm: expected only for feature maps .*received layout 'tokens'"):
        PolyNorm(8, PolyNormConfig(channel_prenorm=True), layout="tokens")


def _plain_cnn(prenorm: bool) -> nn.Module:
    torch.manual_seed(0)
    config = ModelConfig(arch="cnn", input_shape=[2, 6, 6], width=4, depth=1, residual=False, head="flatten",
                         num_classes=3, norm=PolyNormConfig(channel_prenorm=prenorm))
    return _trained_like(build_model(config), (2, 6, 6))


def test_the_exported_graph_runs_like_torch_and_compiles_to_the_same_levels() -> None:
    from veil.export import export_graph
    from veil.he.compiler import compile as he_compile

    graphs, plans = {}, {}
    for prenorm in (False, True):
        model = _plain_cnn(prenorm)
        graphs[prenorm] = export_graph(model, (torch.randn(2, 2, 6, 6),), ["x"], ["logits"], {"x": {0: "batch"}}).model
        x = np.random.default_rng(1).normal(size=(3, 2, 6, 6)).astype(np.float32)
        with torch.no_grad():
            expected = model(torch.from_numpy(x)).numpy()
        np.testing.assert_allclose(_HE.ort_run(graphs[prenorm], x), expected, rtol=1e-4, atol=1e-4)
        plans[prenorm] = he_compile(graphs[prenorm], precision_bits=20)
        assert multiplicative_depth(model).total == 1 + 3 + 1 + 1 + 3 + 1 + 1  # stem, norm, act, conv, norm, act, fc
    assert {"BatchNormalization", "Relu"}.isdisjoint(n.op_type for n in graphs[True].graph.node)
    assert plans[True].levels == plans[False].levels
    x = np.random.default_rng(2).normal(size=(2, 2, 6, 6))
    np.testing.assert_allclose(_HE.simulate(plans[True], x), _HE.ort_run(graphs[True], x), rtol=1e-3, atol=1e-3)


@pytest.mark.isolated  # SEAL keeps what it took: 2 GB in the xdist worker (VEIL_TEST_RSS, CI of stop 48)
def test_a_prenorm_cnn_runs_encrypted_like_onnx_runtime() -> None:
    from veil.export import export_graph
    from veil.he.compiler import compile as he_compile
    from veil.he.evaluate import PlanEvaluator
    from veil.he.keys import SecretKeyring

    graph = export_graph(_plain_cnn(True), (torch.randn(2, 2, 6, 6),), ["x"], ["logits"], {"x": {0: "batch"}}).model
    plan = he_compile(graph, precision_bits=20)
    x = np.random.default_rng(3).normal(size=(1, 2, 6, 6))
    ring = SecretKeyring.generate(plan.parameters(), plan.galois_steps)
    out = PlanEvaluator(plan, plan.parameters()).run(ring.encrypt(plan.encode_inputs(x)), ring.evaluation_keys())
    got = plan.decode_outputs(ring.decrypt(out), 1)
    np.testing.assert_allclose(got, _HE.ort_run(graph, x), atol=1e-2)
