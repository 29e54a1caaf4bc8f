"""The low-rank stages end to end on a briefly trained micro LM (spec §5.1 (b), CPU scale)."""

from __future__ import annotations

import copy

import pytest
import torch
from veil.training.compress.log import ModuleLog
from veil.training.compress.lowrank import STAGES, FactorizedLinear
from veil.training.compress.report import drift_table


def run(model, method: str, calibration, **options):
    model = copy.deepcopy(model)
    log = ModuleLog(progress=False)
    summary = STAGES[method].apply(model, STAGES[method].config_cls(**options), calibration, log)
    return model, summary, log


def test_first_group_matches_svd_llm(micro_lm, micro_calibration) -> None:
    """Block 0's q/k/v see uncompressed inputs (Δ = 0, H = H^f): SAES-SVD must equal SVD-LLM there."""
    saes, _, _ = run(micro_lm, "saes_svd", micro_calibration, ratio=0.4)
    llm, _, _ = run(micro_lm, "svd_llm", micro_calibration, ratio=0.4)
    for name in ("q_proj", "k_proj", "v_proj"):
        a = saes.model.layers[0].self_attn.get_submodule(name).dense_weight()
        b = llm.model.layers[0].self_attn.get_submodule(name).dense_weight()
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("method", ["svd", "svd_llm", "saes_svd"])
def test_every_block_linear_factorised(micro_lm, micro_calibration, method) -> None:
    model, summary, log = run(micro_lm, method, micro_calibration, ratio=0.2)
    factorised = [n for n, m in model.named_modules() if isinstance(m, FactorizedLinear)]
    assert len(factorised) == summary["modules"] == len(log.records) == 14
    assert not isinstance(model.lm_head, FactorizedLinear)
    assert summary["weight_params_after"] <= 0.8 * summary["weight_params_before"]
    assert all(r["error"] is not None and r["error"] >= 0 for r in log.records)


def test_saes_beats_plain_svd_and_logs_aces_check(micro_lm, micro_calibration) -> None:
    """The robust gate of spec §5.1 (b): SAES-SVD's last-block drift is below plain SVD's."""
    saes, summary, log = run(micro_lm, "saes_svd", micro_calibration, ratio=0.4, aces_check=True)
    svd, _, _ = run(micro_lm, "svd", micro_calibration, ratio=0.4)
    assert drift_table(micro_lm, saes, micro_calibration)[-1]["rel_error"] < \
        drift_table(micro_lm, svd, micro_calibration)[-1]["rel_error"]
    assert all(0.0 <= b <= 1.0 for b in summary["betas"].values())
    assert all(r["rho_exact"] >= r["rho"] - 1e-6 for r in log.records)


def test_targets_outside_blocks_refused(micro_lm, micro_calibration) -> None:
    with pytest.raises(ValueError, match="outside the repeated blocks"):
        run(micro_lm, "saes_svd", micro_calibration, targets=["lm_head", "q_proj"], ignore=[])
    model, summary, _ = run(micro_lm, "svd", micro_calibration, targets=["lm_head"], ignore=[])
    assert isinstance(model.lm_head, FactorizedLinear) and summary["modules"] == 1
