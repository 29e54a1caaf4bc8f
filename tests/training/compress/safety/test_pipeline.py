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
    out = run_pipeline(PipelineConfig(**{**SMALL, "lr_grid": [1e-4, 1e-3]}, controls=True))
    assert list(out["phases"]) == ["aligned", "attacked", "patched"]
    assert out["phases"]["aligned"]["steps"] == 20 and out["phases"]["attacked"]["steps"] == 2 * 3  # 24 examples in batches of 8
    assert out["phases"]["patched"]["steps"] == 10
    assert len(out["selection"]["candidates"]) == 3 * 2  # candidates x lr_grid
    assert out["selection"]["lr"] in (1e-4, 1e-3) and out["phases"]["patched"]["lr"] == out["selection"]["lr"]
    assert tuple(out["selection"]["example"]) == (out["selection"]["candidates"][0]["prompt"],
                                                  out["selection"]["candidates"][0]["response"])
    assert set(out["controls"]) == {"universal", "random_candidate", "benign_example", "safety_k4", "safety_k16",
                                    "safety_k64"}
    assert out["controls"]["safety_k64"]["steps"] == 10 * 4  # 64 examples in batches of 16, 10 epochs
    assert {"cer_4", "overlap_8", "cos_to_aligned"} <= set(out["mechanism"])
    json.dumps(out)


def test_pipeline_is_deterministic() -> None:
    cfg = PipelineConfig(**{**SMALL, "align_steps": 5, "candidates": 2}, selection="gradient")
    a, b = run_pipeline(cfg), run_pipeline(cfg)
    for phase in ("aligned", "attacked", "patched"):
        assert a["phases"][phase]["asr"] == b["phases"][phase]["asr"]
        assert a["phases"][phase]["refusal_logprob"] == pytest.approx(b["phases"][phase]["refusal_logprob"])
    assert a["selection"]["example"] == b["selection"]["example"]


def test_pipeline_config_round_trip_and_validation() -> None:
    cfg = PipelineConfig(**{**SMALL, "lr_grid": [1e-3]}, patch_mode="lora")
    assert PipelineConfig.from_json(cfg.to_json()) == cfg
    with pytest.raises(ConfigError, match=r"PipelineConfig\.patch_lr"):
        PipelineConfig(patch_lr=-1.0)
    with pytest.raises(ConfigError, match=r"PipelineConfig\.selection"):
        PipelineConfig(selection="oracle")
