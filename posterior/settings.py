"""PriorGuide sampling settings: what a request (or `veil sample`, `veil export sampler`) may set.

Kept apart from the sampler (torch) so that building a CLI parser from them imports nothing heavy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from veil.config import Config, ConfigError, field

MAX_SAMPLES = 100_000


@dataclass
class SamplerSettings(Config):
    """PriorGuide sampling settings (defaults: the paper's N = 25, N_L = 8, η = 0.5, ρ = 2)."""

    num_samples: int = field(1000, "posterior draws to return")
    steps: int = field(25, "reverse-diffusion (Euler–Maruyama) steps N")
    langevin_steps: int = field(8, "Langevin corrector steps N_L after each predictor step")
    eta: float = field(0.5, "Langevin step scale η in δ = η σ̇σΔt/2")
    rho: float = field(2.0, "time-grid exponent ρ: t_j = linspace(1, 0, N+1)^ρ")
    nfe_budget: int = field(0, "cap on score evaluations N (N_L + 1); N_L, then N, are cut to fit (0: none)")
    kernel: Literal["paper", "scalar", "diag", "full"] = field(
        "full", "Σ0|t: paper σ²/(1+σ²)I; scalar/diag/full (C⁻¹+σ⁻²I)⁻¹ with C from unguided pilot draws")
    jacobian: Literal["vjp", "identity"] = field("vjp", "guidance through ∇μ0|t (one VJP) or identity (sbi)")
    pilot: int = field(500, "unguided draws for the kernel covariance and the SIR/ESS cross-check (0: none)")
    ratio: Literal["auto", "fit"] = field("auto", "prior ratio: exact where possible (auto) or always fitted")
    k: int = field(10, "Gaussian components of a fitted ratio")
    fit_covariance: Literal["diag", "full"] = field("diag", "covariance of the fitted ratio's components")
    fit_steps: int = field(600, "Adam steps per restart of the ratio fit")
    restarts: int = field(2, "restarts of the ratio fit (the best is kept)")
    seed: int = field(0, "seed of the draws (the pilot uses seed + 1, the OOD check seed + 2)")

    def validate(self) -> None:
        if not 1 <= self.num_samples <= MAX_SAMPLES:
            raise ConfigError(f"num_samples: expected 1..{MAX_SAMPLES}, received {self.num_samples}")
        # upper bounds keep one request from holding a server for hours
        for name, low, high in (("steps", 1, 10_000), ("langevin_steps", 0, 1000), ("nfe_budget", 0, 10**6),
                                ("pilot", 0, MAX_SAMPLES), ("k", 1, 64), ("fit_steps", 1, 20_000), ("restarts", 1, 10)):
            if not low <= getattr(self, name) <= high:
                raise ConfigError(f"{name}: expected an integer in [{low}, {high}], received {getattr(self, name)}")
        if not (self.eta > 0 and self.rho > 0):
            raise ConfigError(f"eta, rho: expected positive numbers, received eta={self.eta} rho={self.rho}")
        if self.kernel in ("scalar", "diag", "full") and self.pilot < 2:
            raise ConfigError(f"kernel: {self.kernel!r} estimates C from pilot draws; expected pilot >= 2, "
                              f"received {self.pilot} (or use kernel 'paper')")

    def budgeted(self) -> tuple[int, int]:
        """(N, N_L) after the NFE budget: N_L is cut first, then N."""
        steps, lang = self.steps, self.langevin_steps
        if self.nfe_budget and steps * (lang + 1) > self.nfe_budget:
            lang = max(0, self.nfe_budget // steps - 1)
            steps = min(steps, self.nfe_budget)
        return steps, lang
