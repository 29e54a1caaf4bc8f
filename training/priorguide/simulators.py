"""Simulators with known answers (the sbibm tasks PriorGuide and sbi users know) and a user-simulator API.

Tasks (θ-dim, x-dim, training prior):

* ``gaussian_linear``   d, d, N(0, 0.1 I); x | θ ~ N(θ, 0.1 I) (sbibm; 0.1 is a variance). Analytic posterior.
* ``gaussian_linear_uniform`` d, d, U[-1, 1]^d; same likelihood (sbibm).
* ``two_moons``         2, 2, U[-1, 1]² (sbibm; the paper's Two Moons).
* ``slcp``              5, 8, U[-3, 3]^5: four draws of a 2-D Gaussian whose mean, scales and correlation are
  nonlinear in θ (sbibm "simple likelihood, complex posterior").
* ``gaussian_mixture``  2, 2, U[-10, 10]²; x ~ ½ N(θ, I) + ½ N(θ, 0.01 I) (sbibm).

Your own simulator: ``simulator_task("mine", simulate, prior)`` with ``simulate(θ [n, d], generator) -> x
[n, d_x]`` (a torch function of a batch) and any :class:`veil.posterior.Prior`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from veil.posterior.priors import DTYPE, Gaussian, Prior, Uniform
from veil.posterior.score import gaussian_linear_posterior

Simulate = Callable[[torch.Tensor, torch.Generator], torch.Tensor]


@dataclass
class Task:
    """A simulator with its training prior; ``noise_cov`` is set where the posterior is analytic (Gaussian linear)."""

    name: str
    prior: Prior
    simulate: Simulate
    x_dim: int
    noise_cov: torch.Tensor | None = None

    @property
    def dim(self) -> int:
        return self.prior.dim

    def simulate_pairs(self, n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """(θ [n, d], x [n, d_x]) with θ ~ prior and x ~ p(x | θ), float64, reproducible by seed."""
        gen = torch.Generator().manual_seed(seed)
        theta = self.prior.sample(n, gen)
        return theta, self.simulate_checked(theta, gen)

    def simulate_predictive(self, n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """(ξ = (θ, x*) [n, d + d_x], x [n, d_x]): two independent simulations per θ, for a posterior-predictive
        (joint) model of p(θ, x* | x)."""
        gen = torch.Generator().manual_seed(seed)
        theta = self.prior.sample(n, gen)
        x = self.simulate_checked(theta, gen)
        return torch.cat([theta, self.simulate_checked(theta, gen)], 1), x

    def simulate_checked(self, theta: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        """The simulator's output, checked once at the boundary: a finite [n, d_x] tensor."""
        x = torch.as_tensor(self.simulate(theta, gen), dtype=DTYPE)
        if x.shape != (theta.shape[0], self.x_dim):
            raise ValueError(f"task {self.name!r}: simulator output expected shape ({theta.shape[0]}, {self.x_dim}), "
                             f"received {tuple(x.shape)}")
        if not bool(torch.isfinite(x).all()):
            raise ValueError(f"task {self.name!r}: simulator output expected finite values, received NaN or inf")
        return x

    def posterior(self, x: torch.Tensor, prior: Prior | None = None) -> Gaussian:
        """The analytic posterior under ``prior`` (default: the training prior); Gaussian-linear tasks only."""
        prior = prior or self.prior
        if self.noise_cov is None or not isinstance(prior, Gaussian):
            raise ValueError(f"task {self.name!r}: an analytic posterior needs the Gaussian-linear task and a "
                             f"Gaussian prior, received prior family {prior.to_spec()['family']!r}")
        return gaussian_linear_posterior(prior, self.noise_cov, x)


def simulator_task(name: str, simulate: Simulate, prior: Prior, x_dim: int | None = None) -> Task:
    """A task from your own batched simulator and prior; ``x_dim`` is found by one trial call when omitted."""
    if x_dim is None:
        gen = torch.Generator().manual_seed(0)
        x = torch.as_tensor(simulate(prior.sample(2, gen), gen))
        if x.dim() != 2 or x.shape[0] != 2:
            raise ValueError(f"task {name!r}: simulate(θ [n, d]) expected an [n, d_x] tensor, received shape "
                             f"{tuple(x.shape)} for n=2")
        x_dim = int(x.shape[1])
    return Task(name, prior, simulate, x_dim)


def gaussian_linear(dim: int = 10, uniform: bool = False) -> Task:
    noise = 0.1 * torch.eye(dim, dtype=DTYPE)
    chol = torch.linalg.cholesky(noise)

    def simulate(theta: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        return theta + torch.randn(theta.shape, generator=gen, dtype=DTYPE) @ chol.T

    if uniform:
        return Task("gaussian_linear_uniform", Uniform([-1.0] * dim, [1.0] * dim), simulate, dim)
    return Task("gaussian_linear", Gaussian.diag([0.0] * dim, [math.sqrt(0.1)] * dim), simulate, dim, noise)


def two_moons() -> Task:
    def simulate(theta: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        n = theta.shape[0]
        a = (torch.rand(n, generator=gen, dtype=DTYPE) - 0.5) * math.pi
        r = 0.1 + 0.01 * torch.randn(n, generator=gen, dtype=DTYPE)
        p = torch.stack([r * torch.cos(a) + 0.25, r * torch.sin(a)], -1)  # [n, 2]
        shift = torch.stack([-(theta[:, 0] + theta[:, 1]).abs(), -theta[:, 0] + theta[:, 1]], -1) / math.sqrt(2)
        return p + shift

    return Task("two_moons", Uniform([-1.0, -1.0], [1.0, 1.0]), simulate, 2)


def slcp() -> Task:
    def simulate(theta: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        n = theta.shape[0]
        s1, s2, rho = theta[:, 2] ** 2, theta[:, 3] ** 2, torch.tanh(theta[:, 4])
        cov = torch.stack([torch.stack([s1**2, rho * s1 * s2], -1), torch.stack([rho * s1 * s2, s2**2], -1)], -2)
        chol = torch.linalg.cholesky(cov + 1e-9 * torch.eye(2, dtype=DTYPE))  # [n, 2, 2]
        eps = torch.randn(n, 4, 2, generator=gen, dtype=DTYPE)
        draws = theta[:, None, :2] + torch.einsum("nij,nkj->nki", chol, eps)  # [n, 4, 2]
        return draws.reshape(n, 8)

    return Task("slcp", Uniform([-3.0] * 5, [3.0] * 5), simulate, 8)


def gaussian_mixture() -> Task:
    def simulate(theta: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        wide = torch.rand(theta.shape[0], 1, generator=gen, dtype=DTYPE) < 0.5
        scale = torch.where(wide, 1.0, 0.1)
        return theta + scale * torch.randn(theta.shape, generator=gen, dtype=DTYPE)

    return Task("gaussian_mixture", Uniform([-10.0, -10.0], [10.0, 10.0]), simulate, 2)


TASKS: dict[str, Callable[..., Task]] = {
    "gaussian_linear": lambda dim=10: gaussian_linear(dim),
    "gaussian_linear_uniform": lambda dim=10: gaussian_linear(dim, uniform=True),
    "two_moons": lambda dim=None: two_moons(),
    "slcp": lambda dim=None: slcp(),
    "gaussian_mixture": lambda dim=None: gaussian_mixture(),
}
DIMENSIONED = ("gaussian_linear", "gaussian_linear_uniform")


def get_task(name: str, dim: int | None = None) -> Task:
    """A task by name; ``dim`` sets θ's dimension of the Gaussian-linear tasks (default 10)."""
    if name not in TASKS:
        raise ValueError(f"task: expected one of {sorted(TASKS)}, received {name!r}")
    if dim is not None and name not in DIMENSIONED:
        raise ValueError(f"dim: only the tasks {list(DIMENSIONED)} take a dimension, received dim={dim} for {name!r}")
    return TASKS[name](dim) if dim is not None else TASKS[name]()
