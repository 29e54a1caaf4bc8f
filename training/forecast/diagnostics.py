"""What a forecaster's user looks at: characteristic roots, their unit-circle plot, the singular-value
spectrum of W, root counts inside / on / outside the unit circle, and error per horizon step.

The roots are those of the one-step predictor of the *whole* forecaster (instance norm folded in, raw
scale): for one channel with one-step weights w_0..w_{L-1} (w_i multiplies x_{t-L+1+i}),

    p(z) = z^L - Σ_i w_i z^i,

whose roots are the eigenvalues of its companion matrix; channel-mixing forecasters give the block
companion of the VAR(L) they define. Instance norm forces a root at z = 1 (the rows of W_eff sum to 1).
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np

from .linear import LinearForecaster


def one_step_weights(forecaster: LinearForecaster) -> list[np.ndarray]:
    """Per channel (shared, individual) the L one-step weights; mixed: the (L, C, C) lag matrices."""
    a, _ = forecaster.affine(check=False)
    lookback, c = forecaster.config.lookback, forecaster.n_channels
    a = a.reshape(lookback, c, -1, c)[:, :, 0, :]  # (L, C_in, C_out) at the first horizon step
    if forecaster.config.channels == "mixed":
        return [a]
    return [a[:, j, j] for j in range(c)]


def predictor_polynomial(w: np.ndarray) -> np.ndarray:
    """Coefficients (highest power first, for np.polyval) of p(z) = z^L - Σ_i w_i z^i."""
    return np.concatenate([[1.0], -np.asarray(w, dtype=np.float64)[::-1]])


def companion_roots(w: np.ndarray) -> np.ndarray:
    """Roots of the one-step predictor: eigenvalues of the (block) companion matrix of w ((L,) or (L, C, C))."""
    w = np.asarray(w, dtype=np.float64)
    if w.ndim == 1:
        w = w[:, None, None]
    lookback, c = w.shape[0], w.shape[1]
    comp = np.zeros((lookback * c, lookback * c))
    comp[: (lookback - 1) * c, c:] = np.eye((lookback - 1) * c)  # state (x_{t-L+1}, ..., x_t) shifts by one
    comp[(lookback - 1) * c:, :] = w.transpose(2, 0, 1).reshape(c, lookback * c)  # x_{t+1} = Σ_i w_i^T x_{t-L+1+i}
    return np.linalg.eigvals(comp)


def characteristic_roots(forecaster: LinearForecaster) -> list[np.ndarray]:
    """The roots per channel (one array for a shared W read on each channel, or for a mixed W)."""
    weights = one_step_weights(forecaster)
    if forecaster.config.channels == "shared":
        weights = weights[:1]  # every channel has the same predictor up to the standardiser, which cancels
    return [companion_roots(w) for w in weights]


def root_counts(roots: np.ndarray, tol: float = 1e-3) -> dict[str, int]:
    """How many roots lie inside, on (| |z| - 1 | <= tol) and outside the unit circle."""
    radius = np.abs(roots)
    return {"inside": int((radius < 1 - tol).sum()), "on": int((np.abs(radius - 1) <= tol).sum()),
            "outside": int((radius > 1 + tol).sum())}


def per_horizon_error(pred: np.ndarray, target: np.ndarray) -> dict[str, list[float]]:
    """MSE and MAE at each horizon step (mean over windows and channels)."""
    diff = np.asarray(pred) - np.asarray(target)
    return {"mse": (diff**2).mean(axis=(0, 2)).tolist(), "mae": np.abs(diff).mean(axis=(0, 2)).tolist()}


def summary(forecaster: LinearForecaster, relative: float = 0.01) -> dict[str, Any]:
    """Root counts, the largest root radius and the number of singular values above ``relative`` x the top."""
    roots = characteristic_roots(forecaster)
    singular = forecaster.singular_values()
    return {"roots": [root_counts(r) | {"max_radius": float(np.abs(r).max())} for r in roots],
            "singular_values_top": [s[:8].tolist() for s in singular],
            "singular_values_above": [int((s > relative * s[0]).sum()) for s in singular]}


def plot_roots(roots: list[np.ndarray] | np.ndarray, path: str | Path, title: str = "characteristic roots",
               labels: list[str] | None = None) -> Path:
    """Scatter the roots in the complex plane with the unit circle; writes a PNG (needs matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from veil.atomic import write_atomic

    sets = [roots] if isinstance(roots, np.ndarray) else list(roots)
    fig, ax = plt.subplots(figsize=(4.5, 4.5))
    t = np.linspace(0, 2 * np.pi, 400)
    ax.plot(np.cos(t), np.sin(t), color="0.6", lw=1)
    for k, r in enumerate(sets):
        ax.scatter(r.real, r.imag, s=9, alpha=0.7, label=(labels or [None] * len(sets))[k])
    ax.set_aspect("equal")
    ax.set_xlabel("Re z")
    ax.set_ylabel("Im z")
    ax.set_title(title)
    if labels:
        ax.legend(fontsize=7)
    path = Path(path)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=120, bbox_inches="tight")
    plt.close(fig)
    write_atomic(path, buffer.getvalue())
    return path
