"""Text for `veil train lm`: the bundled Python docs, users' text files, a byte tokenizer and batches.

Bundled text: Python's ``pydoc_data.topics.topics`` (the ``help()`` pages: 79 topics, ~466 kB on
Python 3.11; the exact text follows the interpreter's version, so ``describe()`` records it). Topics are
taken in sorted-key order and joined by a blank line. A user's file is cut into equal chunks that play the
part of topics.

Held-out split: whole documents (topics or chunks), never a window cut across the boundary. The
documents are shuffled with a fixed split seed (independent of the training seed) and, in that order,
each goes to the held-out set if it still fits in ``held_out`` of the bytes; so every run on the same
text evaluates on the same bytes (bundled, Python 3.11: 10.0 % of the bytes in 21 topics).

Tokenizer: byte-level (vocabulary 256 = the byte values). It needs no download and no training, reads
any file (any encoding, even invalid UTF-8), round-trips every byte exactly, and its vocabulary does not
depend on the data, so a checkpoint trained on one text can be evaluated on another. The price is longer
sequences than a BPE tokenizer (~4x for English), which a tiny model with a 128-byte context can afford.
"""

from __future__ import annotations

import math
import platform
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

SPLIT_SEED = 0  # fixed: the held-out bytes must not move with the training seed
SEPARATOR = b"\n\n"  # between documents of a stream
MAX_CHUNK_BYTES = 4096  # a user's file is cut into chunks of at most this size ...
MIN_CHUNKS = 20  # ... and into at least this many, so a small file still has a held-out part


def _bytes_tensor(data: bytes) -> torch.Tensor:
    """(N,) uint8 view of ``data`` (torch.frombuffer refuses an empty buffer)."""
    return torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)


class ByteTokenizer:
    """Byte-level tokenizer: token id = byte value (0..255); exact round trip for any text."""

    vocab_size = 256

    def encode(self, text: str | bytes) -> torch.Tensor:
        """(N,) int64 token ids of ``text`` (str is encoded as UTF-8)."""
        data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
        return _bytes_tensor(data).long()

    def decode(self, ids: torch.Tensor | list[int]) -> str:
        """Text of token ids; a byte sequence that is not valid UTF-8 decodes with U+FFFD in its place."""
        values = ids.tolist() if isinstance(ids, torch.Tensor) else list(ids)
        if any(not 0 <= v < 256 for v in values):
            raise ValueError(f"ByteTokenizer.decode: expected ids in 0..255, received {min(values)}..{max(values)}")
        return bytes(values).decode("utf-8", errors="replace")


@dataclass
class Corpus:
    """Train and held-out byte streams (uint8 tensors) and what a checkpoint needs to describe them."""

    train: torch.Tensor  # (N_train,) uint8
    held_out: torch.Tensor  # (N_held_out,) uint8
    source: str
    held_out_documents: list[str]
    documents: int

    def describe(self) -> dict[str, Any]:
        return {"source": self.source, "tokenizer": "bytes", "documents": self.documents,
                "held_out_documents": self.held_out_documents,
                "bytes": {"train": len(self.train), "held_out": len(self.held_out)},
                "split_seed": SPLIT_SEED, "python": platform.python_version()}


def split_documents(docs: dict[str, bytes], held_out: float, source: str) -> Corpus:
    """Seeded split of whole documents: shuffled keys go to held-out while they fit in ``held_out`` of the bytes."""
    if not 0.0 < held_out < 1.0:
        raise ValueError(f"held_out: expected a fraction in (0, 1), received {held_out}")
    if len(docs) < 2:
        raise ValueError(f"{source}: expected at least 2 documents to split, received {len(docs)}")
    keys = sorted(docs)
    order = torch.randperm(len(keys), generator=torch.Generator().manual_seed(SPLIT_SEED)).tolist()
    budget = held_out * sum(len(v) for v in docs.values())
    chosen: set[str] = set()
    size = 0
    for i in order:  # a document that would overshoot the budget stays in train
        if size + len(docs[keys[i]]) <= budget:
            chosen.add(keys[i])
            size += len(docs[keys[i]])
    if not chosen:
        raise ValueError(f"{source}: held_out={held_out} is smaller than every document; expected a larger fraction")

    def stream(names: list[str]) -> torch.Tensor:
        return _bytes_tensor(SEPARATOR.join(docs[k] for k in names))

    held = [k for k in keys if k in chosen]
    return Corpus(stream([k for k in keys if k not in chosen]), stream(held), source, held, len(keys))


def load_pydoc_topics(held_out: float = 0.1) -> Corpus:
    """The bundled text: Python's help topics (``pydoc_data.topics``), split by topic."""
    from pydoc_data.topics import topics

    return split_documents({k: v.encode("utf-8") for k, v in topics.items()}, held_out, "bundled:pydoc_topics")


def load_text_file(path: str | Path, held_out: float = 0.1) -> Corpus:
    """A user's file read as raw bytes, cut into equal chunks (<= 4096 bytes, >= 20 of them), split by chunk."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"--text: expected an existing file, received {str(path)!r}")
    data = path.read_bytes()
    if len(data) < MIN_CHUNKS:
        raise ValueError(f"--text {str(path)!r}: expected at least {MIN_CHUNKS} bytes, received {len(data)}")
    size = min(MAX_CHUNK_BYTES, len(data) // MIN_CHUNKS)
    width = len(str(math.ceil(len(data) / size)))
    docs = {f"chunk{i // size:0{width}d}": data[i:i + size] for i in range(0, len(data), size)}
    return split_documents(docs, held_out, f"file:{path.name}")


def sample_batch(stream: torch.Tensor, batch_size: int, block_size: int,
                 generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Random windows of ``stream``: inputs (B, T) and next-byte targets (B, T), int64, drawn from ``generator``."""
    if len(stream) < block_size + 1:
        raise ValueError(f"block_size: expected at most {len(stream) - 1} (train bytes - 1), received {block_size}")
    starts = torch.randint(0, len(stream) - block_size, (batch_size,), generator=generator)
    windows = torch.stack([stream[s:s + block_size + 1] for s in starts.tolist()]).long()  # (B, T + 1)
    return windows[:, :-1], windows[:, 1:]


def eval_blocks(stream: torch.Tensor, block_size: int, max_blocks: int = 0) -> torch.Tensor:
    """Non-overlapping (N, T + 1) int64 blocks of the held-out stream; ``max_blocks`` > 0 keeps that many, evenly spaced."""
    n = len(stream) // (block_size + 1)
    if n < 1:
        raise ValueError(f"block_size: expected at most {len(stream) - 1} (held-out bytes - 1), received {block_size}")
    blocks = stream[: n * (block_size + 1)].view(n, block_size + 1).long()  # (N, T + 1)
    if 0 < max_blocks < n:
        blocks = blocks[torch.linspace(0, n - 1, max_blocks).round().long()]
    return blocks
