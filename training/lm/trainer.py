"""Train, evaluate, save and load the byte-level Llama LM.

Recipe: random windows of the train stream (seeded), next-byte cross-entropy, the optimizer named in the
config from ``veil.training.optim`` (same call for every optimizer), a linear warm-up over ``warmup`` of the
steps then a cosine to ``min_lr_ratio`` of the peak (the schedule of the RACS/Alice paper's LLaMA runs),
gradient clipping, and a held-out evaluation every ``eval_every`` steps. Loss is in nats per byte;
perplexity is ``exp(loss)`` per byte and bits per byte is ``loss / ln 2``.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from veil.progress import progress as progress_bar

from ..checkpoint import load_checkpoint, save_checkpoint
from .config import LMModelConfig, LMTrainConfig
from .data import Corpus, eval_blocks, sample_batch
from .model import build_lm, llama_config


@dataclass
class LMResult:
    """A trained LM with its final metrics, its held-out curve and its per-step training loss."""

    model: nn.Module
    model_config: LMModelConfig
    train_config: LMTrainConfig
    metrics: dict[str, Any]
    history: list[dict[str, float]] = field(default_factory=list)
    train_loss: list[float] = field(default_factory=list)


def optimizer_kwargs(model_config: LMModelConfig, train_config: LMTrainConfig) -> dict[str, Any]:
    """Keyword arguments for ``build_optimizer``: weight decay, LM defaults, then ``optimizer_args``.

    Alice follows the paper's 60M run (Table 11: r = 128, l = 40 at width 512; subspace update every K = 200 of
    10,000 steps): r = hidden_size / 4, l = 40/128 r and K = 2 % of the run's steps. Its defaults r = 256 and
    K = 200 would cover every matrix of a tiny model in full (no compression, twice Adam's memory) and update the
    subspace only 4 times in a 900-step run.
    """
    kwargs: dict[str, Any] = {"weight_decay": train_config.weight_decay}
    if train_config.optimizer == "alice":
        rank = train_config.optimizer_args.get("rank", max(1, model_config.hidden_size // 4))
        kwargs.update(rank=rank, leading=max(1, rank * 40 // 128),  # leading follows a user's rank too
                      update_interval=max(1, round(train_config.steps * 200 / 10_000)))
    return {**kwargs, **train_config.optimizer_args}


def lr_factor(step: int, cfg: LMTrainConfig) -> float:
    """Multiplier of the peak lr at ``step`` (0-based): linear warm-up, then cosine down to ``min_lr_ratio``."""
    warmup = int(cfg.warmup * cfg.steps)
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, cfg.steps - warmup)
    return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def next_byte_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy (nats per byte) of predicting targets y (B, T) from inputs x (B, T)."""
    logits = model(input_ids=x).logits  # (B, T, 256)
    return F.cross_entropy(logits.flatten(0, 1), y.flatten())


@torch.no_grad()
def evaluate(model: nn.Module, blocks: torch.Tensor, batch_size: int = 32) -> float:
    """Mean next-byte loss over (N, T + 1) held-out blocks, every block weighted equally."""
    was_training = model.training
    model.eval()
    total = 0.0
    for i in range(0, len(blocks), batch_size):
        chunk = blocks[i:i + batch_size]  # (b, T + 1)
        total += next_byte_loss(model, chunk[:, :-1], chunk[:, 1:]).item() * len(chunk)
    model.train(was_training)
    return total / len(blocks)


def _eval_point(step: int, loss: float, lr: float, train_loss: float | None) -> dict[str, float]:
    point = {"step": step, "held_out_loss": loss, "held_out_perplexity": math.exp(loss), "lr": lr}
    if train_loss is not None:
        point["train_loss"] = train_loss
    return point


def train_lm(model_config: LMModelConfig, train_config: LMTrainConfig, corpus: Corpus,
             progress: bool = True) -> LMResult:
    """Train a fresh LM on ``corpus``; returns the final model, metrics and curves.

    Raises:
        ValueError: the block does not fit the model's positions or the text.
        FloatingPointError: the loss became non-finite (the message names the lr to lower).
    """
    from veil.training.optim import build_optimizer, optimizer_state_bytes

    cfg = train_config
    if cfg.block_size > model_config.max_positions:
        raise ValueError(f"LMTrainConfig.block_size: expected <= LMModelConfig.max_positions="
                         f"{model_config.max_positions}, received {cfg.block_size}")
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    blocks = eval_blocks(corpus.held_out, cfg.block_size, cfg.eval_blocks)  # (N, T + 1)
    model = build_lm(model_config, seed=cfg.seed)
    model.train()
    kwargs = optimizer_kwargs(model_config, cfg)
    optimizer = build_optimizer(cfg.optimizer, model, lr=cfg.peak_lr, **kwargs)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, cfg))
    generator = torch.Generator().manual_seed(cfg.seed)

    history = [_eval_point(0, evaluate(model, blocks), cfg.peak_lr * lr_factor(0, cfg), None)]
    train_loss: list[float] = []
    start = time.perf_counter()
    bar = progress_bar(range(1, cfg.steps + 1), desc=f"train lm ({cfg.optimizer})", enabled=progress, leave=False)
    for step in bar:
        x, y = sample_batch(corpus.train, cfg.batch_size, cfg.block_size, generator)  # (B, T) each
        loss = next_byte_loss(model, x, y)
        if not torch.isfinite(loss):
            raise FloatingPointError(f"training diverged at step {step}: loss {loss.item()}; lower --lr "
                                     f"(received {cfg.peak_lr}) for optimizer {cfg.optimizer!r}")
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if cfg.grad_clip:
            nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        lr = optimizer.param_groups[0]["lr"]
        optimizer.step()
        scheduler.step()
        train_loss.append(loss.item())
        if step % cfg.eval_every == 0 or step == cfg.steps:
            recent = train_loss[-cfg.eval_every:]
            history.append(_eval_point(step, evaluate(model, blocks), lr, sum(recent) / len(recent)))
            bar.set_postfix(loss=f"{loss.item():.3f}", held_out=f"{history[-1]['held_out_loss']:.3f}")
    seconds = time.perf_counter() - start
    model.eval()
    final = history[-1]["held_out_loss"]
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    metrics = {
        "held_out_loss": final,
        "held_out_perplexity": math.exp(final),
        "held_out_bits_per_byte": final / math.log(2),
        "train_loss_last": sum(train_loss[-cfg.eval_every:]) / len(train_loss[-cfg.eval_every:]),
        "optimizer": cfg.optimizer,
        "lr": cfg.peak_lr,
        "optimizer_kwargs": kwargs,
        "optimizer_state_bytes": optimizer_state_bytes(optimizer),
        "parameter_bytes": param_bytes,
        "parameters": sum(p.numel() for p in model.parameters()),
        "train_seconds": round(seconds, 2),
        "tokens_seen": cfg.steps * cfg.batch_size * cfg.block_size,
        "held_out_blocks": len(blocks),
        "torch_threads": torch.get_num_threads(),
    }
    return LMResult(model, model_config, train_config, metrics, history, train_loss)


def save_lm(result: LMResult, out_dir: str | Path, corpus: Corpus) -> Path:
    """Write ``result`` as a checkpoint folder (config.json, model.safetensors, metrics.json), atomically."""
    from veil import __version__

    config = {"kind": "lm", "veil_version": __version__, "model": result.model_config.to_dict(),
              "train": result.train_config.to_dict(), "data": corpus.describe(),
              "llama_config": llama_config(result.model_config).to_dict()}
    metrics = {**result.metrics, "history": result.history, "train_loss": result.train_loss}
    state = result.model.state_dict()
    if result.model_config.tie_embeddings:  # one tensor under two names: safetensors stores it once
        state.pop("lm_head.weight")
    return save_checkpoint(out_dir, config, state, metrics)


def load_lm(path: str | Path) -> tuple[nn.Module, dict[str, Any]]:
    """Rebuild a saved LM in eval mode; returns (model, config.json)."""
    config, state, _ = load_checkpoint(path)
    if config.get("kind") != "lm":
        raise ValueError(f"checkpoint {str(path)!r}: expected kind 'lm', received {config.get('kind')!r}")
    model_config = LMModelConfig.from_dict(config["model"])
    model = build_lm(model_config)
    if model_config.tie_embeddings:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    model.load_state_dict(state)
    return model.eval(), config
