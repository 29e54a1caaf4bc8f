"""Learning-rate range check (Smith 2017, "Cyclical Learning Rates", §3.3; fastai's ``lr_find``).

Train the model a :class:`ModelConfig` describes for a bounded number of steps while the learning rate grows
geometrically from ``lr_min`` to ``lr_max``; record the training loss of every step and its bias-corrected
exponential moving average (``beta`` 0.98, as fastai); stop once the smoothed loss exceeds ``diverge_factor``
times the best one so far, or the loss is not finite. The curve gives the suggested stable range:

- ``steepest_lr``: where the smoothed loss falls fastest per decade of lr (before its minimum);
- ``max_stable_lr``: the lr of the smallest smoothed loss, the largest lr before the loss turns up to diverge;
- ``suggested_lr``: ``max_stable_lr / 10``, the safe pick (fastai's "minimum / 10").

The step is the trainer's (``trainer.py``): AdamW over the same parameter groups, the same loss (label
smoothing, PolyNorm variance penalties), gradient clip and augmentation, batches drawn by a generator seeded
with ``TrainConfig.seed``, so one seed gives one curve. A polynomial model is checked in its polynomial phase
(what diverges at lr 0.1 on digits, docs/uldnet.md): PolyNorm's running variance is first initialised by
``calibration_batches`` forward passes as the exact LayerNorm (no updates), then the sweep runs with the
polynomial PolyNorm, as training does after its warm-up.

Example:
    >>> from veil.training.uldnet import ModelConfig, TrainConfig, load_digits_preset
    >>> data = load_digits_preset()
    >>> result = lr_range_test(ModelConfig(arch="mlp", input_shape=data.input_shape, width=16), TrainConfig(),
    ...                        data, steps=20, progress=False)
    >>> len(result.lrs) <= 20
    True
"""

from __future__ import annotations

import io
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from veil.atomic import write_atomic
from veil.progress import progress as progress_bar

from .config import ModelConfig, TrainConfig
from .data import Splits
from .polynorm import PolyNorm, clear_variances, set_warmup
from .trainer import _param_groups, augment_batch, batch_loss, seeded_model


@dataclass
class LrRangeResult:
    """One range check: the lr, raw and smoothed loss of every step run, why it stopped, the suggestions."""

    arch: str
    baseline: bool
    lr_min: float
    lr_max: float
    steps: int  # steps asked for; len(lrs) were run
    seed: int
    lrs: list[float]
    losses: list[float]  # raw training loss per step (NaN/inf kept as the step that stopped it)
    smoothed: list[float]  # bias-corrected EMA of the losses
    stopped: str  # "completed", "diverged" (smoothed > factor x best) or "not finite"
    diverged_lr: float | None  # the lr of the step that stopped the check (None when completed)
    steepest_lr: float | None
    max_stable_lr: float | None
    suggested_lr: float | None
    best_loss: float | None

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["losses"] = [x if math.isfinite(x) else None for x in self.losses]  # JSON has no NaN
        out["smoothed"] = [x if math.isfinite(x) else None for x in self.smoothed]
        return out

    def table(self) -> str:
        """The suggestions as a small text table (what `veil train uldnet --lr-range` prints)."""
        def fmt(v: float | None) -> str:
            return "-" if v is None else f"{v:.3g}"

        rows = [("steps run", f"{len(self.lrs)} of {self.steps}"),
                ("lr swept", f"{fmt(self.lrs[0] if self.lrs else None)} .. {fmt(self.lrs[-1] if self.lrs else None)}"),
                ("stopped", self.stopped + (f" at lr {fmt(self.diverged_lr)}" if self.diverged_lr is not None else "")),
                ("best smoothed loss", fmt(self.best_loss)),
                ("steepest descent lr", fmt(self.steepest_lr)),
                ("largest stable lr (min loss)", fmt(self.max_stable_lr)),
                ("suggested lr (largest / 10)", fmt(self.suggested_lr)),
                ("stable range", f"{fmt(self.steepest_lr)} .. {fmt(self.max_stable_lr)}")]
        width = max(len(k) for k, _ in rows)
        head = f"lr range check: {self.arch}{' baseline' if self.baseline else ''}, seed {self.seed}"
        return "\n".join([head, *(f"  {k.ljust(width)}  {v}" for k, v in rows)])


def geometric_lrs(lr_min: float, lr_max: float, steps: int) -> np.ndarray:
    """``steps`` learning rates from ``lr_min`` to ``lr_max``, equally spaced in log."""
    if not 0 < lr_min < lr_max:
        raise ValueError(f"--lr-range-min/--lr-range-max: expected 0 < min < max, received {lr_min}, {lr_max}")
    if steps < 2:
        raise ValueError(f"--lr-range-steps: expected >= 2, received {steps}")
    return lr_min * (lr_max / lr_min) ** (np.arange(steps) / (steps - 1))


def suggest(lrs: list[float], smoothed: list[float], skip_start: float = 0.1) -> tuple[float | None, float | None, float | None]:
    """(steepest_lr, max_stable_lr, suggested_lr) of a curve; None where the curve is too short to tell.

    The steepest descent is searched between the first ``skip_start`` of the points (where the smoothed loss
    is mostly the noise of a model that has not moved yet; fastai skips 10 of 100 too) and the minimum."""
    finite = [i for i, s in enumerate(smoothed) if math.isfinite(s)]
    if not finite:
        return None, None, None
    best = min(finite, key=lambda i: smoothed[i])
    max_stable = lrs[best]
    start = max(1, round(skip_start * len(lrs)))
    steepest = None
    if best - start >= 2:  # the descent before the minimum: d loss / d log lr, its most negative point
        slope = np.gradient(np.asarray(smoothed[start:best + 1]), np.log(np.asarray(lrs[start:best + 1])))
        steepest = lrs[start + int(np.argmin(slope))]
    return steepest, max_stable, max_stable / 10.0


def _batches(data: Splits, batch_size: int, generator: torch.Generator):
    """Endless shuffled mini-batches of the training split (a new permutation each epoch)."""
    x, y = torch.as_tensor(data.x_train), torch.as_tensor(data.y_train)
    while True:
        order = torch.randperm(len(x), generator=generator)
        for i in range(0, len(order) - batch_size + 1, batch_size):  # full batches only
            idx = order[i:i + batch_size]
            yield x[idx], y[idx]


def _calibrate_running_variance(model: nn.Module, batches, count: int) -> None:
    """Var_bar of every PolyNorm from ``count`` forward passes with the exact LayerNorm, as the warm-up does."""
    if not any(isinstance(m, PolyNorm) for m in model.modules()):
        return
    set_warmup(model, True)
    with torch.no_grad():
        for _ in range(count):
            model(next(batches)[0])
    clear_variances(model)
    set_warmup(model, False)


def lr_range_test(model_config: ModelConfig, train_config: TrainConfig, data: Splits, *, lr_min: float = 1e-5,
                  lr_max: float = 1.0, steps: int = 100, beta: float = 0.98, diverge_factor: float = 4.0,
                  calibration_batches: int = 5, progress: bool = True) -> LrRangeResult:
    """Run the range check; see the module docstring. The model is thrown away (this is a check, not training).

    Args:
        model_config, train_config: what to check, as for :func:`train_uldnet` (``lr`` and ``epochs`` unused).
        data: the splits; only the training split is used.
        lr_min, lr_max: the first and the last learning rate of the sweep.
        steps: optimizer steps (the sweep's length); the check stops earlier on divergence.
        beta: EMA factor of the smoothed loss.
        diverge_factor: stop once the smoothed loss exceeds this many times the best smoothed loss.
        calibration_batches: forward passes that initialise PolyNorm's running variance (polynomial models).
        progress: progress lines on stderr (veil.progress).
    """
    if diverge_factor <= 1:
        raise ValueError(f"diverge_factor: expected > 1, received {diverge_factor}")
    schedule = geometric_lrs(lr_min, lr_max, steps)
    cfg = train_config
    model, generator = seeded_model(model_config, cfg, data)
    polynomial = not model_config.baseline
    batch_size = min(cfg.batch_size, len(data.x_train))
    batches = _batches(data, batch_size, generator)
    augment = cfg.augment and data.x_train.ndim == 4
    model.train()
    if polynomial:
        _calibrate_running_variance(model, batches, calibration_batches)
    optimizer = torch.optim.AdamW(_param_groups(model, cfg.weight_decay), lr=float(schedule[0]))

    lrs: list[float] = []
    losses: list[float] = []
    smoothed: list[float] = []
    avg, best, stopped, diverged_lr = 0.0, math.inf, "completed", None
    bar = progress_bar(schedule.tolist(), desc=f"lr range {model_config.arch}{' baseline' if not polynomial else ''}",
                       enabled=progress, leave=False)
    for step, lr in enumerate(bar):
        for group in optimizer.param_groups:
            group["lr"] = float(lr)
        xb, yb = next(batches)
        if augment:
            xb = augment_batch(xb, generator, cfg)
        loss = batch_loss(model, model, xb, yb, cfg, penalize=polynomial)
        value = float(loss.item())
        lrs.append(float(lr))
        losses.append(value)
        if not math.isfinite(value):
            smoothed.append(math.nan)
            stopped, diverged_lr = "not finite", float(lr)
            break
        avg = beta * avg + (1 - beta) * value
        smooth = avg / (1 - beta ** (step + 1))
        smoothed.append(smooth)
        if step > 0 and smooth > diverge_factor * best:
            stopped, diverged_lr = "diverged", float(lr)
            break
        best = min(best, smooth)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        clear_variances(model)
        if cfg.grad_clip:
            nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        optimizer.step()
        bar.set_postfix(lr=f"{lr:.2e}", loss=f"{smooth:.3f}")
    bar.close()
    clear_variances(model)
    steepest, max_stable, suggested = suggest(lrs, smoothed)
    return LrRangeResult(model_config.arch, model_config.baseline, lr_min, lr_max, steps, cfg.seed, lrs, losses,
                         smoothed, stopped, diverged_lr, steepest, max_stable, suggested,
                         None if best == math.inf else best)


def save_lr_range(result: LrRangeResult, out_dir: str | Path, extra: dict[str, Any] | None = None,
                  plot: bool = True, name: str = "lr_range") -> dict[str, str]:
    """Write ``NAME.json`` (atomically) and, when matplotlib is installed, ``NAME.png`` into ``out_dir``;
    returns the paths written."""
    out_dir = Path(out_dir)
    written = {"json": str(out_dir / f"{name}.json")}
    write_atomic(out_dir / f"{name}.json", json.dumps({**result.to_dict(), **(extra or {})}, indent=2))
    if plot:
        png = plot_lr_range(result, out_dir / f"{name}.png")
        if png is not None:
            written["png"] = str(png)
    return written


def plot_lr_range(result: LrRangeResult, path: str | Path) -> Path | None:
    """Smoothed loss against lr (log axis) with the suggestions marked; a PNG, or None without matplotlib."""
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    ax.plot(result.lrs, result.losses, color="0.75", lw=0.8, label="loss")
    ax.plot(result.lrs, result.smoothed, color="C0", lw=1.5, label="smoothed")
    for lr, name, color in ((result.steepest_lr, "steepest", "C2"), (result.max_stable_lr, "min loss", "C3"),
                            (result.suggested_lr, "suggested", "C1")):
        if lr is not None:
            ax.axvline(lr, color=color, ls="--", lw=1, label=f"{name} {lr:.2g}")
    finite = [s for s in result.smoothed if math.isfinite(s)]
    if finite:
        ax.set_ylim(min(finite) * 0.9, min(max(finite), 4 * min(finite)) * 1.1)
    ax.set_xscale("log")
    ax.set_xlabel("learning rate")
    ax.set_ylabel("training loss")
    ax.set_title(f"lr range check: {result.arch}{' baseline' if result.baseline else ''} (seed {result.seed})")
    ax.legend(fontsize=7)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=120, bbox_inches="tight")
    plt.close(fig)
    path = Path(path)
    write_atomic(path, buffer.getvalue())
    return path
