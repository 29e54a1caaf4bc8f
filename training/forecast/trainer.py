"""Fit a linear forecaster on a series' splits, report its metrics, save and load its checkpoint.

Checkpoint (training/checkpoint.py): ``config.json`` {"kind": "forecast", "model", "fit", "data", "series"},
``model.safetensors`` (weight, bias, the train standardiser, RevIN affine if any; float64) and
``metrics.json`` (val/test MSE and MAE on the standardised scale, per-horizon test error, ranks, roots).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .config import ForecastDataConfig, ForecastFitConfig, ForecastModelConfig
from .data import Series, Splits, make_splits
from .diagnostics import per_horizon_error, summary
from .linear import LinearForecaster, fit_closed_form

KIND = "forecast"


@dataclass
class ForecastResult:
    """A fitted forecaster with the configs it came from and its metrics."""

    forecaster: LinearForecaster
    model: ForecastModelConfig
    fit: ForecastFitConfig
    data: ForecastDataConfig
    metrics: dict[str, Any]
    series: dict[str, Any]


def fit(splits: Splits, model: ForecastModelConfig, fit_config: ForecastFitConfig, progress: bool = False
        ) -> LinearForecaster:
    """Fit ``fit_config.fit`` on the train windows (validation picks the rank of RRR / DWRR)."""
    mean, std = splits.scaler.mean, splits.scaler.std
    if fit_config.fit == "rootpurge" and fit_config.rp_solver == "torch":
        from .rootpurge import train_root_purge

        return train_root_purge(splits.train.x, splits.train.y, model, fit_config, mean, std, progress)
    bar = None
    if progress and fit_config.fit == "rootpurge":
        from tqdm.auto import tqdm

        bar = tqdm(total=fit_config.fixed_point_iters, desc="root purge fixed point", leave=False)
    try:
        return fit_closed_form(splits.train.x, splits.train.y, splits.val.x, splits.val.y, model, fit_config,
                               mean, std, bar)
    finally:
        if bar is not None:
            bar.close()


def evaluate(forecaster: LinearForecaster, splits: Splits) -> dict[str, Any]:
    """MSE / MAE on val and test (standardised scale), per-horizon test error, ranks and root diagnostics."""
    out: dict[str, Any] = {}
    for name in ("val", "test"):
        part = getattr(splits, name)
        pred = forecaster.predict(part.x)
        out[f"{name}_mse"] = float(((pred - part.y) ** 2).mean())
        out[f"{name}_mae"] = float(np.abs(pred - part.y).mean())
        if name == "test":
            out["test_per_horizon"] = per_horizon_error(pred, part.y)
    out["windows"] = {n: len(getattr(splits, n).x) for n in ("train", "val", "test")}
    out |= {k: v for k, v in forecaster.info.items() if k in ("rank", "iterations", "final_loss")}
    return out | summary(forecaster)


def train_forecaster(series: Series, model: ForecastModelConfig, fit_config: ForecastFitConfig,
                     data: ForecastDataConfig | None = None, progress: bool = False) -> ForecastResult:
    """Split, standardise, window, fit and evaluate: everything `veil train forecast` does before saving."""
    data = data or ForecastDataConfig()
    splits = make_splits(series, model.lookback, model.horizon, data)
    forecaster = fit(splits, model, fit_config, progress)
    info = {"name": series.name, "channels": series.channels, "steps": len(series.values), "ranges": splits.ranges}
    return ForecastResult(forecaster, model, fit_config, data, evaluate(forecaster, splits), info)


def save_forecaster(result: ForecastResult, out: str | Path) -> Path:
    """Write the checkpoint folder atomically."""
    import torch
    from veil.training.checkpoint import save_checkpoint

    config = {"kind": KIND, "model": result.model.to_dict(), "fit": result.fit.to_dict(),
              "data": result.data.to_dict(), "series": result.series}
    state = {k: torch.from_numpy(np.ascontiguousarray(v, dtype=np.float64)) for k, v in result.forecaster.to_state().items()}
    return save_checkpoint(out, config, state, result.metrics)


def load_forecaster(path: str | Path) -> tuple[LinearForecaster, dict[str, Any]]:
    """(forecaster, config.json) of a `veil train forecast` checkpoint; refuses another kind by name."""
    from veil.training.checkpoint import load_checkpoint

    config, state, _ = load_checkpoint(path)
    if config.get("kind") != KIND:
        raise ValueError(f"checkpoint {str(path)!r}: kind expected {KIND!r} (veil train forecast), received "
                         f"{config.get('kind')!r}")
    model = ForecastModelConfig.from_dict(config["model"])
    return LinearForecaster.from_state(model, {k: v.numpy() for k, v in state.items()}, {"fit": config["fit"]["fit"]}), config
