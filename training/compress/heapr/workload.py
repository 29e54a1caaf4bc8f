"""The tiny MoE LM HEAPr is measured on: a transformers Qwen2-MoE or Mixtral over the 256 byte values, trained a
few minutes on Python's ``pydoc_data.topics`` (veil.training.lm's fixed held-out split) with a fixed seed.

Training: random windows of the train stream, next-byte cross-entropy plus the router's load-balancing loss
(so experts specialise instead of collapsing), AdamW with warm-up and cosine decay, gradient clipping.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn
from veil.training.lm.data import Corpus, eval_blocks, sample_batch

from veil.config import Config, ConfigError, field


@dataclass
class MoELMConfig(Config):
    """Sizes and training of the tiny byte-level MoE LM (spec §5: hidden 64, 3 layers, 8 experts, top-2, F=32)."""

    arch: Literal["qwen2_moe", "mixtral"] = field("qwen2_moe", "qwen2_moe (with a shared expert) or mixtral")
    hidden_size: int = field(64, "model width")
    num_layers: int = field(3, "decoder blocks (every one a sparse MoE block)")
    num_heads: int = field(4, "attention heads")
    num_experts: int = field(8, "routed experts per layer")
    top_k: int = field(2, "experts per token")
    expert_size: int = field(32, "intermediate width F of every routed expert")
    shared_expert_size: int = field(64, "shared expert width (qwen2_moe only)")
    max_positions: int = field(256, "longest sequence (RoPE positions)")
    steps: int = field(1200, "AdamW steps")
    batch_size: int = field(16, "windows per step")
    block_size: int = field(128, "bytes per window")
    lr: float = field(3e-3, "peak learning rate")
    warmup: float = field(0.05, "fraction of steps of linear warm-up (then cosine to 10 %)")
    aux_loss: float = field(0.01, "weight of the router load-balancing loss")
    seed: int = field(0, "seed of initialisation and batch sampling")

    def validate(self) -> None:
        if self.top_k > self.num_experts:
            raise ConfigError(f"MoELMConfig.top_k: expected <= num_experts={self.num_experts}, received {self.top_k}")
        if self.hidden_size % (2 * self.num_heads):
            raise ConfigError(f"MoELMConfig.hidden_size: expected a multiple of 2*num_heads, received "
                              f"{self.hidden_size}")


def build_moe_lm(config: MoELMConfig, seed: int | None = None) -> nn.Module:
    """A randomly initialised transformers MoE causal LM (fused v5 expert tensors) over 256 byte ids."""
    from transformers import MixtralConfig, MixtralForCausalLM, Qwen2MoeConfig, Qwen2MoeForCausalLM

    common = dict(vocab_size=256, hidden_size=config.hidden_size, num_hidden_layers=config.num_layers,
                  num_attention_heads=config.num_heads, num_key_value_heads=config.num_heads,
                  max_position_embeddings=config.max_positions, num_experts_per_tok=config.top_k,
                  tie_word_embeddings=False, output_router_logits=True, router_aux_loss_coef=config.aux_loss,
                  bos_token_id=None, eos_token_id=None, pad_token_id=None)
    if seed is not None:
        torch.manual_seed(seed)
    if config.arch == "qwen2_moe":
        hf = Qwen2MoeConfig(num_experts=config.num_experts, moe_intermediate_size=config.expert_size,
                            shared_expert_intermediate_size=config.shared_expert_size,
                            intermediate_size=config.shared_expert_size, norm_topk_prob=False, **common)
        model = Qwen2MoeForCausalLM(hf)
    else:
        model = MixtralForCausalLM(MixtralConfig(num_local_experts=config.num_experts,
                                                 intermediate_size=config.expert_size, **common))
    model.config.output_router_logits = False  # evaluation and calibration need no aux loss
    return model


def lm_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor, aux: bool = False) -> torch.Tensor:
    """Mean next-byte cross-entropy of targets y (B, T) from inputs x (B, T); plus the weighted load-balancing
    loss when ``aux``."""
    out = model(input_ids=x, output_router_logits=aux)
    loss = F.cross_entropy(out.logits.flatten(0, 1), y.flatten())  # logits (B, T, 256)
    return loss + model.config.router_aux_loss_coef * out.aux_loss if aux else loss


@torch.no_grad()
def held_out_loss(model: nn.Module, blocks: torch.Tensor, batch_size: int = 16) -> float:
    """Mean next-byte loss (nats) over (N, T + 1) held-out blocks."""
    model.eval()
    total = sum(lm_loss(model, b[:, :-1], b[:, 1:]).item() * len(b) for b in blocks.split(batch_size))
    return total / len(blocks)


def train_moe_lm(config: MoELMConfig, corpus: Corpus, eval_count: int = 64) -> tuple[nn.Module, dict[str, Any]]:
    """Train a fresh MoE LM on ``corpus.train``; returns the model (eval mode) and its metrics."""
    model = build_moe_lm(config, seed=config.seed)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=0.0)
    warm = max(1, int(config.warmup * config.steps))

    def factor(step: int) -> float:
        if step < warm:
            return (step + 1) / warm
        return 0.1 + 0.45 * (1 + math.cos(math.pi * (step - warm) / max(1, config.steps - warm)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, factor)
    gen = torch.Generator().manual_seed(config.seed)
    start = time.perf_counter()
    for _ in range(config.steps):
        x, y = sample_batch(corpus.train, config.batch_size, config.block_size, gen)  # (B, T) each
        loss = lm_loss(model, x, y, aux=True)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
    seconds = time.perf_counter() - start
    model.eval()
    loss = held_out_loss(model, eval_blocks(corpus.held_out, config.block_size, eval_count))
    return model, {"held_out_loss": loss, "held_out_perplexity": math.exp(loss), "train_seconds": round(seconds, 1),
                   "config": config.to_dict()}
