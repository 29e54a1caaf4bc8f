"""Root Purge: the torch trainer of the paper's null-space-penalised linear forecaster.

    loss = MSE(G(x), y)  +  λ κ · MSE(G(P(r)), target),   r = (y - G(x)).detach()

as ``RootPurgeModel.forward_train`` of the official code (spec §3.2): the residual r (H steps) is embedded
into a length-L input (L > H: zero-padded by L-H on both sides and one random length-L window per window
and channel; L < H: its first L steps), G is applied ``rp_order`` times, κ = max(L/H, 1)^order
("code") or 1 ("paper"), and the target is 0 or G(0) ("model_zero"). Inputs are instance-normalised as the
model config says (the code: the input's mean). ``linear.root_purge_fixed_point`` is its deterministic
fixed point for order 1, which the tests compare this trainer against.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from .config import ForecastFitConfig, ForecastModelConfig
from .linear import LinearForecaster, group_dims, ols, purge_scale
from .linear import design as np_design


class LinearModule(nn.Module):
    """G: per-group weights (G, D_in, D_out), optional bias, optional RevIN affine; nn.Linear's init."""

    def __init__(self, config: ForecastModelConfig, n_channels: int, generator: torch.Generator) -> None:
        super().__init__()
        self.config, self.n_channels = config, n_channels
        groups, d_in, d_out = group_dims(config, n_channels)
        bound = 1.0 / d_in**0.5  # nn.Linear: kaiming_uniform(a=sqrt(5)) == U(-1/sqrt(fan_in), 1/sqrt(fan_in))
        self.weight = nn.Parameter((torch.rand(groups, d_in, d_out, generator=generator, dtype=torch.float64) * 2 - 1)
                                   * bound)
        self.bias = nn.Parameter((torch.rand(groups, d_out, generator=generator, dtype=torch.float64) * 2 - 1) * bound,
                                 requires_grad=config.bias)
        if not config.bias:
            self.bias.data.zero_()
        if config.revin_affine:
            self.gamma = nn.Parameter(torch.ones(n_channels, dtype=torch.float64))
            self.beta = nn.Parameter(torch.zeros(n_channels, dtype=torch.float64))

    def g(self, z: torch.Tensor) -> torch.Tensor:
        """(G, M, D_in) -> (G, M, D_out)."""
        return z @ self.weight + self.bias[:, None, :]

    def to_groups(self, z: torch.Tensor) -> torch.Tensor:
        b, t, c = z.shape
        if self.config.channels == "shared":
            return z.permute(0, 2, 1).reshape(1, b * c, t)
        if self.config.channels == "individual":
            return z.permute(2, 0, 1)
        return z.reshape(1, b, t * c)

    def normalise(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Instance-normalised (and RevIN-affine) x and y, with the input window's statistics."""
        if self.config.instance_norm == "none":
            return x, y
        mean = x.mean(dim=1, keepdim=True)
        scale = (x.var(dim=1, keepdim=True, unbiased=False) + self.config.revin_eps).sqrt() \
            if self.config.instance_norm == "revin" else torch.ones_like(mean)
        xn, yn = (x - mean) / scale, (y - mean) / scale
        if self.config.revin_affine:
            xn, yn = xn * self.gamma + self.beta, yn * self.gamma + self.beta
        return xn, yn

    def purge_input(self, r: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """Residuals (G, M, H*w) -> inputs (G, M, L*w): random-offset embedding (L > H) or truncation (L < H)."""
        lookback, horizon = self.config.lookback, self.config.horizon
        width = self.n_channels if self.config.channels == "mixed" else 1
        groups, rows, _ = r.shape
        r = r.reshape(groups, rows, horizon, width)
        if lookback > horizon:
            offsets = torch.randint(0, lookback - horizon + 1, (groups, rows, 1, width), generator=generator)
            index = offsets + torch.arange(horizon).view(1, 1, horizon, 1)
            r = torch.zeros(groups, rows, lookback, width, dtype=r.dtype).scatter(2, index, r)
        elif lookback < horizon:
            r = r[:, :, :lookback]
        return r.reshape(groups, rows, lookback * width)

    def loss(self, x: torch.Tensor, y: torch.Tensor, fit: ForecastFitConfig, generator: torch.Generator) -> torch.Tensor:
        xn, yn = self.normalise(x, y)
        pred, target = self.g(self.to_groups(xn)), self.to_groups(yn)
        r = (target - pred).detach()
        for _ in range(fit.rp_order):
            r = self.g(self.purge_input(r, generator))
            if fit.rp_target == "model_zero":
                r = r - self.bias[:, None, :]
        kappa = purge_scale(fit, self.config.lookback, self.config.horizon)
        return torch.mean((pred - target) ** 2) + kappa * torch.mean(r**2)


def train_root_purge(x: np.ndarray, y: np.ndarray, model: ForecastModelConfig, fit: ForecastFitConfig,
                     mean: np.ndarray, std: np.ndarray, progress: bool = True) -> LinearForecaster:
    """Adam on the Root Purge loss over standardised train windows x (N, L, C), y (N, H, C) (float64)."""
    from veil.progress import progress as progress_bar

    n_channels = x.shape[2]
    generator = torch.Generator().manual_seed(fit.seed)
    module = LinearModule(model, n_channels, generator)
    if fit.rp_init == "ols":
        gx, gy = np_design(x, y, model)
        start = np.stack([ols(gx[g], gy[g], fit.ridge, model.bias) for g in range(len(gx))])
        module.weight.data = torch.from_numpy(start[:, :-1] if model.bias else start).clone()
        if model.bias:
            module.bias.data = torch.from_numpy(start[:, -1]).clone()
    params = [p for p in module.parameters() if p.requires_grad]
    optimizer = torch.optim.Adam(params, lr=fit.lr)
    xs, ys = torch.from_numpy(np.asarray(x, np.float64)), torch.from_numpy(np.asarray(y, np.float64))
    losses = []
    bar = progress_bar(range(fit.steps), desc="root purge", enabled=progress, leave=False)
    for _ in bar:
        if fit.batch_size and fit.batch_size < len(xs):
            pick = torch.randint(0, len(xs), (fit.batch_size,), generator=generator)
            xb, yb = xs[pick], ys[pick]
        else:
            xb, yb = xs, ys
        optimizer.zero_grad()
        loss = module.loss(xb, yb, fit, generator)
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
        if len(losses) % 50 == 0:
            bar.set_postfix(loss=f"{losses[-1]:.4f}")
    with torch.no_grad():
        gamma = module.gamma.numpy().copy() if model.revin_affine else None
        beta = module.beta.numpy().copy() if model.revin_affine else None
        return LinearForecaster(model, module.weight.numpy().copy(), module.bias.numpy().copy(),
                                np.asarray(mean, float), np.asarray(std, float), gamma, beta,
                                info={"fit": "rootpurge", "solver": "torch", "final_loss": losses[-1],
                                      "first_loss": losses[0]})
