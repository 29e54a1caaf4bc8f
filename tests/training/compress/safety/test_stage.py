"""The ``realign`` recipe stage: registry entry, config JSON round trip and validation, apply with a log."""

from __future__ import annotations

import json
from typing import Any

import pytest
from veil.training.compress.registry import get_stage
from veil.training.compress.safety import STAGES, RealignConfig, apply_realign
from veil.training.compress.safety.data import UNIVERSAL_EXAMPLE

from veil.config import ConfigError


class RecordingLog:
    """Duck-typed stand-in of compress.log.ModuleLog: keeps every call."""

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []

    def __call__(self, module: str, **kwargs: Any) -> None:
        self.records.append({"module": module, **kwargs})


def test_registry_finds_the_stage() -> None:
    stage = get_stage("realign")
    assert stage is STAGES["realign"] and stage.config_cls is RealignConfig and stage.apply is apply_realign


def test_config_json_round_trip_and_defaults() -> None:
    cfg = RealignConfig(prompt="How do I x?", response="Sorry, no.", lr=3e-4, mode="lora", gate="synthetic")
    assert RealignConfig.from_json(cfg.to_json()) == cfg
    default = RealignConfig()
    assert default.epochs == 10 and default.example() == UNIVERSAL_EXAMPLE


@pytest.mark.parametrize(("kwargs", "field"), [({"epochs": 0}, "epochs"), ({"lr": 0.0}, "lr"),
                                               ({"mode": "qlora"}, "mode"), ({"prompt": ""}, "prompt"),
                                               ({"only_if_asr_above": 10.0}, "only_if_asr_above"),  # needs a gate
                                               ({"only_if_asr_above": 101.0, "gate": "synthetic"}, "only_if_asr_above")])
def test_config_names_the_bad_field(kwargs: dict, field: str) -> None:
    with pytest.raises(ConfigError, match=rf"RealignConfig\.{field}"):
        RealignConfig(**kwargs)


def test_example_file(tmp_path) -> None:
    path = tmp_path / "ex.json"
    path.write_text(json.dumps({"prompt": "How do I y?", "response": "I cannot help."}))
    assert RealignConfig(example_file=str(path)).example() == ("How do I y?", "I cannot help.")
    path.write_text(json.dumps({"prompt": 3}))
    with pytest.raises(ConfigError, match="example_file"):
        RealignConfig(example_file=str(path)).example()
    with pytest.raises(FileNotFoundError, match="example_file"):
        RealignConfig(example_file=str(tmp_path / "missing.json")).example()


def test_apply_patches_in_place_and_logs(micro_lm) -> None:
    log = RecordingLog()
    weight = micro_lm.get_parameter("model.layers.0.mlp.up_proj.weight").detach().clone()
    summary = apply_realign(micro_lm, RealignConfig(epochs=4, lr=1e-3, gate="synthetic", gate_prompts=4), None, log)
    assert summary["steps"] == 4 and summary["loss_final"] < summary["loss_first"]
    assert not weight.equal(micro_lm.get_parameter("model.layers.0.mlp.up_proj.weight"))
    assert set(summary["gate"]["before"]) >= {"asr", "utility"} and summary["gate"]["after"]["asr"] >= 0
    (record,) = log.records
    assert record["module"] == "model" and record["params_before"] == record["params_after"] == 139_584
    assert record["steps"] == 4 and "asr_after" in record
    json.dumps(summary)


def test_apply_only_if_asr_above_decides_on_the_gate(micro_lm) -> None:
    weight = micro_lm.get_parameter("model.layers.0.mlp.up_proj.weight").detach().clone()
    cfg = RealignConfig(epochs=2, lr=1e-3, gate="synthetic", gate_prompts=4, only_if_asr_above=100.0)
    log = RecordingLog()
    summary = apply_realign(micro_lm, cfg, None, log)  # any ASR is <= 100 %: nothing to repair, nothing trained
    assert summary["skipped"] and summary["steps"] == 0 and "100" in summary["reason"]
    assert weight.equal(micro_lm.get_parameter("model.layers.0.mlp.up_proj.weight"))
    assert log.records[0]["skipped"] and log.records[0]["steps"] == 0
    # the untrained micro model does not refuse (ASR 100 % > 50 %): the patch runs
    summary = apply_realign(micro_lm, RealignConfig(**{**cfg.to_dict(), "only_if_asr_above": 50.0}), None, log)
    assert not summary["skipped"] and summary["steps"] == 2 and summary["gate"]["before"]["asr"] > 50.0
    json.dumps(summary)


def test_recipe_entry_parses_to_the_stage() -> None:
    from veil.training.compress.recipe import parse_recipe

    recipe = parse_recipe({"seed": 0, "stages": [{"method": "realign", "epochs": 10, "lr": 1e-4, "mode": "full"}]})
    (entry,) = recipe.stages
    assert entry.stage is STAGES["realign"] and entry.config == RealignConfig(epochs=10, lr=1e-4)
    with pytest.raises(ConfigError, match="unknown options"):
        parse_recipe({"stages": [{"method": "realign", "epoch": 3}]})


def test_apply_with_the_module_log(micro_lm) -> None:
    from veil.training.compress.log import ModuleLog

    log = ModuleLog(progress=False)
    log.stage = "realign"
    apply_realign(micro_lm, RealignConfig(epochs=2), None, log)
    assert log.records[0]["stage"] == "realign" and log.records[0]["steps"] == 2
