"""`veil export he` says which ring N a plan runs at and why no smaller 128-bit ring holds it (issue 17 §2)."""

from __future__ import annotations

import json

import pytest
import torch
from veil.export import export_graph
from veil.export.he_params import parameter_choice, ring_fit
from veil.he.compiler import compile as he_compile
from veil.training.uldnet import ModelConfig, build_model
from veil.training.uldnet.config import DIGITS_HE_PRESETS


def _graph(config: ModelConfig):
    model = build_model(config).eval()
    return export_graph(model, (torch.randn(2, *config.input_shape),), ["x"], ["logits"], {"x": {0: "batch"}}).model


@pytest.mark.parametrize("mode, precision_bits", [("latency", 20), ("latency", 10), ("throughput", 20)])
def test_the_first_ring_that_fits_is_the_one_the_compiler_chose(mode: str, precision_bits: int) -> None:
    graph = _graph(ModelConfig(input_shape=[1, 8, 8], **{**DIGITS_HE_PRESETS["mlp"]["model"], "width": 8}))
    plan = he_compile(graph, mode=mode, precision_bits=precision_bits)
    choice = parameter_choice(plan)
    fits = [r["poly_modulus_degree"] for r in choice["rings"] if r["fits"]]
    assert fits and fits[0] == plan.parameters().poly_modulus_degree == choice["poly_modulus_degree"]
    assert all(r["why_not"] for r in choice["rings"][:-1])
    assert choice["levels"] == plan.levels and choice["coeff_mod_bit_sizes"] == list(plan.parameters().coeff_mod_bit_sizes)


def test_the_digits_he_cnn_report_names_levels_chain_slots_and_the_smaller_rings() -> None:
    plan = he_compile(_graph(ModelConfig(input_shape=[1, 8, 8], **DIGITS_HE_PRESETS["cnn"]["model"])), mode="latency")
    choice = parameter_choice(plan)
    assert choice["poly_modulus_degree"] == 16384 and choice["levels"] == 8
    why = choice["why"]
    assert why.startswith("N=16384 is the smallest 128-bit ring that holds 8 levels at 20 bits of precision")
    assert f"{choice['slots_needed']}-slot block per image" in why and str(choice["coeff_mod_bit_sizes"]) in why
    assert "N=8192: 8 levels at a 34-bit scale" in why and "above the 128-bit cap 218" in why


def test_ring_fit_names_the_slot_shortage() -> None:
    row = ring_fit(4096, 1, 10, slots_needed=4096)
    assert not row["fits"] and "2048 slots < the 4096 one ciphertext block needs" in row["why_not"]


@pytest.mark.slow
@pytest.mark.isolated
def test_veil_export_he_prints_and_records_the_choice_and_takes_the_key_mode(tmp_path, capsys) -> None:
    from veil.export.he_cli import main as export_he_main
    from veil.training.uldnet import TrainConfig, load_digits_preset, save_uldnet, train_uldnet

    data = load_digits_preset()
    config = ModelConfig(input_shape=data.input_shape, **{**DIGITS_HE_PRESETS["mlp"]["model"], "width": 8})
    save_uldnet(train_uldnet(config, TrainConfig(epochs=2, warmup_epochs=1), data, progress=False), tmp_path / "ck", data)
    assert export_he_main([str(tmp_path / "ck"), "--repo", str(tmp_path / "repo"), "--name", "m",
                           "--rotation-keys", "pow2"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["parameter_choice"].startswith("N=16384 is the smallest") and "parameters: N=16384" in err
    manifest = json.loads((tmp_path / "repo" / "m" / "veil.json").read_text())
    assert manifest["parameter_choice"]["poly_modulus_degree"] == manifest["parameters"]["poly_modulus_degree"]
    steps = manifest["galois_steps"]
    assert steps and all(abs(s) & (abs(s) - 1) == 0 for s in steps)  # --rotation-keys pow2: powers of two only
