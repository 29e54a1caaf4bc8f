"""The amortized score network s_φ(θ_t, σ, x) ≈ ∇ log p_σ(θ_t | x) for the VE SDE, an MLP conditioned on x.

Preconditioning (Karras et al. 2022, "EDM", per dimension with the training θ's mean μ and std σ_d):
the network F sees c_in (θ_t − μ), the standardised x and Fourier features of log σ, and the score is

    s(θ_t, σ, x) = −(θ_t − μ)/(σ² + σ_d²) + σ_d / (σ √(σ² + σ_d²)) · F(...)

which is the exact score of N(μ, σ_d²) when F = 0, so the network only learns the correction. Training
regresses F on F* = (σ(θ_0 − μ) − σ_d² ε)/(σ_d √(σ² + σ_d²)) (denoising score matching with EDM's weighting).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from .config import ScoreNetConfig


class ScoreNet(nn.Module):
    """s(θ_t [n, d], σ [n], x [n, d_x]) -> [n, d]; normalisation statistics are buffers (saved with the weights)."""

    def __init__(self, config: ScoreNetConfig) -> None:
        super().__init__()
        self.config = config
        d, dx, h = config.dim, config.x_dim, config.hidden
        self.register_buffer("theta_mean", torch.zeros(d))
        self.register_buffer("theta_std", torch.ones(d))
        self.register_buffer("x_mean", torch.zeros(dx))
        self.register_buffer("x_std", torch.ones(dx))
        # log σ spans about [-9, 3]: frequencies from one period over that range to a few per unit
        self.register_buffer("freqs", torch.exp(torch.linspace(math.log(1 / 12), math.log(4.0), config.fourier)))
        layers: list[nn.Module] = [nn.Linear(d + dx + 2 * config.fourier + 1, h), nn.SiLU()]
        for _ in range(config.depth - 1):
            layers += [nn.Linear(h, h), nn.SiLU()]
        layers.append(nn.Linear(h, d))
        self.net = nn.Sequential(*layers)
        nn.init.zeros_(self.net[-1].weight)  # start at the exact score of N(μ, σ_d²)
        nn.init.zeros_(self.net[-1].bias)

    def set_statistics(self, theta: torch.Tensor, x: torch.Tensor) -> None:
        """Normalisation from the training pairs θ [N, d], x [N, d_x]."""
        self.theta_mean.copy_(theta.mean(0))
        self.theta_std.copy_(theta.std(0).clamp_min(1e-6))
        self.x_mean.copy_(x.mean(0))
        self.x_std.copy_(x.std(0).clamp_min(1e-6))

    def features(self, theta_t: torch.Tensor, sigma: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """F(c_in (θ_t − μ), x̃, log σ) [n, d]."""
        s = sigma.unsqueeze(-1)  # [n, 1]
        c_in = torch.rsqrt(s**2 + self.theta_std**2)  # [n, d]
        log_s = torch.log(s)
        angles = log_s * self.freqs  # [n, F]
        inp = torch.cat([c_in * (theta_t - self.theta_mean), (x - self.x_mean) / self.x_std,
                         torch.sin(angles), torch.cos(angles), log_s / 4], -1)
        return self.net(inp)

    def forward(self, theta_t: torch.Tensor, sigma: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        s2 = sigma.unsqueeze(-1) ** 2  # [n, 1]
        var = s2 + self.theta_std**2  # [n, d]
        skip = -(theta_t - self.theta_mean) / var
        return skip + self.theta_std / (sigma.unsqueeze(-1) * torch.sqrt(var)) * self.features(theta_t, sigma, x)

    def loss(self, theta0: torch.Tensor, x: torch.Tensor, sigma: torch.Tensor, eps: torch.Tensor) -> torch.Tensor:
        """Denoising score matching with EDM weighting: mean ‖F − F*‖² over a batch [n, d]."""
        s = sigma.unsqueeze(-1)
        sd = self.theta_std
        target = (s * (theta0 - self.theta_mean) - sd**2 * eps) / (sd * torch.sqrt(s**2 + sd**2))
        return ((self.features(theta0 + s * eps, sigma, x) - target) ** 2).mean()
