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
from .data import Series, Splits, make_splits, split_ranges
from .diagnostics import per_horizon_error, summary
from .linear import LinearForecaster, fit_closed_form, group_dims

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
        from veil.progress import progress as progress_bar

        bar = progress_bar(total=fit_config.fixed_point_iters, desc="root purge fixed point", leave=False)
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


def fit_memory_bytes(steps: int, n_channels: int, model: ForecastModelConfig, fit_config: ForecastFitConfig,
                     data: ForecastDataConfig) -> int:
    """About the peak memory of fitting (float64): the train and validation windows as design matrices (the
    instance-normalised copy and the group layout), one group's least-squares copies and the solver's
    D_in x (D_in + D_out) workspace, and for RRR the fitted values and their SVD."""
    window = model.lookback + model.horizon
    ranges = split_ranges(steps, model.lookback, data.split, data.context)
    count = {n: max(0, (end - start - window) // data.stride + 1) for n, (start, end) in ranges.items()}
    _, d_in, d_out = group_dims(model, n_channels)
    rows = count["train"] * (n_channels if model.channels == "shared" else 1)  # design rows of one group
    values = 2 * (count["train"] + count["val"]) * window * n_channels
    values += 2 * rows * (d_in + d_out) + 3 * d_in * (d_in + d_out)
    if fit_config.fit == "rrr":
        values += 3 * rows * d_out
    return int(1.3 * 8 * values)  # measured peaks were 0.6-1.0x this (shared, individual, mixed; OLS, RRR, DWRR)


def check_fit_memory(steps: int, n_channels: int, model: ForecastModelConfig, fit_config: ForecastFitConfig,
                     data: ForecastDataConfig, limit_bytes: int) -> None:
    """Refuse, before any array is built, a fit :func:`fit_memory_bytes` puts above ``limit_bytes`` (issue 31 item
    9: 5000 mixed channels allocated 12.5 GB before a traceback; lookback 4000 on 200 k rows grew to 15 GB).

    Raises:
        ValueError: naming the estimate, the sizes it comes from and the flags to change.
    """
    need = fit_memory_bytes(steps, n_channels, model, fit_config, data)
    if need > limit_bytes:
        _, d_in, d_out = group_dims(model, n_channels)
        raise ValueError(f"veil train forecast: fitting needs about {need / 2**30:.1f} GiB ({steps} rows x "
                         f"{n_channels} channels, --lookback {model.lookback} --horizon {model.horizon}, --channels "
                         f"{model.channels}: a {d_in} x {d_out} weight per group), expected at most "
                         f"{limit_bytes / 2**30:.1f} GiB (--max-memory-gb); lower --lookback, use --channels shared, "
                         "fewer --columns or rows, a larger --stride, or raise --max-memory-gb")


def default_memory_bytes() -> int:
    """Half the machine's physical memory (the default of ``--max-memory-gb``)."""
    import os

    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2
    except (ValueError, OSError, AttributeError):
        return 8 * 2**30


def train_forecaster(series: Series, model: ForecastModelConfig, fit_config: ForecastFitConfig,
                     data: ForecastDataConfig | None = None, progress: bool = False,
                     max_memory_bytes: int | None = None) -> ForecastResult:
    """Split, standardise, window, fit and evaluate: everything `veil train forecast` does before saving.

    ``max_memory_bytes`` (default: half the machine's memory) bounds :func:`fit_memory_bytes`, checked first."""
    data = data or ForecastDataConfig()
    check_fit_memory(len(series.values), len(series.channels), model, fit_config, data,
                     default_memory_bytes() if max_memory_bytes is None else max_memory_bytes)
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
