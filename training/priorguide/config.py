"""Configs of `veil train sampler`: the score network and its training, and the simulator task names.

Kept apart from the torch modules (model.py, trainer.py, simulators.py re-export or check against them) so that
building the CLI parser imports nothing heavy.
"""

from __future__ import annotations

from dataclasses import dataclass

from veil.config import Config, ConfigError, field

# the simulator tasks (simulators.TASKS has exactly these keys)
TASK_NAMES = ("gaussian_linear", "gaussian_linear_uniform", "two_moons", "slcp", "gaussian_mixture")


@dataclass
class ScoreNetConfig(Config):
    """Score MLP: width, depth, time features and the VE schedule it is trained for."""

    dim: int = field(2, "θ's dimension")
    x_dim: int = field(2, "x's dimension")
    hidden: int = field(128, "width of the hidden layers")
    depth: int = field(3, "hidden layers")
    fourier: int = field(16, "Fourier frequencies of log σ (time embedding)")
    sigma_min: float = field(1e-4, "VE σ_min")
    sigma_max: float = field(15.0, "VE σ_max")

    def validate(self) -> None:
        for name in ("dim", "x_dim", "hidden", "depth", "fourier"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name}: expected an integer >= 1, received {getattr(self, name)}")
        if not 0 < self.sigma_min < self.sigma_max:
            raise ConfigError(f"sigma_min, sigma_max: expected 0 < sigma_min < sigma_max, received "
                              f"{self.sigma_min}, {self.sigma_max}")


@dataclass
class SamplerTrainConfig(Config):
    """Training of the score network."""

    simulations: int = field(10_000, "simulated (θ, x) pairs from the training prior")
    steps: int = field(20_000, "optimizer steps")
    batch_size: int = field(512, "pairs per step (each with a fresh noise level)")
    lr: float = field(2e-3, "peak AdamW learning rate (cosine to a hundredth of it)")
    weight_decay: float = field(1e-5, "AdamW weight decay")
    ema: float = field(0.999, "decay of the weight average that is saved")
    held_out: float = field(0.05, "fraction of the pairs kept for the held-out loss")
    seed: int = field(0, "seed of simulations, initialisation, batches and noise")

    def validate(self) -> None:
        for name in ("simulations", "steps", "batch_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name}: expected an integer >= 1, received {getattr(self, name)}")
        if not 0 <= self.held_out < 0.5:
            raise ConfigError(f"held_out: expected a fraction in [0, 0.5), received {self.held_out}")
        if not 0 <= self.ema < 1:
            raise ConfigError(f"ema: expected a decay in [0, 1), received {self.ema}")
