"""all-MiniLM-L6-v2 export: parity with sentence-transformers, fusions, int8 quality, tokenizer alongside."""

from __future__ import annotations

import json

import numpy as np
import pytest
from veil.export import export_sentence_encoder
from veil.export.encoder import resolve_encoder, sample_sentences
from veil.export.validate import cpu_session

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    path = tmp_path_factory.mktemp("repo")
    fp32 = export_sentence_encoder("bundled:all-MiniLM-L6-v2", path, name="minilm")
    int8 = export_sentence_encoder("bundled:all-MiniLM-L6-v2", path, name="minilm-int8", quantize="int8")
    return path, fp32, int8


def test_embeddings_match_sentence_transformers(repo) -> None:
    from sentence_transformers import SentenceTransformer
    from transformers import AutoTokenizer

    path, _, _ = repo
    sentences = sample_sentences(16)
    reference = SentenceTransformer(str(resolve_encoder("bundled:all-MiniLM-L6-v2")), device="cpu").encode(sentences)
    tokenizer = AutoTokenizer.from_pretrained(str(path / "minilm" / "1" / "tokenizer"))  # the copied files
    batch = tokenizer(sentences, padding=True, truncation=True, max_length=256, return_tensors="np")
    session = cpu_session(str(path / "minilm" / "1" / "model.onnx"))
    got = session.run(["sentence_embedding"], {"input_ids": batch["input_ids"].astype(np.int64),
                                               "attention_mask": batch["attention_mask"].astype(np.int64)})[0]
    np.testing.assert_allclose(got, reference, atol=2e-5)


def test_manifest_records_validation_and_fusions(repo) -> None:
    path, fp32, _ = repo
    saved = json.loads((path / "minilm" / "veil.json").read_text())
    assert saved["kind"] == "sentence-embedding" and saved["normalize"] is True
    assert saved["validation"]["inputs"] == {"input_ids": ["batch", "sequence"], "attention_mask": ["batch", "sequence"]}
    fused = fp32["optimization"]["fused_ops"]
    assert fused.get("LayerNormalization", 0) >= 12 and fused.get("BiasGelu", 0) == 6  # asserted: fusions silently miss
    assert fp32["optimization"]["validation"]["passed"]
    config = (path / "minilm" / "config.pbtxt").read_text()
    assert "TYPE_INT64" in config and "dims: [ -1 ]" in config and "dims: [ 384 ]" in config


def test_int8_keeps_mean_cosine_above_0_99(repo) -> None:
    _, _, int8 = repo
    quality = int8["quantization"]
    assert quality["mean_cosine"] >= 0.99 and quality["sentences"] == 64
