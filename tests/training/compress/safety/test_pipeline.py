"""A tiny end-to-end run of align -> attack -> select -> patch on a micro model (mechanics, not the target)."""

from __future__ import annotations

import json

import pytest
from veil.training.compress.safety import PipelineConfig, run_pipeline

from veil.config import ConfigError

SMALL = {"preset": "micro", "pretrain_steps": 5, "align_steps": 20, "align_benign": 64, "align_harmful": 32, "attack_harmful": 8,
         "attack_task": 8, "attack_benign": 8, "attack_epochs": 2, "batch_size": 8, "candidates": 3, "val_prompts": 2,
         "eval_harmful": 4, "eval_benign": 4, "eval_downstream": 2, "max_new_bytes": 8, "lr_grid": []}


def test_pipeline_end_to_end_with_controls() -> None:
    out = run_pipeline(PipelineConfig(**{**SMALL, "lr_grid": [1e-4, 1e-3]}, controls=True, baselines=True))
    assert list(out["phases"]) == ["aligned", "attacked", "patched"]
    assert out["phases"]["aligned"]["steps"] == 20 and out["phases"]["attacked"]["steps"] == 2 * 3  # 24 examples in batches of 8
    assert out["phases"]["patched"]["steps"] == 10
    assert len(out["selection"]["candidates"]) == 3 * 2  # candidates x lr_grid
    assert out["selection"]["lr"] in (1e-4, 1e-3) and out["phases"]["patched"]["lr"] == out["selection"]["lr"]
    assert tuple(out["selection"]["example"]) == (out["selection"]["candidates"][0]["prompt"],
                                                  out["selection"]["candidates"][0]["response"])
    assert set(out["controls"]) == {"universal", "random_candidate", "benign_example", "safety_k4", "safety_k16",
                                    "safety_k64"}
    ranking = out["selection"]["test_ranking"]
    assert len(ranking["candidates"]) == 3 and 0.0 <= ranking["summary"]["share_strictly_better"] < 1.0
    chosen = next(c for c in ranking["candidates"] if [c["prompt"], c["response"]] == out["selection"]["example"])
    assert chosen["asr"] == out["phases"]["patched"]["asr"]  # same patch, same gate: the ranking is of real patches
    assert out["controls"]["safety_k64"]["steps"] == 10 * 4  # 64 examples in batches of 16, 10 epochs
    assert {"cer_4", "overlap_8", "cos_to_aligned"} <= set(out["mechanism"])
    assert set(out["baselines"]) == {"resta", "safelora"} and "layers_projected" in out["baselines"]["safelora"]["setting"]
    json.dumps(out)


def test_pipeline_controls_without_a_downstream_gate() -> None:
    out = run_pipeline(PipelineConfig(**{**SMALL, "candidates": 2, "eval_downstream": 0}, controls=True))
    assert all("downstream" not in c for c in out["selection"]["test_ranking"]["candidates"])


def test_pipeline_is_deterministic() -> None:
    cfg = PipelineConfig(**{**SMALL, "align_steps": 5, "candidates": 2}, selection="gradient")
    a, b = run_pipeline(cfg), run_pipeline(cfg)
    for phase in ("aligned", "attacked", "patched"):
        assert a["phases"][phase]["asr"] == b["phases"][phase]["asr"]
        assert a["phases"][phase]["refusal_logprob"] == pytest.approx(b["phases"][phase]["refusal_logprob"])
    assert a["selection"]["example"] == b["selection"]["example"]


def test_pipeline_cache_reuses_the_trained_phases(tmp_path) -> None:
    cfg = PipelineConfig(**{**SMALL, "align_steps": 5, "candidates": 2}, selection="gradient")
    first = run_pipeline(cfg, cache_dir=tmp_path)
    assert len(list(tmp_path.glob("safety_phases_*.pt"))) == 1 and not list(tmp_path.glob("*.tmp"))
    messages: list[str] = []
    second = run_pipeline(cfg, progress=messages.append, cache_dir=tmp_path)
    assert any("loaded from" in m for m in messages)
    for phase in ("aligned", "attacked", "patched"):  # the same θ0 / θ*, so the same gates (timing aside)
        same = {k: v for k, v in first["phases"][phase].items() if k != "seconds" or phase != "patched"}
        assert {k: second["phases"][phase][k] for k in same} == pytest.approx(same, rel=1e-6)
    assert second["pretrained"] == first["pretrained"]
    other = run_pipeline(PipelineConfig(**{**SMALL, "align_steps": 6, "candidates": 2}, selection="gradient"),
                         progress=messages.append, cache_dir=tmp_path)  # another phase setting: trained, not loaded
    assert len(list(tmp_path.glob("safety_phases_*.pt"))) == 2 and other["phases"]["aligned"]["steps"] == 6


def test_pipeline_compression_interaction() -> None:
    out = run_pipeline(PipelineConfig(**{**SMALL, "candidates": 2, "lr_grid": [1e-3]}, compress_ratios=[0.2, 0.4]))
    assert [inter["ratio"] for inter in out["compression"]] == [0.2, 0.4]
    for inter in out["compression"]:
        assert inter["parameters"]["factorised_layers"]["compression_ratio"] == pytest.approx(inter["ratio"], abs=0.05)
        assert inter["patched"]["asr"] == out["phases"]["patched"]["asr"]  # the gate before the recipe is θ_patched's
        # the micro model never refuses (ASR 100 % > 10 %), so the realign stage patches the compressed model
        assert inter["compressed"]["asr"] > 10.0 and inter["repatch_skipped"] is False
        assert inter["repatched"]["refusal_logprob"] > inter["compressed"]["refusal_logprob"]  # moved towards refusing


def test_pipeline_config_round_trip_and_validation() -> None:
    cfg = PipelineConfig(**{**SMALL, "lr_grid": [1e-3]}, patch_mode="lora")
    assert PipelineConfig.from_json(cfg.to_json()) == cfg
    with pytest.raises(ConfigError, match=r"PipelineConfig\.patch_lr"):
        PipelineConfig(patch_lr=-1.0)
    with pytest.raises(ConfigError, match=r"PipelineConfig\.selection"):
        PipelineConfig(selection="oracle")
    with pytest.raises(ConfigError, match=r"PipelineConfig\.compress_ratios"):
        PipelineConfig(compress_ratios=[0.2, 1.0])
