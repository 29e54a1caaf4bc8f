"""The LM itself: a transformers ``LlamaForCausalLM`` over bytes, built from an :class:`LMModelConfig`."""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from .config import LMModelConfig
from .data import ByteTokenizer


def llama_config(config: LMModelConfig) -> LlamaConfig:
    """The transformers config of ``config``: Llama defaults (RMSNorm, SwiGLU, RoPE) at the given sizes."""
    return LlamaConfig(vocab_size=ByteTokenizer.vocab_size, hidden_size=config.hidden_size,
                       num_hidden_layers=config.num_layers, num_attention_heads=config.num_heads,
                       num_key_value_heads=config.num_heads, intermediate_size=config.intermediate_size,
                       max_position_embeddings=config.max_positions, tie_word_embeddings=config.tie_embeddings,
                       use_cache=False, bos_token_id=None, eos_token_id=None, pad_token_id=None)


def build_lm(config: LMModelConfig, seed: int | None = None) -> LlamaForCausalLM:
    """A randomly initialised model (transformers' Llama init: normal(0, 0.02)); ``seed`` fixes the draw."""
    if seed is not None:
        torch.manual_seed(seed)
    return LlamaForCausalLM(llama_config(config))
