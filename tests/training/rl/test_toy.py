"""The toy comparison's measurements: every method's Fig. 3 measure uses one probability threshold, and the
benchmark keeps its main table and each variant's summary side by side."""

from __future__ import annotations

import json

import pytest
import veil.training.rl.diagnostics as diagnostics
from veil.training.rl import GrpoConfig
from veil.training.rl.toy import LOW_PROB, run_toy


@pytest.mark.parametrize("preset", ["lopti", "ar_lopti"])
def test_high_prob_direction_is_measured_at_one_threshold_whatever_the_eta(task, monkeypatch, preset) -> None:
    seen = []
    inner = diagnostics.high_prob_direction

    def spy(model, batch, cfg):
        seen.append(cfg.lopti_eta)
        return inner(model, batch, cfg)

    monkeypatch.setattr(diagnostics, "high_prob_direction", spy)
    cfg = GrpoConfig.preset(preset, lr=1e-3, group_size=4)
    assert cfg.lopti_eta != LOW_PROB or preset == "ar_lopti"
    run_toy(task, cfg, steps=2, prompts_per_step=2, seed=0, eval_prompts=4, eval_every=2, eval_samples=1)
    assert seen == [LOW_PROB, LOW_PROB]


@pytest.mark.slow
def test_benchmark_variant_keeps_the_main_table(load_benchmark, tmp_path) -> None:
    module = load_benchmark("optim_grpo")
    (tmp_path / "results.md").write_text("# results\n")
    assert module.main(["--quick", "--out", str(tmp_path)]) == 0
    assert module.main(["--quick", "--variant", "minibatch2", "--out", str(tmp_path)]) == 0
    results = json.loads((tmp_path / "results" / "optim_grpo.json").read_text())
    assert results["main"]["lr"] == module.LR and list(results["variants"]) == ["minibatch2"]
    mb2 = results["variants"]["minibatch2"]
    assert mb2["grpo_config"]["grpo"]["mini_batches"] == 2
    assert [r["optimizer_steps"] for r in mb2["summary"]] == [2, 4]  # grpo, ar_lopti: 2 mini-batches per pass
    text = (tmp_path / "results.md").read_text()
    assert "| grpo | 1 |" in text and "minibatch2:" in text and text.count("<!-- optim_grpo:begin -->") == 1
