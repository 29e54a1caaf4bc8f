"""Diagnostics and metrics: OOD fraction (PriorGuide A.4), SIR ESS with Pareto k̂, and C2ST.

* OOD: t is the α-quantile of log p_train over draws of p_train, with α = 10/N_train; the OOD fraction is the
  share of θ ~ q with log p_train(θ) < t, and q is flagged when the fraction exceeds α.
* SIR: self-normalised importance weights w ∝ q(θ)/p_train(θ) on unguided posterior draws; ESS =
  (Σw)²/Σw², and k̂ is the generalized-Pareto shape of the largest weights (Zhang & Stephens 2009, as in
  PSIS, Vehtari et al. 2024); k̂ > 0.7 means the reweighted estimate is unreliable.
* C2ST: a random forest told apart the two sample sets under 5-fold cross-validation; features are z-scored
  with the first set's mean and *standard deviation* (the released PriorGuide code divides by the mean).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from .priors import Prior

_THRESHOLDS: dict[tuple[str, int], float] = {}


def ood_fraction(train: Prior, test: Prior, n_train: int, seed: int = 0, n_test: int = 20_000) -> dict[str, Any]:
    """Share of test-prior draws below the α-quantile of log p_train (α = 10/N_train), and whether it flags q."""
    alpha = 10.0 / n_train
    key = (train.hash(), n_train)
    if key not in _THRESHOLDS:
        n_ref = max(20_000, int(100 / alpha))  # at least 100 reference draws below the quantile
        ref = train.log_prob(train.sample(n_ref, torch.Generator().manual_seed(12345)))
        _THRESHOLDS[key] = float(torch.quantile(ref, alpha))
    threshold = _THRESHOLDS[key]
    draws = test.sample(n_test, torch.Generator().manual_seed(seed))
    fraction = float((train.log_prob(draws) < threshold).double().mean())
    return {"fraction": fraction, "alpha": alpha, "flagged": fraction > alpha}


def sir_weights(theta: torch.Tensor, train: Prior, test: Prior) -> torch.Tensor:
    """Log importance weights log q(θ) − log p_train(θ) of posterior draws θ [n, d] -> [n]."""
    return test.log_prob(theta) - train.log_prob(theta)


def ess(log_w: torch.Tensor) -> float:
    """Kish effective sample size of self-normalised weights."""
    log_w = log_w[torch.isfinite(log_w)]
    if log_w.numel() == 0:
        return 0.0
    return float(torch.exp(2 * torch.logsumexp(log_w, 0) - torch.logsumexp(2 * log_w, 0)))


def pareto_k(log_w: torch.Tensor) -> float:
    """PSIS k̂: the generalized-Pareto shape fitted to the largest min(n/5, 3√n) weights."""
    lw = np.sort(log_w[torch.isfinite(log_w)].cpu().numpy().astype(np.float64))
    n = lw.size
    tail = math.ceil(min(0.2 * n, 3 * math.sqrt(n)))
    if n < 10 or tail < 5:
        return math.inf
    lw = lw - lw[-1]
    exceed = np.exp(lw[-tail:]) - np.exp(lw[-tail - 1])
    exceed = exceed[exceed > 0]
    if exceed.size < 5:
        return math.inf  # ties at the top: a degenerate tail
    return _gpd_shape(exceed)


def _gpd_shape(x: np.ndarray) -> float:
    """Zhang & Stephens (2009) profile-posterior estimate of the generalized-Pareto shape, with the PSIS prior."""
    n = x.size
    m = 30 + int(math.sqrt(n))
    b = 1 - np.sqrt(m / (np.arange(1, m + 1) - 0.5))
    b = b / (3 * x[int(n / 4 + 0.5) - 1]) + 1 / x[-1]
    k = np.log1p(-b[:, None] * x).mean(1)
    log_lik = n * (np.log(-(b / k)) - k - 1)
    w = np.exp(log_lik - log_lik.max())  # the profile posterior weights, a stable softmax
    w = w / w.sum()
    k_post = np.log1p(-(b * w).sum() * x).mean()
    return float((n * k_post + 10 * 0.5) / (n + 10))


def sir_report(theta: torch.Tensor, train: Prior, test: Prior) -> dict[str, Any]:
    """ESS, its fraction of the draws and k̂ of reweighting unguided draws θ to the test prior."""
    log_w = sir_weights(theta, train, test)
    value, k = ess(log_w), pareto_k(log_w)
    return {"draws": int(theta.shape[0]), "ess": round(value, 2), "ess_fraction": round(value / theta.shape[0], 5),
            "pareto_k": round(k, 3) if math.isfinite(k) else None, "reliable": bool(math.isfinite(k) and k <= 0.7)}


def sir_resample(theta: torch.Tensor, train: Prior, test: Prior, n: int, seed: int = 0) -> torch.Tensor:
    """Sampling-importance-resampling: ``n`` draws (with replacement) from θ with weights q/p_train."""
    log_w = sir_weights(theta, train, test)
    probs = torch.softmax(torch.nan_to_num(log_w, neginf=-1e300), 0)
    idx = torch.multinomial(probs, n, replacement=True, generator=torch.Generator().manual_seed(seed))
    return theta[idx]


def c2st(a: torch.Tensor | np.ndarray, b: torch.Tensor | np.ndarray, seed: int = 0, folds: int = 5,
         trees: int = 100) -> float:
    """Classifier two-sample test accuracy (0.5: indistinguishable, 1.0: disjoint) with a random forest."""
    from sklearn.ensemble import RandomForestClassifier
    from sklearn.model_selection import StratifiedKFold, cross_val_score

    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    n = min(len(a), len(b))
    a, b = a[:n], b[:n]
    mean, std = a.mean(0), a.std(0) + 1e-12
    data = (np.concatenate([a, b]) - mean) / std
    labels = np.concatenate([np.zeros(n), np.ones(n)])
    clf = RandomForestClassifier(n_estimators=trees, random_state=seed, n_jobs=1)
    cv = StratifiedKFold(n_splits=folds, shuffle=True, random_state=seed)
    return float(cross_val_score(clf, data, labels, cv=cv, scoring="accuracy").mean())
