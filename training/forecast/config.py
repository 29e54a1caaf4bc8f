"""Configs of the linear forecasters (`veil train forecast`): the model, how it is fitted, the data.

The paper-vs-official-code differences are named options (docs/forecast.md lists them):

- ``rank_grid``: "all" (every rank 1..min(D_in, D_out), chosen on validation: veil's default) or "code"
  (``{6, 12, ..., H}`` as ``Rank_Reduction/run_RRR.py``).
- ``rp_scale``: "code" multiplies λ by ``max(L/H, 1)^order`` (``RootPurgeModel.forward_train``); "paper" uses λ.
- ``rp_target``: "zero" (the purge pushes G(residual) to 0) or "model_zero" (to G(0), the code's option).
- ``rp_init``: "default" (torch's nn.Linear initialisation, as the code) or "ols" (start from the OLS fit).

The Root Purge paper states the objective with G; the official code runs it on instance-normalised
windows with the *input* mean (targets minus the input mean too): that is ``instance_norm="mean"`` here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from veil.config import Config, ConfigError, field

Channels = Literal["shared", "individual", "mixed"]
InstanceNorm = Literal["none", "mean", "revin"]
Fit = Literal["ols", "rrr", "dwrr", "rootpurge"]
FITS: tuple[str, ...] = ("ols", "rrr", "dwrr", "rootpurge")
# the paper's chronological splits (train, val, test): ETT files use 60/20/20, the others 70/10/20
SPLITS: dict[str, tuple[float, float, float]] = {"70/10/20": (0.7, 0.1, 0.2), "60/20/20": (0.6, 0.2, 0.2)}


@dataclass
class ForecastModelConfig(Config):
    """A linear forecaster y = W x (+ b) from L past steps to H future steps of C channels."""

    lookback: int = field(96, "L: past steps the forecaster reads")
    horizon: int = field(24, "H: future steps it predicts")
    channels: Channels = field("shared", "shared: one W (L x H) for every channel (channel independence, the "
                                         "paper's default); individual: one W per channel (its Weather setting); "
                                         "mixed: one W (L*C x H*C) over all channels")
    instance_norm: InstanceNorm = field("mean", "none; mean: subtract each window's mean and add it back (the "
                                                "paper's instance norm); revin: also divide by the window's std")
    revin_eps: float = field(1e-5, "revin: variance floor added before the square root")
    revin_affine: bool = field(False, "revin: learnable per-channel scale and shift (rootpurge only; not affine "
                                      "overall, so not exportable to HE)")
    bias: bool = field(False, "learn an output bias b (the paper's models have none)")

    def validate(self) -> None:
        for name in ("lookback", "horizon"):
            if getattr(self, name) < 1:
                raise ConfigError(f"ForecastModelConfig.{name}: expected >= 1, received {getattr(self, name)}")
        if self.revin_eps <= 0:
            raise ConfigError(f"ForecastModelConfig.revin_eps: expected > 0, received {self.revin_eps}")
        if self.revin_affine and self.instance_norm != "revin":
            raise ConfigError(f"ForecastModelConfig.revin_affine: expected False unless instance_norm='revin', "
                              f"received True with instance_norm={self.instance_norm!r}")


@dataclass
class ForecastFitConfig(Config):
    """How W is fitted: closed forms (OLS, RRR, DWRR) or Root Purge (torch trainer or its fixed point)."""

    fit: Fit = field("ols", "ols | rrr (reduced-rank regression) | dwrr (SVD truncation of W) | rootpurge")
    rank: int | None = field(None, "rrr/dwrr: rank ρ (default: the rank with the lowest validation MSE)")
    rank_grid: Literal["all", "code"] = field("all", "ranks tried on validation: all 1..min(D_in, D_out); "
                                                     "code: 6, 12, ..., H (the official code's grid)")
    ridge: float = field(0.0, "Tikhonov term added to X^T X (0: plain least squares via lstsq)")
    rp_lambda: float = field(0.5, "rootpurge: λ, weight of the null-space (root-purging) penalty")
    rp_solver: Literal["torch", "fixed_point"] = field(
        "torch", "rootpurge: torch (the paper's SGD trainer) or fixed_point (W <- (X^T X + λ E^T E)^-1 X^T Y)")
    rp_order: int = field(1, "rootpurge: times G is applied to the residual (the code's purge_order)")
    rp_scale: Literal["code", "paper"] = field("code", "rootpurge: code multiplies λ by max(L/H, 1)^order; paper: λ")
    rp_target: Literal["zero", "model_zero"] = field("zero", "rootpurge: G(residual) is pushed to 0, or to G(0)")
    rp_init: Literal["default", "ols"] = field("default", "rootpurge torch: nn.Linear's init (the code) or OLS")
    steps: int = field(2000, "rootpurge torch: optimizer steps (the code: 5000)")
    lr: float = field(1e-3, "rootpurge torch: Adam learning rate (the code: 5e-4 real data, 1e-3 synthetic)")
    batch_size: int = field(128, "rootpurge torch: windows per step (0: full batch)")
    fixed_point_iters: int = field(100, "rootpurge fixed_point: most iterations")
    fixed_point_tol: float = field(1e-10, "rootpurge fixed_point: stop when the relative change of W is below")
    seed: int = field(0, "seed of initialisation, batches and the purge's random windows")

    def validate(self) -> None:
        if self.rank is not None and self.rank < 1:
            raise ConfigError(f"ForecastFitConfig.rank: expected >= 1 or None, received {self.rank}")
        for name in ("ridge", "rp_lambda", "batch_size"):
            if getattr(self, name) < 0:
                raise ConfigError(f"ForecastFitConfig.{name}: expected >= 0, received {getattr(self, name)}")
        for name in ("rp_order", "steps", "fixed_point_iters"):
            if getattr(self, name) < 1:
                raise ConfigError(f"ForecastFitConfig.{name}: expected >= 1, received {getattr(self, name)}")
        if self.lr <= 0:
            raise ConfigError(f"ForecastFitConfig.lr: expected > 0, received {self.lr}")
        if self.rp_solver == "fixed_point" and self.rp_order != 1:
            raise ConfigError(f"ForecastFitConfig.rp_order: the fixed point exists for order 1 only, received "
                              f"{self.rp_order} with rp_solver='fixed_point'")


@dataclass
class ForecastDataConfig(Config):
    """Chronological splits, train-only standardisation and sliding windows of a (T, C) series."""

    split: list[float] = field([0.7, 0.1, 0.2], "train/val/test fractions in time order (the paper: 0.7 0.1 0.2; "
                                                "ETT files 0.6 0.2 0.2)")
    standardize: bool = field(True, "z-score every channel with the train split's mean and std")
    context: bool = field(True, "val/test windows take their lookback from the split before (the ETT loaders' "
                                "borders), so every test step is forecast")
    stride: int = field(1, "steps between consecutive windows")

    def validate(self) -> None:
        if len(self.split) != 3 or min(self.split) < 0 or abs(sum(self.split) - 1.0) > 1e-9 or self.split[0] <= 0:
            raise ConfigError(f"ForecastDataConfig.split: expected three fractions (train > 0, val, test) summing "
                              f"to 1, received {self.split}")
        if self.stride < 1:
            raise ConfigError(f"ForecastDataConfig.stride: expected >= 1, received {self.stride}")
