"""Train the tiny ARPC codec in two stages (as the paper): tokenizer, then the prior on its frozen tokens.

Stage 1 minimises ``L1 + MSE + w (1 - SSIM) + beta * commitment`` on random crops, with scale random
dropout (SRD: with probability ``srd`` the decoder sees only the first k >= 4 scales). Stage 2 tokenizes a
fixed set of larger crops once, builds the prior's inputs with the runtime's own numpy code
(``veil.codec.tokens.prior_inputs``) and minimises the bits' binary cross-entropy on the active channels.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from veil.codec.tokens import Geometry, prior_inputs

from veil.progress import progress as progress_bar

from ..checkpoint import load_checkpoint, save_checkpoint
from .config import CodecModelConfig, CodecTrainConfig
from .data import random_crops, sampling_weights
from .model import NextScalePrior, Tokenizer, bits_to_numpy


@dataclass
class CodecResult:
    """A trained tokenizer and prior with their configs and the training metrics."""

    tokenizer: Tokenizer
    prior: NextScalePrior
    model_config: CodecModelConfig
    train_config: CodecTrainConfig
    metrics: dict[str, Any]


def geometry(tokenizer: Tokenizer) -> Geometry:
    """The runtime's view of a tokenizer: scales, masks, learned code magnitudes."""
    cfg = tokenizer.cfg
    return Geometry(tuple(cfg.scales), tuple(cfg.bits), cfg.d, tuple(tokenizer.alphas()), cfg.stride, cfg.n_freq,
                    cfg.quant)


def cosine(step: int, steps: int) -> float:
    """lr multiplier: 5% linear warm-up then cosine to 0.05."""
    warm = max(1, steps // 20)
    if step < warm:
        return (step + 1) / warm
    return 0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * (step - warm) / max(1, steps - warm)))


def train_tokenizer(tok: Tokenizer, images: list[np.ndarray], cfg: CodecTrainConfig, progress: bool,
                    on_step: Callable[[int, dict[str, float]], None] | None = None) -> dict[str, float]:
    """Stage 1; ``on_step(step, metrics)`` runs after every step (periodic checkpoints)."""
    from pytorch_msssim import ssim

    rng, weights = np.random.default_rng(cfg.seed), sampling_weights(images)
    opt = torch.optim.AdamW(tok.parameters(), lr=cfg.lr, weight_decay=1e-4)
    K, losses = len(tok.cfg.scales), []
    bar = progress_bar(range(cfg.tokenizer_steps), desc="codec stage 1 (tokenizer)", enabled=progress)
    for step in bar:
        for group in opt.param_groups:
            group["lr"] = cfg.lr * cosine(step, cfg.tokenizer_steps)
        x = random_crops(images, cfg.batch_size, cfg.crop, rng, weights)  # (B, 3, S, S)
        keep = int(rng.integers(4, K)) if rng.random() < cfg.srd else K
        y, _, commit = tok(x, keep)
        loss = F.l1_loss(y, x) + F.mse_loss(y, x) + cfg.commit * commit
        if cfg.ssim_weight:
            loss = loss + cfg.ssim_weight * (1 - ssim(y + 0.5, x + 0.5, data_range=1.0, win_size=7))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(tok.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        bar.set_postfix(loss=f"{np.mean(losses[-50:]):.4f}")
        if on_step is not None:
            on_step(step + 1, {"tokenizer_loss": float(np.mean(losses[-50:]))})
    return {"tokenizer_loss": float(np.mean(losses[-50:]))}


@torch.no_grad()
def token_dataset(tok: Tokenizer, images: list[np.ndarray], cfg: CodecTrainConfig
                  ) -> tuple[torch.Tensor, ...]:
    """Prior training set: (feats, pos, sid, targets, active) of ``prior_crops`` crops, one sequence each."""
    rng, weights = np.random.default_rng(cfg.seed + 1), sampling_weights(images)
    geo, rows = geometry(tok), []
    for start in range(0, cfg.prior_crops, 16):
        x = random_crops(images, min(16, cfg.prior_crops - start), cfg.prior_crop, rng, weights)
        z = tok.encoder(x)
        _, tokens, _ = tok.quantize(z)
        h, w = z.shape[2:]
        for i in range(x.shape[0]):
            bits = bits_to_numpy(tokens, i)
            feats, pos, sid = prior_inputs(bits, h, w, geo, geo.K - 1)
            target = np.zeros((sid.shape[1], geo.d), np.float32)
            active = np.zeros_like(target)
            offset = 0
            for b in bits:
                n = b.shape[0] * b.shape[1]
                target[offset:offset + n, :b.shape[2]] = b.reshape(n, -1)
                active[offset:offset + n, :b.shape[2]] = 1.0
                offset += n
            rows.append((feats[0], pos[0], sid[0], target, active))
    return tuple(torch.from_numpy(np.stack(col)) for col in zip(*rows, strict=True))


def train_prior(prior: NextScalePrior, data: tuple[torch.Tensor, ...], cfg: CodecTrainConfig, progress: bool,
                on_step: Callable[[int, dict[str, float]], None] | None = None) -> dict[str, float]:
    """Stage 2 on the frozen tokens of :func:`token_dataset`; ``on_step`` as in :func:`train_tokenizer`."""
    feats, pos, sid, target, active = data
    rng = np.random.default_rng(cfg.seed + 2)
    opt = torch.optim.AdamW(prior.parameters(), lr=cfg.lr, weight_decay=1e-4)
    losses = []
    bar = progress_bar(range(cfg.prior_steps), desc="codec stage 2 (prior)", enabled=progress)
    for step in bar:
        for group in opt.param_groups:
            group["lr"] = cfg.lr * cosine(step, cfg.prior_steps)
        idx = torch.from_numpy(rng.integers(feats.shape[0], size=cfg.batch_size))
        logits = prior(feats[idx], pos[idx], sid[idx])  # (B, L, d)
        bce = F.binary_cross_entropy_with_logits(logits, target[idx], reduction="none")
        loss = (bce * active[idx]).sum() / active[idx].sum() / math.log(2)  # bits per active bit
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(prior.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        bar.set_postfix(bits_per_bit=f"{np.mean(losses[-50:]):.4f}")
        if on_step is not None:
            on_step(step + 1, {"prior_bits_per_active_bit": float(np.mean(losses[-50:]))})
    return {"prior_bits_per_active_bit": float(np.mean(losses[-50:]))}


def train_codec(model_config: CodecModelConfig, train_config: CodecTrainConfig, images: list[np.ndarray],
                progress: bool = True, checkpoint: Callable[[CodecResult], None] | None = None,
                tokenizer: Tokenizer | None = None) -> CodecResult:
    """Both stages, deterministic for a seed on one machine (single-threaded by default).

    ``checkpoint`` receives a usable (tokenizer, prior) pair every ``train_config.checkpoint_every`` steps of
    either stage (during stage 1 the prior is still untrained: its metrics say ``stage: tokenizer``). A given
    ``tokenizer`` (e.g. from a stopped run's checkpoint) skips stage 1 and trains only the prior on it.
    """
    torch.manual_seed(train_config.seed)
    threads = torch.get_num_threads()
    torch.set_num_threads(train_config.threads)
    every = train_config.checkpoint_every
    try:
        start = time.perf_counter()
        tok = tokenizer if tokenizer is not None else Tokenizer(model_config)
        prior = NextScalePrior(model_config)

        def save(stage: str) -> Callable[[int, dict[str, float]], None]:
            def on_step(step: int, metrics: dict[str, float]) -> None:
                if checkpoint is not None and every and step % every == 0:
                    elapsed = round(time.perf_counter() - start, 1)
                    checkpoint(CodecResult(tok, prior, model_config, train_config,
                                           {**metrics, "stage": stage, "step": step, "train_seconds": elapsed}))
            return on_step

        metrics: dict[str, Any] = {}
        if tokenizer is None:
            metrics |= train_tokenizer(tok, images, train_config, progress, save("tokenizer"))
        tok.eval().requires_grad_(False)
        metrics |= train_prior(prior, token_dataset(tok, images, train_config), train_config, progress, save("prior"))
        prior.eval().requires_grad_(False)
        metrics["train_seconds"] = round(time.perf_counter() - start, 1)
        return CodecResult(tok, prior, model_config, train_config, metrics)
    finally:
        torch.set_num_threads(threads)


def save_codec(result: CodecResult, out: str | Path, images: list[str]) -> Path:
    """A checkpoint folder: config.json (model, train, training images), model.safetensors, metrics.json."""
    state = {f"tokenizer.{k}": v for k, v in result.tokenizer.state_dict().items()}
    state |= {f"prior.{k}": v for k, v in result.prior.state_dict().items()}
    config = {"kind": "codec", "model": result.model_config.to_dict(), "train": result.train_config.to_dict(),
              "images": images}
    return save_checkpoint(out, config, state, result.metrics)


def load_codec(path: str | Path) -> tuple[Tokenizer, NextScalePrior, dict[str, Any]]:
    """(tokenizer, prior, config) of a checkpoint folder written by :func:`save_codec`, in eval mode."""
    config, state, _ = load_checkpoint(path)
    if config.get("kind") != "codec":
        raise ValueError(f"checkpoint {str(path)!r}: expected kind 'codec', received {config.get('kind')!r}")
    cfg = CodecModelConfig.from_dict(config["model"])
    tok, prior = Tokenizer(cfg), NextScalePrior(cfg)
    tok.load_state_dict({k[10:]: v for k, v in state.items() if k.startswith("tokenizer.")})
    prior.load_state_dict({k[6:]: v for k, v in state.items() if k.startswith("prior.")})
    return tok.eval().requires_grad_(False), prior.eval().requires_grad_(False), config
