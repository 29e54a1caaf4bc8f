"""Tiny random-init BERTs (no hub) shared by the adapter tests."""

from __future__ import annotations

import pytest
import torch
from transformers import BertConfig, BertForSequenceClassification

TINY = {"vocab_size": 64, "hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2,
        "intermediate_size": 32, "max_position_embeddings": 32, "num_labels": 3}


def make_bert(seed: int = 0) -> BertForSequenceClassification:
    """A 2-layer, hidden-16 BERT classifier; the same seed gives the same weights."""
    torch.manual_seed(seed)
    return BertForSequenceClassification(BertConfig(**TINY)).eval()


@pytest.fixture
def bert_factory():
    return make_bert


@pytest.fixture
def tokens() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return {"input_ids": torch.randint(0, TINY["vocab_size"], (3, 7), generator=g),
            "attention_mask": torch.ones(3, 7, dtype=torch.long)}


def randomize(model: torch.nn.Module, seed: int = 2) -> None:
    """Give every trainable tensor random values (a zero-init B would make parity tests vacuous)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)


@pytest.fixture
def randomize_trainable():
    return randomize
