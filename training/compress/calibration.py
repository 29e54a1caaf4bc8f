"""Calibration data for every compression stage: a fixed list of token batches plus a hash of them.

Stages read ``Calibration.batches`` (each a dict with ``input_ids`` (B, T) int64 and, where sequences are
padded, ``attention_mask`` (B, T) int64) and never download anything. The constructors cover what users have:
a local text file, a list of strings (with a transformers tokenizer, or bytes for veil's byte LMs), an already
tokenised tensor, or a callable that yields batches. ``sha256`` is computed over the token ids and masks, so the
compressed artefact records *which* data calibrated it without storing the data (privacy and provenance).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import torch

Batch = dict[str, torch.Tensor]


def _digest(batches: list[Batch]) -> str:
    """SHA-256 over every batch's tensors (name, shape, int64 bytes), in order."""
    h = hashlib.sha256()
    for batch in batches:
        for key in sorted(batch):
            t = batch[key].detach().to(torch.int64).contiguous().cpu()
            h.update(key.encode())
            h.update(str(tuple(t.shape)).encode())
            h.update(t.numpy().tobytes())
    return h.hexdigest()


def _check_batch(batch: Any, where: str) -> Batch:
    """One batch as a dict of int64 tensors; a bare (B, T) tensor becomes ``{"input_ids": ...}``."""
    if isinstance(batch, torch.Tensor):
        batch = {"input_ids": batch}
    if not isinstance(batch, dict) or "input_ids" not in batch:
        raise ValueError(f"{where}: expected a dict with 'input_ids' or a (B, T) tensor, received {type(batch).__name__}")
    out: Batch = {}
    for key, value in batch.items():
        value = torch.as_tensor(value)
        if key in ("input_ids", "attention_mask", "token_type_ids"):
            if value.dim() == 1:
                value = value.unsqueeze(0)
            if value.dim() != 2 or value.is_floating_point():
                raise ValueError(f"{where}.{key}: expected a (B, T) integer tensor, received "
                                 f"{tuple(value.shape)} {value.dtype}")
            value = value.long()
        out[key] = value
    if "attention_mask" in out and out["attention_mask"].shape != out["input_ids"].shape:
        raise ValueError(f"{where}.attention_mask: expected shape {tuple(out['input_ids'].shape)}, received "
                         f"{tuple(out['attention_mask'].shape)}")
    return out


class Calibration:
    """A fixed, ordered list of token batches and the SHA-256 of its content.

    Example:
        >>> cal = Calibration.from_texts(["def f(): pass", "import os"])   # byte-level
        >>> cal.batches[0]["input_ids"].shape
        torch.Size([2, 13])
    """

    def __init__(self, batches: Iterable[Any], source: str = "batches") -> None:
        self.batches: list[Batch] = [_check_batch(b, f"calibration batch {i}") for i, b in enumerate(batches)]
        if not self.batches:
            raise ValueError(f"calibration ({source}): expected at least one batch, received none")
        self.source = source
        self.sha256 = _digest(self.batches)

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self) -> Iterator[Batch]:
        return iter(self.batches)

    @property
    def num_sequences(self) -> int:
        return sum(len(b["input_ids"]) for b in self.batches)

    @property
    def num_tokens(self) -> int:
        """Real (unpadded) tokens over all batches."""
        return sum(int(b["attention_mask"].sum()) if "attention_mask" in b else b["input_ids"].numel()
                   for b in self.batches)

    def describe(self) -> dict[str, Any]:
        """What the report and the artefact record about the data (never the data itself)."""
        return {"source": self.source, "sha256": self.sha256, "batches": len(self.batches),
                "sequences": self.num_sequences, "tokens": self.num_tokens}

    # ------------------------------------------------------------------ constructors

    @classmethod
    def from_tokens(cls, tokens: torch.Tensor, batch_size: int = 8, seq_len: int | None = None,
                    source: str = "tokens") -> Calibration:
        """From token ids: a (N, T) tensor is split into batches; a 1-D stream is first cut into (N, seq_len) windows."""
        tokens = torch.as_tensor(tokens)
        if tokens.is_floating_point():
            raise ValueError(f"calibration tokens: expected an integer tensor, received {tokens.dtype}")
        if tokens.dim() == 1:
            if not seq_len or seq_len < 1:
                raise ValueError(f"calibration seq_len: expected >= 1 for a 1-D token stream, received {seq_len}")
            n = len(tokens) // seq_len
            if n < 1:
                raise ValueError(f"calibration seq_len: expected <= {len(tokens)} (stream length), received {seq_len}")
            tokens = tokens[: n * seq_len].view(n, seq_len)  # (N, seq_len)
        if tokens.dim() != 2:
            raise ValueError(f"calibration tokens: expected a (N, T) or (N,) tensor, received {tuple(tokens.shape)}")
        if batch_size < 1:
            raise ValueError(f"calibration batch_size: expected >= 1, received {batch_size}")
        return cls([{"input_ids": tokens[i:i + batch_size].long()} for i in range(0, len(tokens), batch_size)], source)

    @classmethod
    def from_bytes(cls, data: bytes | torch.Tensor, seq_len: int = 128, num_sequences: int = 32,
                   batch_size: int = 8, source: str = "bytes") -> Calibration:
        """Byte-level path for veil's byte LMs: ``num_sequences`` windows of ``seq_len`` bytes, evenly spaced over
        ``data`` (deterministic: no seed needed, and the whole text is covered)."""
        stream = data if isinstance(data, torch.Tensor) else torch.frombuffer(bytearray(data), dtype=torch.uint8)
        stream = stream.long().flatten()
        if len(stream) < seq_len:
            raise ValueError(f"calibration seq_len: expected <= {len(stream)} (bytes of data), received {seq_len}")
        if num_sequences < 1:
            raise ValueError(f"calibration num_sequences: expected >= 1, received {num_sequences}")
        starts = torch.linspace(0, len(stream) - seq_len, num_sequences).round().long().unique()
        windows = torch.stack([stream[s:s + seq_len] for s in starts.tolist()])  # (N, seq_len)
        return cls.from_tokens(windows, batch_size, source=source)

    @classmethod
    def from_texts(cls, texts: list[str], tokenizer: Any = None, batch_size: int = 8, max_length: int = 128,
                   source: str = "texts") -> Calibration:
        """From strings: a transformers tokenizer (padding + attention mask), or bytes when ``tokenizer`` is None."""
        if not texts or not all(isinstance(t, str) for t in texts):
            raise ValueError("calibration texts: expected a non-empty list of strings")
        batches = []
        for i in range(0, len(texts), batch_size):
            chunk = texts[i:i + batch_size]
            if tokenizer is None:
                seqs = [torch.tensor(list(t.encode("utf-8")[:max_length]) or [32]) for t in chunk]
                width = max(len(s) for s in seqs)
                ids = torch.zeros(len(seqs), width, dtype=torch.long)  # (b, T), right-padded with 0
                mask = torch.zeros_like(ids)
                for j, s in enumerate(seqs):
                    ids[j, :len(s)], mask[j, :len(s)] = s, 1
                batches.append({"input_ids": ids, "attention_mask": mask})
            else:
                enc = tokenizer(chunk, padding=True, truncation=True, max_length=max_length, return_tensors="pt")
                batches.append({"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]})
        return cls(batches, source)

    @classmethod
    def from_text_file(cls, path: str | Path, tokenizer: Any = None, seq_len: int = 128, num_sequences: int = 32,
                       batch_size: int = 8) -> Calibration:
        """A local text file: byte windows (``tokenizer`` None, veil's byte LMs) or its non-empty paragraphs
        tokenised (the first ``num_sequences``)."""
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"--calibration: expected an existing file, received {str(path)!r}")
        source = f"file:{path.name}"
        if tokenizer is None:
            return cls.from_bytes(path.read_bytes(), seq_len, num_sequences, batch_size, source)
        text = path.read_text(encoding="utf-8", errors="replace")
        paragraphs = [p.strip() for p in text.split("\n\n") if p.strip()][:num_sequences]
        return cls.from_texts(paragraphs, tokenizer, batch_size, seq_len, source)

    @classmethod
    def from_callable(cls, fn: Callable[[], Iterable[Any]], source: str = "callable") -> Calibration:
        """From a function returning batches (dicts with ``input_ids`` or (B, T) tensors); it is called once."""
        return cls(list(fn()), source)
