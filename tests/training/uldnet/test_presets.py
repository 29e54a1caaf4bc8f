"""`--preset digits-he`: the HE-sized ULD-Net recipes (issue 17 §2) and the plain PolyCNN they use."""

from __future__ import annotations

import json

import pytest
import torch
from veil.training.uldnet import ModelConfig, build_model, multiplicative_depth
from veil.training.uldnet.cli import main
from veil.training.uldnet.config import DIGITS_HE_PRESET, DIGITS_HE_PRESETS
from veil.training.uldnet.models import PlainPolyCNN, PolyCNN

from veil.config import ConfigError


def test_digits_he_cnn_preset_trains_a_plain_polycnn_whose_plan_fits_one_leveled_set(tmp_path, capsys) -> None:
    from veil.export import export_graph
    from veil.he.compiler import compile as he_compile
    from veil.training.uldnet import load_uldnet

    out = tmp_path / "ck"
    assert main(["--preset", "digits-he", "--arch", "cnn", "--epochs", "2", "--warmup-epochs", "1", "--threads", "1",
                 "--out", str(out), "--no-progress"]) == 0
    metrics = json.loads(capsys.readouterr().out)
    assert metrics["polynomial"] and metrics["depth_total"] == 8 and metrics["depth_max_per_operator"] == 3
    saved = json.loads((out / "config.json").read_text())["model"]
    assert {k: saved[k] for k in DIGITS_HE_PRESETS["cnn"]["model"]} == DIGITS_HE_PRESETS["cnn"]["model"]
    model, _ = load_uldnet(out)
    assert isinstance(model, PlainPolyCNN)
    graph = export_graph(model, (torch.randn(2, 1, 8, 8),), ["x"], ["logits"], {"x": {0: "batch"}}).model
    plan = he_compile(graph, mode="latency")
    assert plan.levels == 8 and plan.parameters().poly_modulus_degree <= 16384  # one leveled 128-bit set


def test_digits_he_preset_keeps_the_mlp_recipe_and_refuses_families_without_one(tmp_path) -> None:
    assert DIGITS_HE_PRESETS["mlp"] is DIGITS_HE_PRESET and DIGITS_HE_PRESET["model"]["arch"] == "mlp"
    with pytest.raises(ConfigError, match=r"--arch: preset 'digits-he' has recipes for \['cnn', 'mlp'\], received 'vit'"):
        main(["--preset", "digits-he", "--arch", "vit", "--epochs", "2", "--out", str(tmp_path / "v"), "--no-progress"])


@pytest.mark.parametrize("options, levels", [
    ({"residual": False, "stem_stride": 2, "block_norm": False, "head": "flatten", "depth": 1}, 8),
    ({"residual": False, "stem_stride": 1, "block_norm": True, "head": "gap", "depth": 1}, 12),
    ({"residual": False, "stem_stride": 2, "head": "flatten", "depth": 0}, 6),
])
def test_plain_polycnn_shapes_and_levels(options: dict, levels: int) -> None:
    model = build_model(ModelConfig(arch="cnn", width=4, **options)).eval()
    assert isinstance(model, PlainPolyCNN) and model(torch.randn(3, 1, 8, 8)).shape == (3, 10)
    assert multiplicative_depth(model).total == levels


def test_residual_polycnn_takes_the_stem_stride_and_head_options() -> None:
    default = build_model(ModelConfig(arch="cnn", width=4))
    assert isinstance(default, PolyCNN) and default.stem[0].stride == (1, 1)  # the `--preset digits` model unchanged
    model = build_model(ModelConfig(arch="cnn", width=4, stem_stride=2, head="flatten")).eval()
    assert model(torch.randn(2, 1, 8, 8)).shape == (2, 10) and model.head[-1].in_features == 8 * 2 * 2


def test_stem_stride_is_validated() -> None:
    with pytest.raises(ConfigError, match=r"ModelConfig\.stem_stride: expected 1 or 2, received 3"):
        ModelConfig(arch="cnn", stem_stride=3)
    with pytest.raises(ConfigError, match="expected at least 2x2"):
        ModelConfig(arch="cnn", input_shape=[1, 2, 2], stem_stride=2)
