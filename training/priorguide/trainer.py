"""Train the amortized diffusion posterior on (θ, x) pairs from the training prior; save, load, build posteriors.

Recipe: N_train simulations (default 10 000, the paper's budget); noise levels log-uniform on [σ_min, σ_max]
(t ~ U[0, 1] of the VE SDE); denoising score matching (``ScoreNet.loss``); AdamW with a cosine learning rate;
an exponential moving average of the weights (what is saved and sampled from); a held-out loss.

sbi-style use (three chained calls, then ``sample``)::

    est = ScoreEstimator(task.prior).append_simulations(theta, x).train()
    posterior = est.build_posterior()
    draws = posterior.sample((1000,), x=x_o, prior=new_prior)
"""

from __future__ import annotations

import copy
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from veil.posterior.priors import Prior, prior_from_spec
from veil.posterior.sampler import PriorGuidePosterior
from veil.posterior.score import NetworkScore, VESchedule

from veil.progress import progress as progress_bar

from ..checkpoint import load_checkpoint, save_checkpoint
from .config import SamplerTrainConfig
from .model import ScoreNet, ScoreNetConfig


@dataclass
class TrainResult:
    """The EMA network, its configs, the training prior and the final metrics."""

    model: ScoreNet
    model_config: ScoreNetConfig
    train_config: SamplerTrainConfig
    prior: Prior
    metrics: dict[str, Any]

    def posterior(self) -> PriorGuidePosterior:
        return posterior_from_network(self.model, self.prior, self.train_config.simulations)


def _noise(n: int, cfg: ScoreNetConfig, gen: torch.Generator) -> torch.Tensor:
    t = torch.rand(n, generator=gen)
    return cfg.sigma_min * (cfg.sigma_max / cfg.sigma_min) ** t  # log-uniform σ [n]


def train_score(theta: torch.Tensor, x: torch.Tensor, prior: Prior, model_config: ScoreNetConfig,
                config: SamplerTrainConfig, progress: bool = True) -> TrainResult:
    """Fit ``ScoreNet`` on pairs θ [N, d], x [N, d_x] drawn from ``prior`` and the simulator (θ may be the joint
    ξ = (θ, x*) of a predictive model, with ``prior`` over its first coordinates)."""
    if theta.shape[0] != x.shape[0] or theta.shape[1] != model_config.dim or x.shape[1] != model_config.x_dim:
        raise ValueError(f"pairs: expected θ [N, {model_config.dim}] and x [N, {model_config.x_dim}], received "
                         f"{tuple(theta.shape)} and {tuple(x.shape)}")
    gen = torch.Generator().manual_seed(config.seed)
    torch.manual_seed(config.seed)
    theta, x = theta.float(), x.float()
    perm = torch.randperm(theta.shape[0], generator=gen)
    n_val = int(config.held_out * theta.shape[0])
    val, tr = perm[:n_val], perm[n_val:]
    model = ScoreNet(model_config)
    model.set_statistics(theta[tr], x[tr])
    ema = copy.deepcopy(model).requires_grad_(False)
    opt = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, config.steps, eta_min=config.lr * 0.01)
    start, running = time.perf_counter(), math.nan
    bar = progress_bar(range(config.steps), desc=f"train sampler ({model_config.dim}-d θ)", enabled=progress)
    for step in bar:
        idx = tr[torch.randint(len(tr), (config.batch_size,), generator=gen)]
        sigma = _noise(config.batch_size, model_config, gen)
        eps = torch.randn(config.batch_size, model_config.dim, generator=gen)
        loss = model.loss(theta[idx], x[idx], sigma, eps)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 10.0)
        opt.step()
        sched.step()
        with torch.no_grad():
            for pe, pm in zip(ema.parameters(), model.parameters(), strict=True):
                pe.lerp_(pm, 1 - config.ema)
        value = loss.item()
        running = value if math.isnan(running) else 0.98 * running + 0.02 * value
        if step % 200 == 0:
            bar.set_postfix(loss=f"{running:.4f}")
    metrics = {"train_loss": round(running, 5), "seconds": round(time.perf_counter() - start, 1),
               "simulations": int(theta.shape[0]), "steps": config.steps}
    if n_val:
        metrics["held_out_loss"] = round(held_out_loss(ema, theta[val], x[val], model_config, config.seed), 5)
    return TrainResult(ema.eval(), model_config, config, prior, metrics)


@torch.no_grad()
def held_out_loss(model: ScoreNet, theta: torch.Tensor, x: torch.Tensor, cfg: ScoreNetConfig, seed: int) -> float:
    """The DSM loss on held-out pairs, 8 noise draws each (fixed seed)."""
    gen = torch.Generator().manual_seed(seed + 1)
    reps = theta.repeat(8, 1), x.repeat(8, 1)
    sigma = _noise(reps[0].shape[0], cfg, gen)
    return float(model.loss(reps[0], reps[1], sigma, torch.randn(reps[0].shape, generator=gen)))


def posterior_from_network(model: ScoreNet, prior: Prior, n_train: int) -> PriorGuidePosterior:
    cfg = model.config
    model.requires_grad_(False)  # the guidance needs ∂/∂θ_t only, never weight gradients
    return PriorGuidePosterior(NetworkScore(model, cfg.dim, cfg.x_dim), prior, n_train,
                               VESchedule(cfg.sigma_min, cfg.sigma_max))


def save_sampler(result: TrainResult, out: str | Path, task: dict[str, Any]) -> Path:
    """Checkpoint folder: config.json (task, model, train, training prior), model.safetensors, metrics.json."""
    config = {"kind": "priorguide-sampler", "task": task, "model": result.model_config.to_dict(),
              "train": result.train_config.to_dict(), "prior": result.prior.to_spec()}
    return save_checkpoint(out, config, result.model.state_dict(), result.metrics)


def load_sampler(path: str | Path) -> tuple[ScoreNet, Prior, dict[str, Any]]:
    """(network in eval mode, training prior, config.json) of a checkpoint written by :func:`save_sampler`."""
    config, state, _ = load_checkpoint(path)
    if config.get("kind") != "priorguide-sampler":
        raise ValueError(f"checkpoint {str(path)!r}: expected kind 'priorguide-sampler', received {config.get('kind')!r}")
    model = ScoreNet(ScoreNetConfig.from_dict(config["model"]))
    model.load_state_dict(state)
    return model.eval(), prior_from_spec(config["prior"]), config


def load_posterior(path: str | Path) -> PriorGuidePosterior:
    """A PriorGuide posterior over a saved checkpoint's network."""
    model, prior, config = load_sampler(path)
    return posterior_from_network(model, prior, config["train"]["simulations"])


class ScoreEstimator:
    """sbi-style front end: ``ScoreEstimator(prior).append_simulations(θ, x).train().build_posterior()``.

    Args:
        prior: the training prior the simulations were drawn from.
        model_config: network settings (``dim``/``x_dim`` are taken from the simulations).
        train_config: training settings.
    """

    def __init__(self, prior: Prior, model_config: ScoreNetConfig | None = None,
                 train_config: SamplerTrainConfig | None = None) -> None:
        self.prior, self.model_config = prior, model_config or ScoreNetConfig()
        self.train_config = train_config or SamplerTrainConfig()
        self.theta: torch.Tensor | None = None
        self.x: torch.Tensor | None = None
        self.result: TrainResult | None = None

    def append_simulations(self, theta: torch.Tensor, x: torch.Tensor) -> ScoreEstimator:
        theta, x = torch.as_tensor(theta), torch.as_tensor(x)
        if theta.dim() != 2 or x.dim() != 2 or theta.shape[0] != x.shape[0]:
            raise ValueError(f"append_simulations: expected θ [N, d] and x [N, d_x], received {tuple(theta.shape)} "
                             f"and {tuple(x.shape)}")
        self.theta, self.x = theta, x
        return self

    def train(self, progress: bool = True) -> ScoreEstimator:
        if self.theta is None or self.x is None:
            raise RuntimeError("train: no simulations; call .append_simulations(theta, x) first")
        cfg = self.model_config.replace(dim=self.theta.shape[1], x_dim=self.x.shape[1])
        train_cfg = self.train_config.replace(simulations=int(self.theta.shape[0]))
        self.result = train_score(self.theta, self.x, self.prior, cfg, train_cfg, progress)
        return self

    def build_posterior(self) -> PriorGuidePosterior:
        if self.result is None:
            raise RuntimeError("build_posterior: the estimator is not trained; call .train() first")
        return self.result.posterior()
