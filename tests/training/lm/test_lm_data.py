"""Bundled and own-text corpora: a fixed, disjoint held-out split; the byte tokenizer; deterministic batches."""

from __future__ import annotations

import pytest
import torch
from veil.training.lm import ByteTokenizer, load_pydoc_topics, load_text_file
from veil.training.lm.data import eval_blocks, sample_batch


@pytest.fixture(scope="module")
def corpus():
    return load_pydoc_topics()


def test_bundled_split_is_fixed_disjoint_and_about_a_tenth(corpus) -> None:
    from pydoc_data.topics import topics

    again = load_pydoc_topics()
    assert torch.equal(again.train, corpus.train) and torch.equal(again.held_out, corpus.held_out)
    held = corpus.describe()["held_out_documents"]
    assert held == sorted(held) and 0 < len(held) < len(topics) == corpus.documents
    train_bytes = corpus.train.numpy().tobytes()
    assert not any(topics[k].encode() in train_bytes for k in held)  # whole topics, none in train
    held_bytes = corpus.held_out.numpy().tobytes()
    assert all(topics[k].encode() in held_bytes for k in held)
    share = len(corpus.held_out) / (len(corpus.held_out) + len(corpus.train))
    assert 0.08 < share <= 0.1
    assert load_pydoc_topics(held_out=0.2).describe()["held_out_documents"] != held


@pytest.mark.parametrize("text", ["def f(x):\n    return x ** 2\n", "naïve café — 東京 🐍", ""])
def test_byte_tokenizer_round_trips(text: str) -> None:
    tok = ByteTokenizer()
    ids = tok.encode(text)
    assert ids.dtype == torch.int64 and len(ids) == len(text.encode()) and tok.decode(ids) == text
    assert torch.equal(tok.encode(text.encode()), ids)


def test_byte_tokenizer_refuses_ids_outside_a_byte() -> None:
    with pytest.raises(ValueError, match=r"ByteTokenizer.decode: expected ids in 0..255, received 3..256"):
        ByteTokenizer().decode([3, 256])


def test_batches_are_deterministic_by_seed_and_shifted_by_one(corpus) -> None:
    draw = lambda seed: sample_batch(corpus.train, 4, 32, torch.Generator().manual_seed(seed))  # noqa: E731
    (x, y), (x2, y2), (x3, _) = draw(0), draw(0), draw(1)
    assert x.shape == y.shape == (4, 32) and torch.equal(x, x2) and torch.equal(y, y2) and not torch.equal(x, x3)
    assert torch.equal(x[:, 1:], y[:, :-1])
    blocks = eval_blocks(corpus.held_out, 32, max_blocks=10)
    assert blocks.shape == (10, 33) and torch.equal(blocks[0], corpus.held_out[:33].long())
    assert len(eval_blocks(corpus.held_out, 32)) == len(corpus.held_out) // 33


def test_own_text_file_is_chunked_and_split(tmp_path) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("".join(f"line {i}: the quick brown fox jumps over the lazy dog\n" for i in range(2000)))
    corpus = load_text_file(path)
    info = corpus.describe()
    assert info["source"] == "file:notes.txt" and info["documents"] == 27  # 108,890 bytes in 4096-byte chunks
    assert 0 < info["bytes"]["held_out"] <= 0.1 * path.stat().st_size
    assert torch.equal(load_text_file(path).held_out, corpus.held_out)
    small = tmp_path / "small.txt"
    small.write_text("x" * 400)
    assert load_text_file(small).documents == 20  # a small file still gets a held-out chunk


def test_own_text_errors_name_the_problem(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match="--text: expected an existing file"):
        load_text_file(tmp_path / "missing.txt")
    (tmp_path / "tiny.txt").write_text("short")
    with pytest.raises(ValueError, match="expected at least 20 bytes, received 5"):
        load_text_file(tmp_path / "tiny.txt")
    with pytest.raises(ValueError, match=r"held_out: expected a fraction in \(0, 1\), received 1.5"):
        load_pydoc_topics(held_out=1.5)
