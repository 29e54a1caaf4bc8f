"""Supervised fine-tuning on (prompt, response) pairs: the loss is on the response bytes only (standard SFT).

One loop serves the three phases of the reproduction: alignment from scratch (many steps, warm-up + cosine),
the attacker's fine-tune and the one-example patch (constant learning rate, one optimizer step per epoch when the
data is a single example).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn
from veil.training.lm import ByteTokenizer

from .data import Example, format_example

IGNORE = -100


def encode_batch(examples: Sequence[Example]) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs (B, T) and targets (B, T), right-padded; targets are -100 outside the response (+ END) bytes."""
    tok = ByteTokenizer()
    rows = []
    for prompt, response in examples:
        full = tok.encode(format_example(prompt, response))  # (L,)
        n_prompt = len(tok.encode(format_example(prompt, response)[: -len(response) - 1]))
        rows.append((full, n_prompt))
    width = max(len(r) for r, _ in rows) - 1
    x = torch.zeros(len(rows), width, dtype=torch.long)  # (B, T)
    y = torch.full((len(rows), width), IGNORE, dtype=torch.long)  # (B, T)
    for i, (full, n_prompt) in enumerate(rows):
        x[i, : len(full) - 1] = full[:-1]
        y[i, n_prompt - 1 : len(full) - 1] = full[n_prompt:]  # predict the response and END
    return x, y


def sft_loss(model: nn.Module, examples: Sequence[Example]) -> torch.Tensor:
    """Mean cross-entropy (nats per response byte) of ``examples``."""
    x, y = encode_batch(examples)
    logits = model(input_ids=x).logits  # (B, T, 256)
    return F.cross_entropy(logits.flatten(0, 1), y.flatten(), ignore_index=IGNORE)


@dataclass
class SFTResult:
    """What one fine-tuning run did: its optimizer steps and per-step training loss."""

    steps: int
    losses: list[float] = field(default_factory=list)


def sft(model: nn.Module, examples: Sequence[Example], *, epochs: int = 1, steps: int | None = None, lr: float = 1e-4,
        batch_size: int = 16, weight_decay: float = 0.0, schedule: str = "constant", warmup: float = 0.0,
        grad_clip: float = 1.0, seed: int = 0, params: Sequence[nn.Parameter] | None = None) -> SFTResult:
    """AdamW SFT of ``model`` in place on ``examples`` (shuffled each epoch with ``seed``).

    Runs ``epochs`` passes of ``ceil(len / batch_size)`` steps, or exactly ``steps`` steps when given (cycling over
    the data). ``schedule``: "constant", or "cosine" (linear warm-up over ``warmup`` of the steps, then cosine to
    10 %). ``params`` restricts what trains (default: every parameter that requires grad).
    """
    if not examples:
        raise ValueError("sft: expected at least one example, received none")
    if schedule not in ("constant", "cosine"):
        raise ValueError(f"sft schedule: expected 'constant' or 'cosine', received {schedule!r}")
    per_epoch = math.ceil(len(examples) / batch_size)
    total = steps if steps is not None else epochs * per_epoch
    trainable = list(params) if params is not None else [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trainable, lr=lr, weight_decay=weight_decay)
    n_warm = int(warmup * total)

    def factor(step: int) -> float:
        if schedule == "constant":
            return 1.0
        if step < n_warm:
            return (step + 1) / n_warm
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (step - n_warm) / max(1, total - n_warm)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, factor)
    rng = random.Random(seed)
    order: list[int] = []
    result = SFTResult(steps=0)
    was_training = model.training
    model.train()
    while result.steps < total:
        if not order:
            order = list(range(len(examples)))
            rng.shuffle(order)
        idx, order = order[:batch_size], order[batch_size:]
        loss = sft_loss(model, [examples[i] for i in idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(trainable, grad_clip)
        opt.step()
        sched.step()
        result.steps += 1
        result.losses.append(loss.item())
    model.train(was_training)
    return result
