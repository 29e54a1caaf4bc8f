"""veil.training.forecast: linear forecasters with characteristic-root control (OLS, RRR, DWRR, Root Purge).

    series = load_csv("ETTh1.csv")                        # or load_bundled("co2"), synthetic_series()
    result = train_forecaster(series, ForecastModelConfig(lookback=96, horizon=24), ForecastFitConfig(fit="rrr"))
    result.metrics["test_mse"], characteristic_roots(result.forecaster)
    save_forecaster(result, "runs/forecast")              # `veil export forecast runs/forecast --repo models`

Paper: Characteristic Root Analysis and Regularization for Linear Time Series Forecasting (ICLR 2026,
arXiv 2509.23597); spec shared/specs/other_seeds.md §3. The torch trainer (Root Purge) loads on first use.
"""

from .config import FITS, SPLITS, ForecastDataConfig, ForecastFitConfig, ForecastModelConfig
from .data import (
           BUNDLED,
           Series,
           Splits,
           Standardizer,
           Windows,
           load_bundled,
           load_csv,
           make_splits,
           synthetic_series,
           windows,
)
from .diagnostics import (
           characteristic_roots,
           per_horizon_error,
           plot_roots,
           predictor_polynomial,
           root_counts,
)
from .linear import LinearForecaster, NotAffineError, fit_closed_form
from .trainer import ForecastResult, evaluate, fit, load_forecaster, save_forecaster, train_forecaster

__all__ = ["BUNDLED", "FITS", "SPLITS", "ForecastDataConfig", "ForecastFitConfig", "ForecastModelConfig",
           "ForecastResult", "LinearForecaster", "NotAffineError", "Series", "Splits", "Standardizer", "Windows",
           "characteristic_roots", "evaluate", "fit", "fit_closed_form", "load_bundled", "load_csv",
           "load_forecaster", "make_splits", "per_horizon_error", "plot_roots", "predictor_polynomial",
           "root_counts", "save_forecaster", "synthetic_series", "train_forecaster", "windows"]
