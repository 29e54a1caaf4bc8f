"""The linear forecaster and its closed-form fits: OLS, RRR, DWRR and the Root Purge fixed point (numpy).

Characteristic Root Analysis and Regularization for Linear Time Series Forecasting (Wang et al., ICLR
2026, arXiv 2509.23597; spec: shared/specs/other_seeds.md §3). With windows X (N x L) and targets
Y (N x H) on the (instance-)normalised scale:

    OLS    W = (X^T X)^-1 X^T Y
    RRR    X W_OLS = U Σ V^T,   W = W_OLS V_ρ V_ρ^T        (Algorithm 1)
    DWRR   W_OLS = U Σ V^T,     W = U_ρ Σ_ρ V_ρ^T          (Algorithm 2)
    Root Purge fixed point   (X^T X + λ κ E~^T E~) W = X^T Y,  E = Y - X W embedded to length L (§3.4)

Layout: the weights are ``(G, D_in, D_out)`` groups. ``shared``: G = 1, D = (L, H), every channel's windows
are rows; ``individual``: G = C, one W per channel; ``mixed``: G = 1, D = (L*C, H*C) over flattened
(step, channel) features.

Example:
    >>> f = fit_closed_form(splits, ForecastModelConfig(lookback=96, horizon=24), ForecastFitConfig(fit="rrr"))
    >>> f.predict(splits.test.x).shape          # (N, 24, C)
    >>> A, c = f.affine()                         # raw-scale y.flat = x.flat @ A + c, exact (instance norm folded)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .config import ForecastFitConfig, ForecastModelConfig


class NotAffineError(ValueError):
    """The forecaster is not one affine map of its input (RevIN with a bias or a learned affine)."""


# -- normalisation and layout -------------------------------------------------------------------------------
def instance_stats(x: np.ndarray, config: ForecastModelConfig) -> tuple[np.ndarray, np.ndarray]:
    """Per-window, per-channel mean and scale (B, 1, C) of x (B, L, C); scale 1 unless RevIN."""
    if config.instance_norm == "none":
        return np.zeros_like(x[:, :1]), np.ones_like(x[:, :1])
    mean = x.mean(axis=1, keepdims=True)
    if config.instance_norm == "mean":
        return mean, np.ones_like(mean)
    return mean, np.sqrt(x.var(axis=1, keepdims=True) + config.revin_eps)


def group_dims(config: ForecastModelConfig, n_channels: int) -> tuple[int, int, int]:
    """(G, D_in, D_out) of the weight for this layout."""
    lookback, horizon = config.lookback, config.horizon
    if config.channels == "shared":
        return 1, lookback, horizon
    if config.channels == "individual":
        return n_channels, lookback, horizon
    return 1, lookback * n_channels, horizon * n_channels


def to_groups(z: np.ndarray, channels: str) -> np.ndarray:
    """(B, T, C) -> (G, M, D) design rows per group."""
    b, t, c = z.shape
    if channels == "shared":
        return z.transpose(0, 2, 1).reshape(1, b * c, t)
    if channels == "individual":
        return z.transpose(2, 0, 1)
    return z.reshape(1, b, t * c)


def from_groups(g: np.ndarray, batch: int, steps: int, n_channels: int, channels: str) -> np.ndarray:
    """(G, M, D) -> (B, T, C), the inverse of :func:`to_groups`."""
    if channels == "shared":
        return g.reshape(batch, n_channels, steps).transpose(0, 2, 1)
    if channels == "individual":
        return g.transpose(1, 2, 0)
    return g.reshape(batch, steps, n_channels)


@dataclass
class LinearForecaster:
    """A fitted linear forecaster: weights per group, optional bias and RevIN affine, train standardiser.

    ``predict`` works on the standardised scale (what the metrics use); ``predict_raw`` and ``affine`` on the
    series' own scale (what export serves).
    """

    config: ForecastModelConfig
    weight: np.ndarray  # (G, D_in, D_out)
    bias: np.ndarray  # (G, D_out)
    mean: np.ndarray  # (C,) train-split standardiser
    std: np.ndarray  # (C,)
    gamma: np.ndarray | None = None  # (C,) RevIN affine scale
    beta: np.ndarray | None = None  # (C,) RevIN affine shift
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def n_channels(self) -> int:
        return len(self.mean)

    def _check(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=np.float64)
        want = (self.config.lookback, self.n_channels)
        if x.ndim != 3 or x.shape[1:] != want:
            raise ValueError(f"x: expected shape (batch, {want[0]}, {want[1]}) = (batch, lookback, channels), "
                             f"received {x.shape}")
        return x

    def predict(self, x: np.ndarray) -> np.ndarray:
        """Standardised windows x (B, L, C) -> forecasts (B, H, C)."""
        x = self._check(x)
        mean, scale = instance_stats(x, self.config)
        z = (x - mean) / scale
        if self.gamma is not None:
            z = z * self.gamma + self.beta
        out = to_groups(z, self.config.channels) @ self.weight + self.bias[:, None, :]
        y = from_groups(out, len(x), self.config.horizon, self.n_channels, self.config.channels)
        if self.gamma is not None:
            y = (y - self.beta) / self.gamma
        return y * scale + mean

    def predict_raw(self, x: np.ndarray) -> np.ndarray:
        """Windows on the series' own scale -> forecasts on that scale (standardiser applied and undone)."""
        return self.predict((self._check(x) - self.mean) / self.std) * self.std + self.mean

    def affine(self, check: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """The whole forecaster (standardiser, instance norm, W, b) as y.flat = x.flat @ A + c on the raw scale.

        A (L*C, H*C) and c (H*C) are read off the unit inputs (rows f(e_i) - f(0)). With ``check``, a random
        input must reproduce ``predict_raw`` to 1e-9 relative, else NotAffineError says why: RevIN's division
        by the window's std cancels for a channel-independent, bias-free W without learned affine, not otherwise.
        """
        features = self.config.lookback * self.n_channels
        zero = self.predict_raw(np.zeros((1, self.config.lookback, self.n_channels)))
        basis = np.eye(features).reshape(features, self.config.lookback, self.n_channels)
        c = zero.reshape(-1)
        a = self.predict_raw(basis).reshape(features, -1) - c
        if check:
            rng = np.random.default_rng(0)
            x = self.mean + self.std * rng.normal(size=(4, self.config.lookback, self.n_channels)) * 3
            want = self.predict_raw(x).reshape(4, -1)
            got = x.reshape(4, -1) @ a + c
            if np.abs(got - want).max() > 1e-9 * (1 + np.abs(want).max()):
                raise NotAffineError(
                    f"forecaster (instance_norm={self.config.instance_norm!r}, channels={self.config.channels!r}, "
                    f"bias={self.config.bias}, revin_affine={self.config.revin_affine}) is not affine in its input: "
                    f"RevIN's std division only cancels for a channel-independent (shared or individual), bias-free "
                    f"W without learned affine; normalise on the client or fit with instance_norm='mean' "
                    f"(max deviation {np.abs(got - want).max():.3g})")
        return a, c

    def core(self, z: np.ndarray) -> np.ndarray:
        """The server's part under client-side normalisation: instance-normalised windows z (B, L, C) ->
        normalised forecasts (B, H, C) (RevIN affine, W and b; affine in z for every configuration)."""
        if self.gamma is not None:
            z = z * self.gamma + self.beta
        out = to_groups(z, self.config.channels) @ self.weight + self.bias[:, None, :]
        y = from_groups(out, len(z), self.config.horizon, self.n_channels, self.config.channels)
        return (y - self.beta) / self.gamma if self.gamma is not None else y

    def normalise(self, x: np.ndarray) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray]]:
        """Client side: raw windows -> (instance-normalised windows, the window statistics to undo it with)."""
        z = (self._check(x) - self.mean) / self.std
        mean, scale = instance_stats(z, self.config)
        return (z - mean) / scale, (mean, scale)

    def denormalise(self, y: np.ndarray, stats: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
        """Client side: normalised forecasts and the window statistics -> forecasts on the raw scale."""
        return (y * stats[1] + stats[0]) * self.std + self.mean

    def core_affine(self) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`core` as z.flat @ A + c (what the HE export compiles with client-side normalisation)."""
        features = self.config.lookback * self.n_channels
        c = self.core(np.zeros((1, self.config.lookback, self.n_channels))).reshape(-1)
        basis = np.eye(features).reshape(features, self.config.lookback, self.n_channels)
        return self.core(basis).reshape(features, -1) - c, c

    def singular_values(self) -> list[np.ndarray]:
        """Singular values of each group's W (descending)."""
        return [np.linalg.svd(w, compute_uv=False) for w in self.weight]

    def to_state(self) -> dict[str, np.ndarray]:
        state = {"weight": self.weight, "bias": self.bias, "mean": self.mean, "std": self.std}
        if self.gamma is not None:
            state |= {"gamma": self.gamma, "beta": self.beta}
        return state

    @classmethod
    def from_state(cls, config: ForecastModelConfig, state: dict[str, np.ndarray], info: dict[str, Any] | None = None
                   ) -> LinearForecaster:
        arrays = {k: np.asarray(v, dtype=np.float64) for k, v in state.items()}
        return cls(config, arrays["weight"], arrays["bias"], arrays["mean"], arrays["std"],
                   arrays.get("gamma"), arrays.get("beta"), dict(info or {}))


# -- design matrices ----------------------------------------------------------------------------------------
def design(x: np.ndarray, y: np.ndarray, config: ForecastModelConfig) -> tuple[np.ndarray, np.ndarray]:
    """Instance-normalised windows as group design matrices: X (G, M, D_in), Y (G, M, D_out)."""
    mean, scale = instance_stats(x, config)
    return to_groups((x - mean) / scale, config.channels), to_groups((y - mean) / scale, config.channels)


def _augment(x: np.ndarray, bias: bool) -> np.ndarray:
    return np.concatenate([x, np.ones((len(x), 1))], axis=1) if bias else x


def ols(x: np.ndarray, y: np.ndarray, ridge: float = 0.0, bias: bool = False) -> np.ndarray:
    """Least squares W (D_in [+1], D_out) of y ~ x (with a last bias row when ``bias``)."""
    xa = _augment(x, bias)
    if ridge == 0.0:
        return np.linalg.lstsq(xa, y, rcond=None)[0]
    gram = xa.T @ xa + ridge * len(xa) * np.eye(xa.shape[1])
    return np.linalg.solve(gram, xa.T @ y)


def rank_grid(config: ForecastFitConfig, horizon: int, most: int) -> list[int]:
    """Ranks tried on validation (or the one given)."""
    if config.rank is not None:
        if config.rank > most:
            raise ValueError(f"ForecastFitConfig.rank: expected <= min(D_in, D_out) = {most}, received {config.rank}")
        return [config.rank]
    if config.rank_grid == "code":
        grid = [r for r in range(6, horizon + 1, 6) if r <= most]
        return grid or [min(most, horizon)]
    return list(range(1, most + 1))


def _curve(target: np.ndarray, q: np.ndarray, v: np.ndarray) -> np.ndarray:
    """||target - Σ_{i<=ρ} q_i v_i^T||² for every ρ, for orthonormal columns v (closed form, no loop)."""
    cross = ((target @ v) * q).sum(axis=0)
    return (target**2).sum() - 2 * np.cumsum(cross) + np.cumsum((q**2).sum(axis=0))


def rrr(x: np.ndarray, y: np.ndarray, xv: np.ndarray, yv: np.ndarray, fit: ForecastFitConfig, horizon: int,
        bias: bool) -> tuple[np.ndarray, dict[str, Any]]:
    """Reduced-rank regression: W_OLS projected on the top ρ right singular vectors of the fitted values."""
    w = ols(x, y, fit.ridge, bias)
    _, _, vt = np.linalg.svd(_augment(x, bias) @ w, full_matrices=False)
    v = vt.T
    grid = rank_grid(fit, horizon, v.shape[1])
    val = _curve(yv, _augment(xv, bias) @ w @ v, v) / yv.size
    rank = grid[int(np.argmin(val[np.array(grid) - 1]))]
    return w @ v[:, :rank] @ v[:, :rank].T, {"rank": rank, "val_mse_by_rank": {r: float(val[r - 1]) for r in grid}}


def dwrr(x: np.ndarray, y: np.ndarray, xv: np.ndarray, yv: np.ndarray, fit: ForecastFitConfig, horizon: int,
         bias: bool) -> tuple[np.ndarray, dict[str, Any]]:
    """Direct weight rank reduction: the SVD truncation of W_OLS (its bias row, if any, kept)."""
    w = ols(x, y, fit.ridge, bias)
    core = w[:-1] if bias else w
    u, s, vt = np.linalg.svd(core, full_matrices=False)
    grid = rank_grid(fit, horizon, len(s))
    b = w[-1] if bias else np.zeros(w.shape[1])
    val = _curve(yv - b, (xv @ u) * s, vt.T) / yv.size
    rank = grid[int(np.argmin(val[np.array(grid) - 1]))]
    out = (u[:, :rank] * s[:rank]) @ vt[:rank]
    out = np.vstack([out, b]) if bias else out
    return out, {"rank": rank, "val_mse_by_rank": {r: float(val[r - 1]) for r in grid}}


def purge_scale(fit: ForecastFitConfig, lookback: int, horizon: int) -> float:
    """λ times the code's ``max(L/H, 1)^order`` factor (``rp_scale="code"``), or λ (``"paper"``)."""
    factor = max(lookback / horizon, 1.0) ** fit.rp_order if fit.rp_scale == "code" else 1.0
    return fit.rp_lambda * factor


def embedded_gram(e: np.ndarray, lookback: int, horizon: int, width: int, target: str, bias: bool) -> np.ndarray:
    """E[Ẽ^T Ẽ] of the residuals e (M, H*width) embedded to length L as the code does: for L > H at a uniformly
    random offset in 0..L-H (its zero-pad-and-unfold), for L < H truncated to the first L steps.

    With ``bias`` the design carries a ones column: the purge term is ||Ẽ W + b||² ("zero" target, cross terms
    kept) or ||Ẽ W||² ("model_zero": G(r) - G(0)).
    """
    d_in = lookback * width
    gram = np.zeros((d_in, d_in))
    sums = np.zeros(d_in)
    if lookback >= horizon:
        full, total = e.T @ e, e.sum(axis=0)
        offsets = range(lookback - horizon + 1)
        for o in offsets:
            gram[o * width:(o + horizon) * width, o * width:(o + horizon) * width] += full
            sums[o * width:(o + horizon) * width] += total
        gram, sums = gram / len(offsets), sums / len(offsets)
    else:
        cut = e[:, :d_in]
        gram, sums = cut.T @ cut, cut.sum(axis=0)
    if not bias:
        return gram
    out = np.zeros((d_in + 1, d_in + 1))
    out[:d_in, :d_in] = gram
    if target == "zero":
        out[:d_in, d_in] = out[d_in, :d_in] = sums
        out[d_in, d_in] = len(e)
    return out


def root_purge_fixed_point(x: np.ndarray, y: np.ndarray, fit: ForecastFitConfig, model: ForecastModelConfig,
                           width: int, progress: Any = None) -> tuple[np.ndarray, dict[str, Any]]:
    """Iterate W <- (X^T X + λκ E[Ẽ^T Ẽ])^-1 X^T Y with E = Y - X W from W_OLS (the detached-gradient
    stationarity condition of the Root Purge loss, §3.4); returns W and the iteration count."""
    xa = _augment(x, model.bias)
    gram, rhs = xa.T @ xa, xa.T @ y
    if fit.ridge:
        gram = gram + fit.ridge * len(xa) * np.eye(len(gram))
    kappa = purge_scale(fit, model.lookback, model.horizon)
    w = np.linalg.lstsq(xa, y, rcond=None)[0] if not fit.ridge else np.linalg.solve(gram, rhs)
    change, iterations = float("inf"), 0
    while iterations < fit.fixed_point_iters:
        iterations += 1
        e = y - xa @ w
        penalty = embedded_gram(e, model.lookback, model.horizon, width, fit.rp_target, model.bias)
        new = np.linalg.solve(gram + kappa * penalty, rhs)
        change = float(np.linalg.norm(new - w) / max(np.linalg.norm(new), 1e-300))
        w = new
        if progress is not None:
            progress.update(1)
        if change < fit.fixed_point_tol:
            break
    return w, {"iterations": iterations, "last_change": change}


def fit_closed_form(x: np.ndarray, y: np.ndarray, xv: np.ndarray, yv: np.ndarray, model: ForecastModelConfig,
                    fit: ForecastFitConfig, mean: np.ndarray, std: np.ndarray, progress: Any = None) -> LinearForecaster:
    """Fit OLS / RRR / DWRR / the Root Purge fixed point on standardised windows (train x, y; val xv, yv)."""
    n_channels = x.shape[2]
    gx, gy = design(x, y, model)
    vx, vy = design(xv, yv, model)
    width = n_channels if model.channels == "mixed" else 1
    weights, biases, infos = [], [], []
    for g in range(len(gx)):
        if fit.fit == "ols":
            w, info = ols(gx[g], gy[g], fit.ridge, model.bias), {}
        elif fit.fit == "rrr":
            w, info = rrr(gx[g], gy[g], vx[g], vy[g], fit, model.horizon, model.bias)
        elif fit.fit == "dwrr":
            w, info = dwrr(gx[g], gy[g], vx[g], vy[g], fit, model.horizon, model.bias)
        elif fit.fit == "rootpurge" and fit.rp_solver == "fixed_point":
            w, info = root_purge_fixed_point(gx[g], gy[g], fit, model, width, progress)
        else:
            raise ValueError(f"fit_closed_form: fit {fit.fit!r} with rp_solver {fit.rp_solver!r} is the torch "
                             f"trainer (veil.training.forecast.rootpurge.train_root_purge)")
        weights.append(w[:-1] if model.bias else w)
        biases.append(w[-1] if model.bias else np.zeros(w.shape[1]))
        infos.append(info)
    info: dict[str, Any] = {"fit": fit.fit}
    if fit.fit in ("rrr", "dwrr"):
        info["rank"] = [i["rank"] for i in infos]
        info["val_mse_by_rank"] = [i["val_mse_by_rank"] for i in infos]
    if fit.fit == "rootpurge":
        info["iterations"] = [i["iterations"] for i in infos]
    return LinearForecaster(model, np.stack(weights), np.stack(biases), np.asarray(mean, float),
                            np.asarray(std, float), info=info)
