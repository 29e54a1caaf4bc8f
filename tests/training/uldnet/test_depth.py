"""multiplicative_depth: per-operator levels (<= 3 for every ULD-Net operator), totals, residual paths."""

from __future__ import annotations

import pytest
import torch
from veil.training.uldnet import ModelConfig, PolyActConfig, build_model, multiplicative_depth
from veil.training.uldnet.polynorm import set_warmup


@pytest.mark.parametrize("arch", ["mlp", "cnn", "vit"])
def test_every_uldnet_operator_costs_at_most_three_levels(arch: str) -> None:
    model = build_model(ModelConfig(arch=arch, depth=2, act=PolyActConfig(degree=3)))
    report = multiplicative_depth(model)
    assert report.polynomial
    assert report.max_op_levels == 3
    assert {o.op for o in report.ops} >= {"PolyNorm", "PolyAct"}


def test_mlp_total_is_the_sum_along_its_chain() -> None:
    model = build_model(ModelConfig(arch="mlp", input_shape=[64], depth=2))
    # 2 x (Linear 1 + PolyNorm 3 + PolyAct(deg 2) 1) + Linear 1
    assert multiplicative_depth(model).total == 2 * (1 + 3 + 1) + 1


def test_residual_add_takes_the_longer_branch() -> None:
    # PolyCNN depth 1: stem (1+3+1) | block1: conv,norm,act,conv,norm = 1+3+1+1+3 (shortcut 0), act 1
    # | pool 1 | block2 same 9 (+1x1 conv shortcut of 1 on the short side) + act 1 | GAP 1 | fc 1
    model = build_model(ModelConfig(arch="cnn", depth=1))
    report = multiplicative_depth(model)
    assert report.total == 5 + (9 + 1) + 1 + (9 + 1) + 1 + 1  # 28, as veil.he.compile counts it
    shortcut = next(o for o in report.ops if o.name == "stage2.0.shortcut")
    assert shortcut.level_out == 5 + 10 + 1 + 1  # the short side: input level + 1, well below the main branch


def test_vit_counts_attention_and_its_projections() -> None:
    report = multiplicative_depth(build_model(ModelConfig(arch="vit", depth=1)))
    by_name = {o.name: o for o in report.ops}
    assert by_name["blocks.0.attn.attention"].levels == 3 and by_name["blocks.0.attn.attention"].ct_depth == 2
    assert by_name["blocks.0.attn.qkv"].levels == 1 and by_name["blocks.0.attn.proj"].levels == 1
    assert report.total == 1 + (3 + 1 + 3 + 1) + (3 + 1 + 1 + 1) + 3 + 1 + 1


@pytest.mark.parametrize("degree", [1, 2, 3])
def test_polyact_degree_sets_its_levels(degree: int) -> None:
    model = build_model(ModelConfig(arch="mlp", input_shape=[8], depth=1, act=PolyActConfig(degree=degree)))
    act = next(o for o in multiplicative_depth(model).ops if o.op == "PolyAct")
    assert (act.levels, act.ct_depth) == (degree - 1, degree - 1)  # leading coefficient folded


@pytest.mark.parametrize("arch", ["mlp", "cnn", "vit"])
def test_baselines_are_reported_not_polynomial(arch: str) -> None:
    report = multiplicative_depth(build_model(ModelConfig(arch=arch, baseline=True)))
    assert report.total is None and not report.polynomial
    assert report.non_polynomial()
    assert "not polynomial" in report.table()


def test_polynorm_in_warmup_is_not_polynomial() -> None:
    model = build_model(ModelConfig(arch="mlp", input_shape=[8]))
    set_warmup(model, True)
    assert multiplicative_depth(model).total is None
    set_warmup(model, False)
    assert multiplicative_depth(model).total == 6


def test_unknown_module_is_named() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Hardswish())
    with pytest.raises(TypeError, match="Hardswish"):
        multiplicative_depth(model)
