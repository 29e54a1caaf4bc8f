"""The learning-rate range check (issue 30.4): a finite curve over growing lrs, a stop on divergence, the
suggestions, the atomic JSON and the `veil train uldnet --lr-range` front."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from veil.training.uldnet import ModelConfig, TrainConfig, load_digits_preset
from veil.training.uldnet import lr_range as lr_range_module
from veil.training.uldnet.cli import main
from veil.training.uldnet.lr_range import geometric_lrs, lr_range_test, save_lr_range, suggest

TINY = TrainConfig(batch_size=32, seed=0)


@pytest.fixture(scope="module")
def digits():
    return load_digits_preset()


def _mlp(digits) -> ModelConfig:
    return ModelConfig(arch="mlp", input_shape=digits.input_shape, width=8, depth=1)


def test_curve_is_finite_over_growing_lrs_and_deterministic(digits) -> None:
    result = lr_range_test(_mlp(digits), TINY, digits, lr_min=1e-4, lr_max=1e-1, steps=12, progress=False)
    assert result.stopped == "completed" and len(result.lrs) == 12
    assert result.lrs[0] == pytest.approx(1e-4) and result.lrs[-1] == pytest.approx(1e-1)
    assert all(b > a for a, b in zip(result.lrs, result.lrs[1:], strict=False))
    assert all(math.isfinite(x) for x in result.losses + result.smoothed)
    assert result.max_stable_lr in result.lrs and result.suggested_lr == pytest.approx(result.max_stable_lr / 10)
    again = lr_range_test(_mlp(digits), TINY, digits, lr_min=1e-4, lr_max=1e-1, steps=12, progress=False)
    assert again.losses == result.losses  # one seed, one curve


def test_a_huge_max_lr_stops_on_divergence(digits) -> None:
    config = TrainConfig(batch_size=32, seed=0, grad_clip=0.0)
    result = lr_range_test(_mlp(digits), config, digits, lr_min=1e-3, lr_max=1e8, steps=40, progress=False)
    assert result.stopped in ("diverged", "not finite")
    assert len(result.lrs) < 40 and result.diverged_lr == result.lrs[-1]
    assert result.max_stable_lr is not None and result.max_stable_lr < result.diverged_lr
    assert "stopped" in result.table() and f"{result.diverged_lr:.3g}" in result.table()


def test_suggestions_of_a_known_curve() -> None:
    lrs = geometric_lrs(1e-5, 1.0, 50).tolist()
    x = np.log10(lrs)
    # flat, then the steepest fall around 1e-2, the minimum at 1e-1, then up
    curve = (2.0 - np.tanh((x + 2.0) * 2) + np.where(x > -1, 8 * (x + 1) ** 2, 0.0)).tolist()
    steepest, max_stable, suggested = suggest(lrs, curve)
    assert steepest == pytest.approx(1e-2, rel=0.3)
    assert max_stable == pytest.approx(1e-1, rel=0.3) and suggested == pytest.approx(max_stable / 10)
    assert suggest([1e-3], [math.nan]) == (None, None, None)
    with pytest.raises(ValueError, match="--lr-range-min/--lr-range-max: expected 0 < min < max"):
        geometric_lrs(1.0, 1e-3, 10)


def test_json_is_written_atomically_without_nan(digits, tmp_path, monkeypatch) -> None:
    result = lr_range_test(_mlp(digits), TrainConfig(batch_size=32, grad_clip=0.0), digits, lr_min=1e-3,
                           lr_max=1e8, steps=40, progress=False)
    atomic = []
    real = lr_range_module.write_atomic
    monkeypatch.setattr(lr_range_module, "write_atomic", lambda path, data, **kw: (atomic.append(path), real(path, data, **kw)))
    written = save_lr_range(result, tmp_path / "out", {"note": 1}, plot=False)
    assert atomic == [tmp_path / "out" / "lr_range.json"] and list(written) == ["json"]
    saved = json.loads((tmp_path / "out" / "lr_range.json").read_text())  # strict JSON: NaN became null
    assert saved["stopped"] == result.stopped and saved["note"] == 1 and len(saved["lrs"]) == len(result.lrs)
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["lr_range.json"]  # no temporaries left


def test_cli_lr_range_prints_the_table_and_writes_json(tmp_path, capsys) -> None:
    out = tmp_path / "lrr"
    assert main(["--preset", "digits", "--arch", "mlp", "--width", "8", "--lr-range", "--lr-range-steps", "8",
                 "--lr-range-min", "1e-4", "--lr-range-max", "1e-1", "--out", str(out), "--no-progress"]) == 0
    text = capsys.readouterr().out
    assert "lr range check: mlp" in text and "suggested lr" in text and "stable range" in text
    saved = json.loads((out / "lr_range.json").read_text())
    assert len(saved["lrs"]) == 8 and saved["model"]["arch"] == "mlp" and saved["data"]["source"] == "preset:digits"
    assert not (out / "model.safetensors").exists()  # a check, not a training run


def test_cli_help_shows_the_lr_range_example(capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    help_text = capsys.readouterr().out
    assert "--lr-range-steps" in help_text and "veil train uldnet --preset digits --arch cnn --lr-range" in help_text
