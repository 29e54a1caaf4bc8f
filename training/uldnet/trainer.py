"""Train, evaluate, save and load ULD-Net models (and their standard-op baselines, the same way).

Recipe (he.md §1.3): ``warmup_epochs`` with PolyNorm running as an exact LayerNorm, which initialises
the running variance Var_bar; then the polynomial PolyNorm with the variance penalties
L1 = lambda1 mean(v), L2 = lambda2 mean((v - 1)^2). AdamW with cosine decay; the checkpoint keeps the
epoch with the best validation accuracy after warm-up (a model that is polynomial end to end).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from veil.progress import progress as progress_bar

from .. import distributed
from ..checkpoint import load_checkpoint, save_checkpoint
from .config import ModelConfig, TrainConfig
from .data import Splits
from .depth import multiplicative_depth
from .models import build_model
from .polynorm import clear_variances, set_warmup, variance_penalty


@dataclass
class TrainResult:
    """A trained model with its metrics and per-epoch history."""

    model: nn.Module
    model_config: ModelConfig
    train_config: TrainConfig
    metrics: dict[str, Any]
    history: list[dict[str, float]] = field(default_factory=list)


def random_shift(x: torch.Tensor, generator: torch.Generator, pixels: int = 1) -> torch.Tensor:
    """Shift each image of (B, C, H, W) by -pixels ... +pixels in each direction (zero fill)."""
    b, _, h, w = x.shape
    padded = F.pad(x, (pixels, pixels, pixels, pixels))
    dy, dx = torch.randint(0, 2 * pixels + 1, (2, b), generator=generator)
    rows = (torch.arange(h)[None, :] + dy[:, None])[:, :, None]  # (B, H, 1)
    cols = (torch.arange(w)[None, :] + dx[:, None])[:, None, :]  # (B, 1, W)
    batch = torch.arange(b)[:, None, None]
    return padded.permute(0, 2, 3, 1)[batch, rows, cols].permute(0, 3, 1, 2)  # (B, C, H, W)


def random_flip_rotate(x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Flip each square image of (B, C, H, W) left-right at random and turn it by a random multiple of 90 degrees."""
    b, _, h, w = x.shape
    if h != w:
        raise ValueError(f"TrainConfig.flip_rotate: expected square images, received {h}x{w}")
    turns, flips = torch.randint(0, 4, (b,), generator=generator), torch.randint(0, 2, (b,), generator=generator)
    out = torch.where(flips.bool()[:, None, None, None], x.flip(3), x)
    for k in (1, 2, 3):
        chosen = turns == k
        out[chosen] = torch.rot90(out[chosen], k, dims=(2, 3))
    return out


def augment_batch(x: torch.Tensor, generator: torch.Generator, cfg: TrainConfig) -> torch.Tensor:
    """The training augmentation of an image batch: shifts of up to ``cfg.shift`` pixels, then (``cfg.flip_rotate``)
    flips and 90-degree turns. The batch comes back contiguous NCHW: the shift's gather leaves a channels-last view,
    and torch 2.13's oneDNN backward of a strided 1x1 convolution over 4 channels-last channels corrupts the heap
    (a ResNet of width 4 died with "double free or corruption")."""
    x = random_shift(x, generator, cfg.shift)
    return (random_flip_rotate(x, generator) if cfg.flip_rotate else x).contiguous()


def batch_loss(net: nn.Module, model: nn.Module, xb: torch.Tensor, yb: torch.Tensor, cfg: TrainConfig,
               penalize: bool) -> torch.Tensor:
    """Label-smoothed cross-entropy of ``net`` on a batch, plus (``penalize``) the PolyNorm variance penalties of
    ``model`` (the module ``net`` wraps) over this batch."""
    loss = F.cross_entropy(net(xb), yb, label_smoothing=cfg.label_smoothing)
    penalty = variance_penalty(model, cfg.lambda1, cfg.lambda2) if penalize else None
    return loss if penalty is None else loss + penalty


@torch.no_grad()
def predict(model: nn.Module, x: np.ndarray | torch.Tensor, batch_size: int = 512) -> np.ndarray:
    """Class predictions of ``model`` in eval mode."""
    was_training = model.training
    model.eval()
    x = torch.as_tensor(x, dtype=torch.float32)
    preds = [model(x[i:i + batch_size]).argmax(dim=1) for i in range(0, len(x), batch_size)]
    model.train(was_training)
    return torch.cat(preds).numpy()


def accuracy(model: nn.Module, x: np.ndarray, y: np.ndarray) -> float:
    return float((predict(model, x) == y).mean())


def _param_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Decay matrices and kernels only: not biases, norm gains or polynomial coefficients."""
    kernels = {id(m.weight) for m in model.modules() if isinstance(m, (nn.Linear, nn.Conv1d, nn.Conv2d))}
    decay, no_decay = [], []
    for p in model.parameters():  # PolyNorm's (C, 1, 1) gain is a norm gain, as BatchNorm's is: not decayed
        (decay if id(p) in kernels else no_decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def seeded_model(model_config: ModelConfig, train_config: TrainConfig, data: Splits,
                 build: Callable[[ModelConfig], nn.Module] = build_model) -> tuple[nn.Module, torch.Generator]:
    """The model ``model_config`` describes, checked against ``data`` and built by ``build`` under ``train_config``'s
    threads and seed, with the batch-order generator of that seed (training and the lr range check start alike)."""
    if list(model_config.input_shape) != data.input_shape:
        raise ValueError(f"ModelConfig.input_shape: expected the data's sample shape {data.input_shape}, "
                         f"received {model_config.input_shape}")
    if model_config.num_classes != len(data.classes):
        raise ValueError(f"ModelConfig.num_classes: expected {len(data.classes)} (classes in the data), "
                         f"received {model_config.num_classes}")
    if train_config.threads:
        torch.set_num_threads(train_config.threads)
    torch.manual_seed(train_config.seed)
    generator = torch.Generator().manual_seed(train_config.seed)
    return build(model_config), generator


def train_uldnet(model_config: ModelConfig, train_config: TrainConfig, data: Splits, progress: bool = True,
                 build: Callable[[ModelConfig], nn.Module] = build_model) -> TrainResult:
    """Train the model ``model_config`` describes on ``data``; returns the best-validation model and metrics.
    ``build`` constructs it (``build_model``; an ablation passes one that swaps layers)."""
    cfg = train_config
    model, generator = seeded_model(model_config, cfg, data, build)
    net = distributed.wrap(model)  # DDP under torchrun (training/distributed.py), else the model itself
    polynomial = not model_config.baseline
    x_train, y_train = torch.as_tensor(data.x_train), torch.as_tensor(data.y_train)
    steps_per_epoch = math.ceil(len(x_train) / cfg.batch_size)
    optimizer = torch.optim.AdamW(_param_groups(model, cfg.weight_decay), lr=cfg.lr)
    total = cfg.epochs * steps_per_epoch
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / steps_per_epoch) * 0.5 * (1 + math.cos(math.pi * s / total)))
    augment = cfg.augment and x_train.dim() == 4

    best_acc, best_state, best_epoch, history = -1.0, None, -1, []
    start = time.perf_counter()
    bar = progress_bar(range(cfg.epochs), desc=f"train {model_config.arch}{' baseline' if not polynomial else ''}",
                       enabled=progress and distributed.is_main(), leave=False)
    for epoch in bar:
        warm = polynomial and epoch < cfg.warmup_epochs
        set_warmup(model, warm)
        model.train()
        order = torch.randperm(len(x_train), generator=generator)
        loss_sum = 0.0
        for i in range(0, len(order), cfg.batch_size):
            idx = order[i:i + cfg.batch_size]
            xb = augment_batch(x_train[idx], generator, cfg) if augment else x_train[idx]
            part, local = distributed.batch_rows(len(idx))  # every rank drew the same global batch: its slice
            loss = batch_loss(net, model, xb[part], y_train[idx][part], cfg, penalize=not warm or cfg.warmup_penalty)
            if not torch.isfinite(loss):
                raise FloatingPointError(f"training diverged at epoch {epoch}: loss {loss.item()}; lower --lr "
                                         f"(received {cfg.lr}) or raise --lambda2 (received {cfg.lambda2})")
            optimizer.zero_grad(set_to_none=True)
            (loss * distributed.loss_scale(local, len(idx))).backward()
            clear_variances(model)
            if cfg.grad_clip:
                nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            optimizer.step()
            scheduler.step()
            distributed.sync_buffers(model, local, len(idx))
            loss_sum += loss.item() * local
        loss_sum = distributed.all_sum(loss_sum)
        val_acc = accuracy(model, data.x_val, data.y_val)
        history.append({"epoch": epoch, "train_loss": loss_sum / len(order), "val_accuracy": val_acc,
                        "phase": "warmup" if warm else "polynomial" if polynomial else "standard"})
        bar.set_postfix(loss=f"{loss_sum / len(order):.3f}", val=f"{val_acc:.3f}")
        if epoch >= cfg.warmup_epochs and val_acc >= best_acc:
            best_acc, best_epoch = val_acc, epoch
            best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    seconds = time.perf_counter() - start
    model.load_state_dict(best_state)
    set_warmup(model, False)
    model.eval()
    metrics = _final_metrics(model, data, best_acc, best_epoch, seconds)
    return TrainResult(model, model_config, train_config, metrics, history)


def _final_metrics(model: nn.Module, data: Splits, best_acc: float, best_epoch: int, seconds: float) -> dict[str, Any]:
    """Test accuracy of the best-validation weights, the run's size and time, and the model's CKKS depth."""
    depth = multiplicative_depth(model)
    return {
        "test_accuracy": accuracy(model, data.x_test, data.y_test),
        "val_accuracy": best_acc,
        "best_epoch": best_epoch,
        "train_seconds": round(seconds, 2),
        "parameters": sum(p.numel() for p in model.parameters()),
        "depth_total": depth.total,
        "depth_max_per_operator": depth.max_op_levels,
        "depth_per_block": [b["levels"] for b in depth.per_block()],
        "polynomial": depth.polynomial,
        "torch_threads": torch.get_num_threads(),
        "processes": distributed.world().size,  # data-parallel ranks (torchrun), each on its slice of a batch
    }


def save_uldnet(result: TrainResult, out_dir: str | Path, data: Splits, extra_metrics: dict[str, Any] | None = None) -> Path:
    """Write ``result`` as a checkpoint folder (config.json, model.safetensors, metrics.json)."""
    from veil import __version__

    config = {"kind": "uldnet", "veil_version": __version__, "model": result.model_config.to_dict(),
              "train": result.train_config.to_dict(), "data": data.describe()}
    metrics = {**result.metrics, "history": result.history, **(extra_metrics or {})}
    return save_checkpoint(out_dir, config, result.model.state_dict(), metrics)


def load_uldnet(path: str | Path) -> tuple[nn.Module, dict[str, Any]]:
    """Rebuild a saved ULD-Net model in eval mode (polynomial PolyNorm); returns (model, config.json)."""
    config, state, _ = load_checkpoint(path)
    if config.get("kind") != "uldnet":
        raise ValueError(f"checkpoint {str(path)!r}: expected kind 'uldnet', received {config.get('kind')!r}")
    model = build_model(ModelConfig.from_dict(config["model"]))
    model.load_state_dict(state)
    set_warmup(model, False)
    return model.eval(), config
