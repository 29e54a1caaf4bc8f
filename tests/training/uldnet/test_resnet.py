"""`--arch resnet` and the 32x32 PolyViT (issue 30 §3): shapes, gradients, the baseline twin, depth per block,
ONNX export with ONNX Runtime parity and the ops a CKKS compiler has to take."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn
from veil.training.uldnet import ModelConfig, build_model, multiplicative_depth
from veil.training.uldnet.config import PHOTOS32_PRESETS
from veil.training.uldnet.models import PolyResNet
from veil.training.uldnet.polyact import PolyAct
from veil.training.uldnet.polynorm import PolyNorm

from veil.config import ConfigError

torch.set_num_threads(1)
SHAPE = [3, 32, 32]


def resnet(depth: int = 1, width: int = 4, baseline: bool = False, shape=SHAPE) -> nn.Module:
    return build_model(ModelConfig(arch="resnet", input_shape=shape, width=width, depth=depth, baseline=baseline, num_classes=7))


def calibrated(model: nn.Module, shape=SHAPE) -> nn.Module:
    torch.manual_seed(0)
    model.train()
    with torch.no_grad():
        model(torch.randn(16, *shape))
    return model.eval()


def test_resnet20_layout_forward_and_backward() -> None:
    model = resnet(depth=3, width=16)
    assert isinstance(model, PolyResNet)
    convs = [m for m in model.modules() if isinstance(m, nn.Conv2d)]
    assert sum(c.kernel_size == (3, 3) for c in convs) == 19  # stem + 3 stages x 3 blocks x 2: ResNet-20 (+ fc)
    assert [c.out_channels for c in convs if c.kernel_size == (1, 1)] == [32, 64]  # strided 1x1 shortcuts
    assert [c.stride for c in convs if c.kernel_size == (1, 1)] == [(2, 2), (2, 2)]
    x = torch.randn(2, *SHAPE, requires_grad=True)
    out = model(x)
    assert out.shape == (2, 7)
    out.sum().backward()
    assert x.grad is not None and all(p.grad is not None for p in model.parameters())
    assert not any(isinstance(m, (nn.ReLU, nn.BatchNorm2d, nn.MaxPool2d)) for m in model.modules())


def test_the_baseline_twin_has_the_same_convolutions_with_relu_and_batchnorm() -> None:
    poly, twin = resnet(depth=2), resnet(depth=2, baseline=True)
    shapes = lambda m: [(n, tuple(x.weight.shape)) for n, x in m.named_modules() if isinstance(x, (nn.Conv2d, nn.Linear))]  # noqa: E731
    assert shapes(poly) == shapes(twin)  # conv / fc kernels, in order
    count = lambda m, t: sum(isinstance(x, t) for x in m.modules())  # noqa: E731
    assert count(poly, PolyNorm) == count(twin, nn.BatchNorm2d) and count(poly, PolyAct) == count(twin, nn.ReLU)
    assert twin(torch.randn(2, *SHAPE)).shape == (2, 7)


def test_depth_accounting_per_block() -> None:
    report = multiplicative_depth(resnet(depth=3, width=16).eval())
    assert [b["levels"] for b in report.per_block()] == [10] * 9  # conv 1 + PolyNorm 3 + PolyAct 1, twice
    assert report.total == 5 + 9 * 10 + 1 + 1 and report.max_op_levels == 3  # stem, blocks, GAP, fc
    assert multiplicative_depth(resnet(baseline=True).eval()).total is None


def test_polyvit_at_32x32_with_patch_4() -> None:
    config = ModelConfig(input_shape=SHAPE, num_classes=12, **PHOTOS32_PRESETS["vit"]["model"])
    model = build_model(config)
    assert model.patch.kernel_size == (4, 4) and model(torch.randn(2, *SHAPE)).shape == (2, 12)
    report = multiplicative_depth(model.eval())
    assert report.polynomial and len(report.per_block()) == config.depth
    twin = build_model(config.replace(baseline=True))
    assert any(isinstance(m, nn.LayerNorm) for m in twin.modules()) and any(isinstance(m, nn.GELU) for m in twin.modules())


def test_resnet_config_is_validated() -> None:
    with pytest.raises(ConfigError, match=r"ModelConfig\.depth: expected >= 1 for arch 'resnet', received 0"):
        ModelConfig(arch="resnet", input_shape=SHAPE, depth=0)
    with pytest.raises(ConfigError, match="expected at least 4x4"):
        ModelConfig(arch="resnet", input_shape=[3, 2, 2])


def test_polyresnet_exports_to_onnx_with_runtime_parity_and_ckks_ops_only() -> None:
    from veil.export import export_graph
    from veil.export.validate import cpu_session

    model = calibrated(resnet(depth=1, width=4))
    proto = export_graph(model, (torch.randn(4, *SHAPE),), ["x"], ["logits"], {"x": {0: "batch"}}).model
    session = cpu_session(proto)
    for batch in (1, 3):
        x = torch.randn(batch, *SHAPE)
        with torch.no_grad():
            expected = model(x).numpy()
        np.testing.assert_allclose(session.run(["logits"], {"x": x.numpy()})[0], expected, rtol=1e-4, atol=1e-4)
    ops = {n.op_type for n in proto.graph.node}
    assert {"Conv", "Add", "PolyNorm", "PolyAct"} <= ops
    assert not ops & {"Relu", "MaxPool", "BatchNormalization", "Sqrt", "Div", "Softmax"}
    assert ops <= {"Conv", "Add", "PolyNorm", "PolyAct", "GlobalAveragePool", "ReduceMean", "Flatten", "Reshape",
                   "Gemm", "MatMul"}, ops


def test_train_fallback_normalises_outliers_exactly_in_training_only() -> None:
    """The photos32 recipe's guard: a sample whose variance is far past Var-bar (mu v beyond the vertex k mu)
    is normalised with the exact 1/sqrt while training; evaluation (and export) stay polynomial."""
    from veil.training.uldnet.config import PolyNormConfig

    norm = PolyNorm(4, PolyNormConfig(train_fallback=True, affine=False), layout="channels")
    x = torch.randn(2, 4, 3, 3)
    x[1] *= 10.0  # variance ~100 x Var-bar (held at 1 below): far past k = 4
    norm.train()
    norm.running_var.fill_(1.0)
    norm.num_batches_tracked += 1
    norm.config.momentum = 1e-9  # keep Var-bar at 1 for this check
    y = norm(x)
    assert norm.last_v is not None and norm.last_v[1].item() > 8
    torch.testing.assert_close(y[1].std(unbiased=False), torch.tensor(1.0), atol=1e-3, rtol=0)  # exact LayerNorm
    norm.eval()
    assert norm(x)[1].std() > 10  # polynomial in eval: the parabola rises past its vertex


def test_warmup_records_relative_variances_for_the_warmup_penalty() -> None:
    from veil.training.uldnet.polynorm import set_warmup, variance_penalty

    model = resnet(depth=1)
    set_warmup(model, True)
    model.train()
    model(torch.randn(4, *SHAPE))
    assert variance_penalty(model, 0.0, 0.1) is not None  # TrainConfig.warmup_penalty applies it during warm-up


@pytest.mark.parametrize("baseline", [False, True])
def test_zero_init_residual_starts_every_block_as_its_shortcut(baseline: bool) -> None:
    from veil.training.uldnet.models import PreActBlock

    torch.manual_seed(0)
    model = build_model(ModelConfig(arch="resnet", input_shape=SHAPE, width=4, depth=2, baseline=baseline,
                                    num_classes=7, zero_init_residual=True)).train()
    blocks = [m for m in model.modules() if isinstance(m, PreActBlock)]
    assert len(blocks) == 6
    x = torch.randn(3, 4, 8, 8)
    for block in blocks[:2]:  # the identity-shortcut blocks of stage 1: the block is the identity at init
        torch.testing.assert_close(block(x), x, rtol=0, atol=0)
    out = model(torch.randn(3, *SHAPE))
    out.sum().backward()  # the zeroed convs still learn: their kernels get a gradient
    assert all(b.conv2.weight.grad.abs().sum() > 0 for b in blocks)
    plain = build_model(ModelConfig(arch="resnet", input_shape=SHAPE, width=4, depth=2, baseline=baseline, num_classes=7))
    assert all(b.conv2.weight.abs().sum() > 0 for b in plain.modules() if isinstance(b, PreActBlock))
