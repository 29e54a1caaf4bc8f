"""Report: ratio bookkeeping, zero drift for an uncompressed copy, growing drift under compression, and the
compress() output folder that reloads."""

from __future__ import annotations

import copy
import json

import torch
from veil.training.compress.api import compress, load_compressed
from veil.training.compress.calibration import Calibration
from veil.training.compress.report import count_params, drift_table, parameter_report


def test_zero_drift_for_uncompressed_copy(micro_lm, micro_calibration) -> None:
    rows = drift_table(micro_lm, copy.deepcopy(micro_lm), micro_calibration)
    assert len(rows) == 2
    for row in rows:
        assert row["rel_error"] < 1e-6 and abs(row["cosine"] - 1.0) < 1e-5


def test_compress_report_ratios_drift_and_reload(micro_lm, micro_calibration, micro_blocks, tmp_path) -> None:
    from veil.training.compress.workloads import lm_perplexity

    model = copy.deepcopy(micro_lm)
    held = Calibration.from_tokens(micro_blocks[:, :-1], batch_size=4)
    report = compress(model, {"seed": 0, "stages": [{"method": "saes_svd", "ratio": 0.4}]}, micro_calibration,
                      tmp_path / "out", eval_fn=lambda m: lm_perplexity(m, micro_blocks), eval_data=held,
                      progress=False)
    fac = report["parameters"]["factorised_layers"]
    assert fac["layers"] == 14 and abs(fac["keep_ratio"] + fac["compression_ratio"] - 1) < 1e-12
    assert 0.4 <= fac["compression_ratio"] < 0.45  # floor() of the rank removes a little more than nominal
    whole = report["parameters"]["whole_model"]
    assert 0 < whole["compression_ratio"] < fac["compression_ratio"]  # embeddings and head are kept
    assert whole["params_before"] - whole["params_after"] == fac["weight_params_before"] - fac["weight_params_after"]
    drift = [r["rel_error"] for r in report["drift"]]
    assert drift[0] > 0 and all(0 < r["cosine"] <= 1 for r in report["drift"])
    assert len(report["modules"]) == 14 and all(r["stage"] == "saes_svd" for r in report["modules"])
    assert set(report["metrics"]["after"]) == {"held_out_loss", "held_out_perplexity"}
    files = {p.name for p in (tmp_path / "out").iterdir()}
    assert files == {"model.safetensors", "config.json", "report.json", "report.md"}
    assert json.loads((tmp_path / "out" / "report.json").read_text())["calibration"]["sha256"] == micro_calibration.sha256
    assert "compression_ratio" in (tmp_path / "out" / "report.md").read_text()
    reloaded, config = load_compressed(tmp_path / "out")
    assert len(config["factorized"]) == 14
    x = micro_blocks[:2, :-1]
    with torch.no_grad():
        torch.testing.assert_close(reloaded(input_ids=x).logits, model(input_ids=x).logits)
    assert parameter_report(count_params(micro_lm), reloaded)["factorised_layers"] == fac
