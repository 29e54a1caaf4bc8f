"""`veil train forecast` in-process: a CSV file -> a checkpoint that loads back to the same forecaster."""

from __future__ import annotations

import json

import numpy as np
import pytest
from veil.training.forecast import load_csv, load_forecaster, make_splits

from veil.cli import main


@pytest.fixture(scope="module")
def csv_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("forecast") / "two.csv"
    t = np.arange(300)
    rng = np.random.default_rng(0)
    lines = ["date,a,b"] + [f"2020-01-01 {i:04d},{np.sin(t_ / 6) + 0.1 * rng.normal():.6f},{2 + np.cos(t_ / 11):.6f}"
                            for i, t_ in enumerate(t)]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("fit", ["ols", "rrr", "dwrr", "rootpurge"])
def test_train_forecast_writes_a_checkpoint(csv_file, tmp_path, capsys, fit: str) -> None:
    out = tmp_path / fit
    extra = ["--steps", "30", "--batch-size", "0"] if fit == "rootpurge" else []
    assert main(["train", "forecast", "--data", str(csv_file), "--lookback", "12", "--horizon", "3", "--fit", fit,
                 "--out", str(out), "--no-progress", "--roots-png", str(tmp_path / "roots.png"), *extra]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["checkpoint"] == str(out) and summary["test_mse"] < 1.0
    assert (tmp_path / "roots.png").read_bytes()[:4] == b"\x89PNG"
    forecaster, config = load_forecaster(out)
    assert config["fit"]["fit"] == fit and config["series"]["channels"] == ["a", "b"]
    splits = make_splits(load_csv(csv_file), 12, 3)
    mse = float(((forecaster.predict(splits.test.x) - splits.test.y) ** 2).mean())
    assert mse == pytest.approx(summary["test_mse"], rel=1e-9)  # the saved weights are the evaluated ones
    assert len(json.loads((out / "metrics.json").read_text())["test_per_horizon"]["mse"]) == 3


def test_bad_arguments_exit_2_naming_the_field(csv_file, capsys) -> None:
    assert main(["train", "forecast", "--data", str(csv_file), "--fit", "lasso"]) == 2
    assert main(["train", "forecast", "--data", str(csv_file), "--lookback", "0"]) == 2
    assert "ForecastModelConfig.lookback: expected >= 1, received 0" in capsys.readouterr().err
    assert main(["train", "forecast", "--help"]) == 0
    assert "veil train forecast --data" in capsys.readouterr().out
