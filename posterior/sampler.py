"""PriorGuide sampling: reverse VE diffusion guided by the prior ratio, with a schedule-adapted Langevin corrector.

[PriorGuide] Yang, Rissanen, Chang, Loka, Huang, Solin, Heinonen, Acerbi, "PriorGuide: Test-Time Prior
Adaptation for Simulation-Based Inference", ICLR 2026, arXiv:2510.13763.

Guided score (Eqs 5–16): s̃(θ_t) = s(θ_t) + ∇_θt log Σ_k w_k N(μ_k | μ0|t(θ_t), Σ_k + Σ0|t), with Tweedie's
μ0|t = θ_t + σ² s(θ_t) and the ratio r ≈ Σ_k w_k N(μ_k, Σ_k). The gradient is one vector–Jacobian product
(``torch.autograd.grad`` of the log-sum above), so the Jacobian ∇μ0|t is included at the cost of one
backward pass; ``jacobian="identity"`` drops it (sbi's choice) for comparison.

Σ0|t = (C⁻¹ + σ⁻² I)⁻¹ with C the covariance assumed for p(θ0 | x):
``paper`` C = I (Eq. 12), ``scalar`` C = s² I (the released code's data-driven variance), ``diag``/``full``
C from a pilot of unguided draws (exact when the posterior is Gaussian), or a matrix passed by the caller.

Steps (VE, ``steps`` = N predictor steps between σ_j > σ_{j+1}): θ ← θ + Δ s̃ + √Δ ε with Δ = σ_j² − σ_{j+1}²
(Euler–Maruyama with g²dt integrated over the step), then ``langevin_steps`` corrector steps
θ ← θ + δ s̃ + √(2δ) ε with δ = η σ̇σΔt/2 = η Δ/4 (App. A.3). NFE = N (N_L + 1).

Example:
    >>> from veil.posterior import Gaussian, GaussianLinearScore, PriorGuidePosterior
    >>> train = Gaussian.diag([0.0, 0.0], [0.3, 0.3])
    >>> post = PriorGuidePosterior(GaussianLinearScore(train, 0.1 * torch.eye(2)), train)
    >>> draws = post.sample((1000,), x=torch.tensor([0.2, -0.1]), prior=Gaussian.diag([0.1, 0.0], [0.1, 0.1]))
    >>> draws.theta.shape, draws.diagnostics["nfe"]
    (torch.Size([1000, 2]), 225)
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import torch

from .diagnostics import ood_fraction, sir_report
from .priors import DTYPE, Prior, as_prior
from .ratio import FitSettings, GaussianMixtureRatio, identity_ratio, prior_ratio
from .score import ScoreFunction, VESchedule
from .settings import MAX_SAMPLES, SamplerSettings  # noqa: F401  (MAX_SAMPLES re-exported)


@dataclass
class Samples:
    """Posterior draws θ [n, d] (float64), the diagnostics of the call that made them and, for a predictive
    (joint) model, the posterior-predictive draws x* [n, d_x*] that go with each θ (else None)."""

    theta: torch.Tensor
    diagnostics: dict[str, Any]
    predictive: torch.Tensor | None = None


class _Guidance:
    """∇ log Σ_k w_k N(μ_k | μ0|t(θ_t), Σ_k + Σ0|t) at one noise level, Σ0|t from the kernel covariance C.

    For a joint (predictive) model C covers all of ξ = (θ, x*) and the θθ block of Σ0|t is used: the ratio
    depends on θ only (Eq. 17)."""

    def __init__(self, ratio: GaussianMixtureRatio, kernel_eig: tuple[torch.Tensor, torch.Tensor]) -> None:
        self.ratio, (self.lam, self.vec) = ratio, kernel_eig
        self.d = ratio.means.shape[-1]

    def sigma0(self, sigma: float) -> torch.Tensor:
        """Σ0|t = (C⁻¹ + σ⁻²I)⁻¹ = V diag(λσ²/(λ+σ²)) Vᵀ, its θθ block [d, d]."""
        s2 = sigma**2
        return ((self.vec * (self.lam * s2 / (self.lam + s2))) @ self.vec.T)[:self.d, :self.d]

    def log_expected_ratio(self, mu0: torch.Tensor, sigma: float) -> torch.Tensor:
        """log Σ_k w_k N(μ_k; μ0 [n, d], Σ̃_k) -> [n] (the log of E_{N(μ0, Σ0|t)}[r̂])."""
        cov = self.ratio.covs + self.sigma0(sigma)  # [K, d, d]
        inv_chol = torch.linalg.inv(torch.linalg.cholesky(cov))  # [K, d, d]
        diff = self.ratio.means.unsqueeze(0) - mu0.unsqueeze(1)  # [n, K, d]
        z = torch.einsum("kij,nkj->nki", inv_chol, diff)  # [n, K, d]
        logdet = -inv_chol.diagonal(dim1=-2, dim2=-1).log().sum(-1)  # [K] half log det Σ̃_k
        log_n = -0.5 * (z**2).sum(-1) - logdet - 0.5 * mu0.shape[-1] * math.log(2 * math.pi)  # [n, K]
        return torch.logsumexp(log_n + self.ratio.log_weights, -1)


class PriorGuidePosterior:
    """An amortized diffusion posterior p(θ | x) whose prior can be swapped at sampling time (PriorGuide).

    A *predictive* model is a score over the joint ξ = (θ, x*) given x (``score.dim`` > the prior's
    dimension): the ratio guides its θ part, the Jacobian carries the guidance into x*, and the draws of x* come
    back as ``Samples.predictive`` (PriorGuide's posterior-predictive mode, Eq. 17).

    Args:
        score: the score s(θ_t, σ, x) of the training posterior (analytic or a trained network).
        train_prior: p_train, the prior the score was trained under (over θ, the first coordinates).
        n_train: simulations the score was trained on (sets the OOD level α = 10/N_train).
        schedule: the VE noise schedule the score was trained with.
    """

    def __init__(self, score: ScoreFunction, train_prior: Prior | Any, n_train: int = 10_000,
                 schedule: VESchedule | None = None) -> None:
        train_prior = as_prior(train_prior, where="train_prior")
        if not 1 <= train_prior.dim <= score.dim:
            raise ValueError(f"train_prior: expected dimension {score.dim} (the score's θ) or fewer (a predictive "
                             f"model's θ part), received {train_prior.dim}")
        self.score, self.train_prior, self.n_train = score, train_prior, n_train
        self.schedule = schedule or VESchedule()

    def sample(self, shape: tuple[int, ...] = (), x: torch.Tensor | None = None, prior: Prior | Any | None = None,
               settings: SamplerSettings | None = None, kernel_cov: torch.Tensor | None = None,
               **overrides: Any) -> Samples:
        """Draws from q(θ | x) ∝ q(θ) p(x | θ), or from p_train(θ | x) when ``prior`` is None.

        Args:
            shape: ``(n,)`` overrides ``settings.num_samples``.
            x: the observation [d_x].
            prior: the test prior q as a :class:`Prior`, a JSON spec or a torch distribution (None: unguided
                sampling under the training prior).
            settings: sampling settings; ``overrides`` replace single fields (e.g. ``steps=200``).
            kernel_cov: C of Σ0|t given explicitly (e.g. the exact posterior covariance), overriding ``kernel``.

        Returns:
            :class:`Samples` with θ [n, d] and the diagnostics (seed, NFE, ratio fit, OOD, SIR cross-check).
        """
        if x is None:
            raise ValueError("sample: expected an observation x=..., received none")
        settings = (settings or SamplerSettings()).replace(**overrides)
        if shape:
            settings = settings.replace(num_samples=int(math.prod(shape)))
        x = torch.as_tensor(x, dtype=DTYPE).reshape(-1)
        if x.numel() != self.score.x_dim:
            raise ValueError(f"x: expected {self.score.x_dim} values, received {x.numel()}")
        prior = None if prior is None else as_prior(prior, dim=self.train_prior.dim)
        start = time.perf_counter()
        steps, lang = settings.budgeted()
        diag: dict[str, Any] = {"seed": settings.seed, "steps": steps, "langevin_steps": lang,
                                "nfe": steps * (lang + 1), "jacobian": settings.jacobian}
        ratio = identity_ratio(self.train_prior.dim) if prior is None else prior_ratio(
            self.train_prior, prior, settings.ratio,
            FitSettings(settings.k, settings.fit_covariance, settings.fit_steps, restarts=settings.restarts,
                        seed=settings.seed))
        diag["ratio"] = ratio.describe()
        guided = ratio.k > 0
        pilot = None
        if guided and settings.pilot > 0:
            pilot = self._run(x, settings.pilot, steps, 0, settings, None, settings.seed + 1)
            diag["pilot"] = {"draws": settings.pilot, "nfe": steps}
            diag["sir"] = sir_report(pilot[:, :self.train_prior.dim], self.train_prior, prior)  # type: ignore[arg-type]
        guidance = _Guidance(ratio, torch.linalg.eigh(self._kernel_cov(settings, pilot, kernel_cov))) if guided else None
        diag["kernel"] = "given" if kernel_cov is not None else settings.kernel
        xi = self._run(x, settings.num_samples, steps, lang, settings, guidance, settings.seed)
        d = self.train_prior.dim
        theta, predictive = xi[:, :d], (xi[:, d:] if xi.shape[1] > d else None)
        if prior is not None:
            diag["ood"] = ood_fraction(self.train_prior, prior, self.n_train, seed=settings.seed + 2)
        diag["vjp"] = diag["nfe"] if guided and settings.jacobian == "vjp" else 0
        diag["seconds"] = round(time.perf_counter() - start, 4)
        return Samples(theta, diag, predictive)

    def _kernel_cov(self, settings: SamplerSettings, pilot: torch.Tensor | None,
                    given: torch.Tensor | None) -> torch.Tensor:
        """C of Σ0|t [D, D] over all the score's coordinates: given, identity (paper), or from the pilot draws."""
        d = self.score.dim
        if given is not None:
            return torch.as_tensor(given, dtype=DTYPE)
        if settings.kernel == "paper" or pilot is None:
            return torch.eye(d, dtype=DTYPE)
        cov = torch.cov(pilot.T).reshape(d, d) + 1e-9 * torch.eye(d, dtype=DTYPE)
        if settings.kernel == "scalar":
            return cov.diagonal().mean() * torch.eye(d, dtype=DTYPE)
        return torch.diag(cov.diagonal()) if settings.kernel == "diag" else cov

    def _run(self, x: torch.Tensor, n: int, steps: int, lang: int, settings: SamplerSettings,
             guidance: _Guidance | None, seed: int) -> torch.Tensor:
        """One reverse run of ``n`` draws: predictor steps, each followed by ``lang`` Langevin steps."""
        gen = torch.Generator().manual_seed(seed)
        sigmas = self.schedule.sigmas(steps, settings.rho)  # [N+1]
        # the VE marginal at σ_max: N(mean, σ_max² + var) for θ; x* of a predictive model starts at N(0, σ_max²)
        extra = torch.zeros(self.score.dim - self.train_prior.dim, dtype=DTYPE)
        mean = torch.cat([self.train_prior.mean(), extra])
        spread = torch.cat([self.train_prior.covariance().diagonal(), extra])
        theta = mean + torch.randn(n, self.score.dim, generator=gen, dtype=DTYPE) * torch.sqrt(sigmas[0] ** 2 + spread)
        for j in range(steps):
            hi, lo = float(sigmas[j]), float(sigmas[j + 1])
            delta = hi**2 - lo**2
            s = self._guided_score(theta, hi, x, guidance, settings.jacobian)
            theta = theta + delta * s + math.sqrt(delta) * torch.randn(theta.shape, generator=gen, dtype=DTYPE)
            step = settings.eta * delta / 4
            for _ in range(lang):
                s = self._guided_score(theta, lo, x, guidance, settings.jacobian)
                theta = theta + step * s + math.sqrt(2 * step) * torch.randn(theta.shape, generator=gen, dtype=DTYPE)
        return theta

    def _guided_score(self, theta: torch.Tensor, sigma: float, x: torch.Tensor, guidance: _Guidance | None,
                      jacobian: str) -> torch.Tensor:
        """s̃ = s + ∇ log E[r̂] at one noise level; a single backward pass (VJP) when ``jacobian == 'vjp'``."""
        sig = torch.full((theta.shape[0],), sigma, dtype=DTYPE)
        if guidance is None:
            with torch.no_grad():
                return self.score(theta, sig, x)
        with torch.enable_grad():
            leaf = theta.detach().requires_grad_(jacobian == "vjp")
            s = self.score(leaf, sig, x)
            mu0 = leaf + sigma**2 * s  # Tweedie, [n, d]
            if jacobian == "identity":
                mu0 = mu0.detach().requires_grad_(True)
            log_e = guidance.log_expected_ratio(mu0[:, :guidance.d], sigma)  # [n]; r depends on θ only
            (grad,) = torch.autograd.grad(log_e.sum(), leaf if jacobian == "vjp" else mu0)
        return (s + grad).detach()
