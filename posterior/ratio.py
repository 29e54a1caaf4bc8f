"""The prior ratio r(θ) = q(θ)/p_train(θ) as a Gaussian mixture (PriorGuide Eq. 13).

``prior_ratio(train, test)`` picks, in order:

* ``identity``: q = p_train, so r is constant and there is no guidance at all;
* ``uniform-shortcut``: p_train uniform and q a Gaussian (mixture): r ∝ q inside the box, used as is (the
  paper's shortcut; mass of q outside the box is reported by the OOD diagnostic);
* ``closed-form``: p_train Gaussian and every component of q narrower (Σ_k⁻¹ − Σ_p⁻¹ ≻ 0): each
  π_k N(μ_k, Σ_k)/N(μ_p, Σ_p) is exactly a scaled Gaussian, so r is an exact K-component mixture;
* ``fit``: otherwise (or when asked): a K-component mixture fitted to log r by the weighted log-L2 objective
  of the released code, Σ_k π_k E_{θ~N_k}[(log r̂(θ) − log r(θ))²] (reparameterised draws), plus the same
  squared error at draws of q (the released objective alone can drop a mode of q entirely), with a fitted
  log-normaliser, standard deviations through softplus(·) + 1e-3 everywhere (the released code fits with
  softplus but exports exp: fixed here), several restarts (the best kept) and an LRU cache keyed by
  (train hash, test hash, K, covariance, seed, steps).

Weights are positive (softmax); subtractive mixtures are not fitted.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass
from typing import Literal

import torch

from .priors import DTYPE, Gaussian, Prior, Uniform, gaussian_components, gaussian_log_prob

RatioMethod = Literal["auto", "fit"]


class RatioError(ValueError):
    """The ratio of these two priors cannot be represented (e.g. a uniform test prior)."""


@dataclass
class GaussianMixtureRatio:
    """r̂(θ) = Σ_k exp(log_weights_k) N(θ; means_k, covs_k); K = 0 means a constant ratio (no guidance)."""

    log_weights: torch.Tensor  # [K] unnormalised (the log-normaliser is folded in)
    means: torch.Tensor  # [K, d]
    covs: torch.Tensor  # [K, d, d]
    method: str
    fit_error: float = 0.0
    cache_hit: bool = False

    @property
    def k(self) -> int:
        return int(self.log_weights.numel())

    def log_prob(self, theta: torch.Tensor) -> torch.Tensor:
        """log r̂(θ) for θ [n, d] -> [n]."""
        chol = torch.linalg.cholesky(self.covs)  # [K, d, d]
        parts = gaussian_log_prob(theta.unsqueeze(1), self.means, chol)  # [n, K]
        return torch.logsumexp(parts + self.log_weights, -1)

    def describe(self) -> dict[str, object]:
        return {"method": self.method, "K": self.k, "fit_error": round(self.fit_error, 6), "cache_hit": self.cache_hit}


def identity_ratio(dim: int) -> GaussianMixtureRatio:
    empty = torch.zeros(0, dtype=DTYPE)
    return GaussianMixtureRatio(empty, empty.reshape(0, dim), empty.reshape(0, dim, dim), "identity")


def closed_form_ratio(train: Gaussian, test: Prior) -> GaussianMixtureRatio | None:
    """The exact mixture r when p_train is Gaussian and every Gaussian component of q is narrower; else None."""
    parts = gaussian_components(test)
    if parts is None:
        return None
    weights, comps = parts
    prec_p = torch.linalg.inv(train.cov)
    log_w, means, covs = [], [], []
    for w, comp in zip(weights, comps, strict=True):
        prec_r = torch.linalg.inv(comp.cov) - prec_p
        if float(torch.linalg.eigvalsh((prec_r + prec_r.T) / 2).min()) <= 1e-12:
            return None
        cov_r = torch.linalg.inv(prec_r)
        cov_r = (cov_r + cov_r.T) / 2
        mu_r = cov_r @ (torch.linalg.inv(comp.cov) @ comp.loc - prec_p @ train.loc)
        point = mu_r.unsqueeze(0)  # the log scale c_k, evaluated where the densities are well conditioned
        log_c = (comp.log_prob(point) - train.log_prob(point)
                 - gaussian_log_prob(point, mu_r, torch.linalg.cholesky(cov_r)))
        log_w.append(torch.log(w) + log_c[0])
        means.append(mu_r)
        covs.append(cov_r)
    return GaussianMixtureRatio(torch.stack(log_w), torch.stack(means), torch.stack(covs), "closed-form")


def uniform_shortcut(test: Prior) -> GaussianMixtureRatio | None:
    """r ∝ q for a uniform training prior when q is a Gaussian (mixture); None otherwise."""
    parts = gaussian_components(test)
    if parts is None:
        return None
    weights, comps = parts
    return GaussianMixtureRatio(weights.log(), torch.stack([c.loc for c in comps]),
                                torch.stack([c.cov for c in comps]), "uniform-shortcut")


# -- the fit ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class FitSettings:
    """GMM ratio fit: K components, diagonal or full covariances, Adam steps per restart."""

    k: int = 10
    covariance: Literal["diag", "full"] = "diag"
    steps: int = 600
    batch: int = 128  # draws per component per step
    lr: float = 0.05
    restarts: int = 2
    seed: int = 0


class _Mixture(torch.nn.Module):
    """Trainable mixture: softmax weights, a free log-normaliser, softplus(·)+1e-3 scales (Cholesky if full)."""

    def __init__(self, means: torch.Tensor, std: torch.Tensor, full: bool) -> None:
        super().__init__()
        k, d = means.shape
        self.full = full
        self.means = torch.nn.Parameter(means.clone())
        self.raw_std = torch.nn.Parameter(torch.log(torch.expm1((std - 1e-3).clamp_min(1e-4))).clone())  # [K, d]
        self.off_diag = torch.nn.Parameter(torch.zeros(k, d, d, dtype=DTYPE)) if full else None
        self.logits = torch.nn.Parameter(torch.zeros(k, dtype=DTYPE))
        self.log_z = torch.nn.Parameter(torch.zeros((), dtype=DTYPE))

    def chol(self) -> torch.Tensor:
        diag = torch.diag_embed(torch.nn.functional.softplus(self.raw_std) + 1e-3)  # [K, d, d]
        return diag + torch.tril(self.off_diag, -1) if self.off_diag is not None else diag

    def log_weights(self) -> torch.Tensor:
        return torch.log_softmax(self.logits, 0) + self.log_z

    def log_prob(self, theta: torch.Tensor, chol: torch.Tensor) -> torch.Tensor:
        """log r̂ at θ [..., d] -> [...], through the inverse Cholesky factors (a matmul, not K·n solves)."""
        inv = torch.linalg.inv(chol)  # [K, d, d]
        z = torch.einsum("kij,...kj->...ki", inv, theta.unsqueeze(-2) - self.means)  # [..., K, d]
        log_n = (-0.5 * (z**2).sum(-1) + inv.diagonal(dim1=-2, dim2=-1).log().sum(-1)
                 - 0.5 * theta.shape[-1] * math.log(2 * math.pi))  # [..., K]
        return torch.logsumexp(log_n + self.log_weights(), -1)

    def objective(self, eps: torch.Tensor, anchors: torch.Tensor, log_r) -> torch.Tensor:
        """Σ_k π_k mean_b (log r̂ − log r)² over reparameterised draws θ = μ_k + L_k ε [K, B, d], plus the same
        squared error at draws of q ``anchors`` [M, d] (so that no mode of q is left uncovered)."""
        chol = self.chol()
        theta = self.means.unsqueeze(1) + torch.einsum("kij,kbj->kbi", chol, eps)  # [K, B, d]
        err = (self.log_prob(theta, chol) - log_r(theta.reshape(-1, theta.shape[-1])).reshape(theta.shape[:2])) ** 2
        anchor_err = ((self.log_prob(anchors, chol) - log_r(anchors)) ** 2).mean()
        return (torch.softmax(self.logits, 0).detach() * err.mean(1)).sum() + anchor_err


def fit_ratio(train: Prior, test: Prior, settings: FitSettings, progress: bool = False) -> GaussianMixtureRatio:
    """Fit a K-component mixture to log q − log p_train; the best of ``settings.restarts`` restarts."""
    from veil.progress import progress as progress_bar

    def log_r(theta: torch.Tensor) -> torch.Tensor:
        return test.log_prob(theta) - train.log_prob(theta)

    best: tuple[float, _Mixture] | None = None
    gen = torch.Generator().manual_seed(settings.seed)
    d = test.dim
    for restart in range(settings.restarts):
        init = test.sample(settings.k, gen)  # means start at draws of q
        std = 0.5 * test.covariance().diagonal().sqrt().expand(settings.k, d)  # narrower than q: modes apart
        model = _Mixture(init, std, settings.covariance == "full")
        opt = torch.optim.Adam(model.parameters(), lr=settings.lr)
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, settings.steps, eta_min=settings.lr * 0.01)
        bar = progress_bar(range(settings.steps), desc=f"ratio fit {restart + 1}/{settings.restarts}",
                           enabled=progress, leave=False)
        for _ in bar:
            eps = torch.randn(settings.k, settings.batch, d, generator=gen, dtype=DTYPE)
            loss = model.objective(eps, test.sample(settings.batch, gen), log_r)
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
        with torch.no_grad():
            error = float(model.objective(torch.randn(settings.k, 2048, d, generator=gen, dtype=DTYPE),
                                          test.sample(4096, gen), log_r))
        if math.isfinite(error) and (best is None or error < best[0]):
            best = (error, model)
    if best is None:
        raise RatioError("ratio fit: every restart diverged (non-finite log-L2 error); check the test prior")
    error, model = best
    with torch.no_grad():
        chol = model.chol()
        return GaussianMixtureRatio(model.log_weights().detach().clone(), model.means.detach().clone(),
                                    (chol @ chol.transpose(-1, -2)).detach().clone(), "fit", fit_error=error)


_CACHE: OrderedDict[tuple, GaussianMixtureRatio] = OrderedDict()
CACHE_SIZE = 64


def prior_ratio(train: Prior, test: Prior, method: RatioMethod = "auto", fit: FitSettings | None = None,
                progress: bool = False) -> GaussianMixtureRatio:
    """r = q/p_train as a Gaussian mixture (see the module docstring for which method is used when).

    Raises:
        RatioError: q is not representable as a mixture ratio over p_train (e.g. a uniform test prior).
    """
    if test.dim != train.dim:
        raise RatioError(f"prior: expected dimension {train.dim} (the training prior's), received {test.dim}")
    if method == "auto":
        if test == train:
            return identity_ratio(train.dim)
        if isinstance(train, Uniform):
            ratio = uniform_shortcut(test)
            if ratio is None:
                raise RatioError("prior: over a uniform training prior, expected a gaussian prior or a mixture of "
                                 f"gaussians, received {test.to_spec()['family']!r} (with uniform components)")
            return ratio
        if isinstance(train, Gaussian):
            exact = closed_form_ratio(train, test)
            if exact is not None:
                return exact
    if gaussian_components(test) is None:
        raise RatioError("prior: the ratio fit needs a test prior with support everywhere (gaussian or a mixture "
                         f"of gaussians), received {test.to_spec()['family']!r} with uniform parts")
    fit = fit or FitSettings()
    key = (train.hash(), test.hash(), fit)
    if key in _CACHE:
        _CACHE.move_to_end(key)
        hit = _CACHE[key]
        return GaussianMixtureRatio(hit.log_weights, hit.means, hit.covs, hit.method, hit.fit_error, cache_hit=True)
    ratio = fit_ratio(train, test, fit, progress)
    _CACHE[key] = ratio
    while len(_CACHE) > CACHE_SIZE:
        _CACHE.popitem(last=False)
    return ratio
