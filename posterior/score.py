"""Score functions s(θ_t, σ, x) = ∇ log p_σ(θ_t | x) the sampler works from, and the VE noise schedule.

The sampler never knows where a score comes from: the analytic Gaussian-linear score (exact, for tests and
benchmarks), a trained network in eager PyTorch, or the same network as a ``torch.export`` program served by
the engine. Every score is differentiable in θ_t, which the PriorGuide Jacobian term needs.

VE SDE (Song et al. 2021): θ_t = θ_0 + σ(t) ε with σ(t) = σ_min (σ_max/σ_min)^t, t ∈ [0, 1].
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch

from .priors import DTYPE, Gaussian


@dataclass(frozen=True)
class VESchedule:
    """σ(t) = σ_min (σ_max/σ_min)^t; the time grid of Alg. 1, t_j = linspace(1, 0, N+1)^ρ (1 − t_min) + t_min."""

    sigma_min: float = 1e-4
    sigma_max: float = 15.0

    def sigma(self, t: torch.Tensor) -> torch.Tensor:
        return self.sigma_min * (self.sigma_max / self.sigma_min) ** t

    def sigmas(self, steps: int, rho: float = 2.0, t_min: float = 1e-10) -> torch.Tensor:
        """The N+1 noise levels of an N-step reverse run, from σ_max down to ≈ σ_min [N+1]."""
        t = torch.linspace(1, 0, steps + 1, dtype=DTYPE) ** rho * (1 - t_min) + t_min
        return self.sigma(t)


class ScoreFunction(Protocol):
    """s(θ_t [n, d], σ [n], x [d_x]) -> [n, d], differentiable in θ_t; ``dim`` θ's and ``x_dim`` x's size."""

    dim: int
    x_dim: int

    def __call__(self, theta: torch.Tensor, sigma: torch.Tensor, x: torch.Tensor) -> torch.Tensor: ...


def gaussian_linear_posterior(prior: Gaussian, noise_cov: torch.Tensor, x: torch.Tensor) -> Gaussian:
    """p(θ | x) for x | θ ~ N(θ, Σ_x) and θ ~ N(μ_p, Σ_p): N(m, S), S = (Σ_p⁻¹ + Σ_x⁻¹)⁻¹, m = S(Σ_p⁻¹μ_p + Σ_x⁻¹x)."""
    prec_p, prec_x = torch.linalg.inv(prior.cov), torch.linalg.inv(torch.as_tensor(noise_cov, dtype=DTYPE))
    cov = torch.linalg.inv(prec_p + prec_x)
    cov = (cov + cov.T) / 2
    mean = cov @ (prec_p @ prior.loc + prec_x @ torch.as_tensor(x, dtype=DTYPE).reshape(-1))
    return Gaussian(mean, cov)


def predictive_joint(post: Gaussian, noise_cov: torch.Tensor) -> Gaussian:
    """(θ, x*) | x for x* | θ ~ N(θ, Σ_x) and θ | x ~ N(m, S): N([m; m], [[S, S], [S, S + Σ_x]])."""
    cov = torch.cat([torch.cat([post.cov, post.cov], 1), torch.cat([post.cov, post.cov + noise_cov], 1)], 0)
    return Gaussian(torch.cat([post.loc, post.loc]), cov)


class GaussianLinearScore:
    """The exact score of the Gaussian-linear model under the VE SDE: −(S + σ²I)⁻¹(θ_t − m(x)).

    Args:
        prior: the training prior N(μ_p, Σ_p).
        noise_cov: Σ_x of x | θ ~ N(θ, Σ_x).
        predictive: score the joint ξ = (θ, x*) of a fresh observation x* | θ instead (posterior predictive).
    """

    def __init__(self, prior: Gaussian, noise_cov: torch.Tensor, predictive: bool = False) -> None:
        self.prior, self.noise_cov = prior, torch.as_tensor(noise_cov, dtype=DTYPE)
        self.predictive = predictive
        self.x_dim = prior.dim
        self.dim = 2 * prior.dim if predictive else prior.dim

    def posterior(self, x: torch.Tensor) -> Gaussian:
        """p(θ | x), or p(θ, x* | x) for the predictive score."""
        post = gaussian_linear_posterior(self.prior, self.noise_cov, x)
        return predictive_joint(post, self.noise_cov) if self.predictive else post

    def __call__(self, theta: torch.Tensor, sigma: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        post = self.posterior(x)
        eye = torch.eye(self.dim, dtype=DTYPE)
        cov_t = post.cov + sigma.to(DTYPE).reshape(-1, 1, 1) ** 2 * eye  # [n, d, d]
        return -torch.linalg.solve(cov_t, (theta - post.loc).unsqueeze(-1)).squeeze(-1)


class NetworkScore:
    """A trained score network (eager module or ``torch.export`` program) behind the score interface.

    Args:
        fn: maps (θ_t [n, d] float32, σ [n] float32, x [n, d_x] float32) to the score [n, d].
        dim: θ's dimension.
        x_dim: x's dimension.
    """

    def __init__(self, fn: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor], dim: int,
                 x_dim: int) -> None:
        self.fn, self.dim, self.x_dim = fn, dim, x_dim

    def __call__(self, theta: torch.Tensor, sigma: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        n = theta.shape[0]
        xs = torch.as_tensor(x, dtype=torch.float32).reshape(1, -1).expand(n, self.x_dim)
        out = self.fn(theta.float(), sigma.float().reshape(n), xs)
        return out.to(theta.dtype)

