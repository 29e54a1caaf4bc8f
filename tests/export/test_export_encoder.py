"""all-MiniLM-L6-v2 export: parity with sentence-transformers, fusions (Attention), int8 quality, tokenizer alongside."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper
from veil.export import export_sentence_encoder
from veil.export.attention_fusion import canonicalize_bert_attention
from veil.export.encoder import load_sentence_encoder, resolve_encoder, sample_sentences
from veil.export.validate import TOLERANCES, cpu_session


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    path = tmp_path_factory.mktemp("repo")
    fp32 = export_sentence_encoder("bundled:all-MiniLM-L6-v2", path, name="minilm")
    int8 = export_sentence_encoder("bundled:all-MiniLM-L6-v2", path, name="minilm-int8", quantize="int8")
    return path, fp32, int8


@pytest.mark.slow
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


@pytest.mark.slow
def test_manifest_records_validation_and_fusions(repo) -> None:
    path, fp32, _ = repo
    saved = json.loads((path / "minilm" / "veil.json").read_text())
    assert saved["kind"] == "sentence-embedding" and saved["normalize"] is True
    assert saved["validation"]["inputs"] == {"input_ids": ["batch", "sequence"], "attention_mask": ["batch", "sequence"]}
    fused = fp32["optimization"]["fused_ops"]
    # asserted: fusions silently miss
    assert fused.get("Attention", 0) == 6 and fused.get("SkipLayerNormalization", 0) == 12 and fused.get("BiasGelu", 0) == 6
    assert fp32["optimization"]["validation"]["passed"]
    config = (path / "minilm" / "config.pbtxt").read_text()
    assert "TYPE_INT64" in config and "dims: [ -1 ]" in config and "dims: [ 384 ]" in config


@pytest.mark.slow
def test_int8_keeps_mean_cosine_above_0_99(repo) -> None:
    _, _, int8 = repo
    quality = int8["quantization"]
    assert quality["mean_cosine"] >= 0.99 and quality["sentences"] == 64
    assert int8["optimization"]["fused_ops"].get("MultiHeadAttention", 0) == 6  # Q/K/V stay MatMuls: int8 quantizes them
    assert int8["optimization"]["validation"]["passed"]  # that fp32 graph vs PyTorch, left-padded rows included


@pytest.mark.slow
def test_fused_attention_matches_torch_on_padded_batch(repo) -> None:
    path, _, _ = repo
    graph = onnx.load(str(path / "minilm" / "1" / "model.onnx"))
    attention = [n for n in graph.graph.node if n.op_type == "Attention" and n.domain == "com.microsoft"]
    assert len(attention) == 6
    model, config = load_sentence_encoder(resolve_encoder("bundled:all-MiniLM-L6-v2"))
    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(1000, config.vocab_size, (4, 40), generator=gen)
    mask = torch.zeros(4, 40, dtype=torch.long)
    for row, (start, stop) in enumerate([(0, 40), (0, 17), (0, 1), (11, 40)]):  # full, right-padded, one token, left-padded
        mask[row, start:stop] = 1
    with torch.no_grad():
        expected = model(ids * mask, mask).numpy()
    got = cpu_session(graph).run(["sentence_embedding"], {"input_ids": (ids * mask).numpy(), "attention_mask": mask.numpy()})[0]
    atol, rtol = TOLERANCES["float32"]
    assert np.max(np.abs(got - expected)) <= atol + rtol * np.max(np.abs(expected))


def _scores_graph(condition: list[onnx.NodeProto]) -> onnx.ModelProto:
    """softmax(x x^T / 2 + Where(cond, 0, min)) over tokens; ``condition`` computes ``cond`` from ``mask_bool``."""
    nodes = [
        helper.make_node("Cast", ["input_ids"], ["ids_float"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["ids_float", "axes_1_3"], ["x"]),  # (B, 1, T, 1)
        helper.make_node("Transpose", ["x"], ["x_t"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["x", "x_t"], ["qk"]),
        helper.make_node("Mul", ["qk", "scale"], ["scaled"]),
        helper.make_node("Cast", ["attention_mask"], ["mask_bool"], to=TensorProto.BOOL),
        *condition,
        helper.make_node("Where", ["cond", "zero", "fill"], ["bias"]),
        helper.make_node("Add", ["scaled", "bias"], ["scores"]),
        helper.make_node("Softmax", ["scores"], ["probs"], axis=-1),
    ]
    constants = {"axes_1_3": np.array([1, 3]), "axes_1_2": np.array([1, 2]), "scale": np.array(0.5, np.float32),
                 "zero": np.array(0, np.float32), "fill": np.array(np.finfo(np.float32).min, np.float32),
                 "causal": np.tril(np.ones((1, 1, 6, 6), bool))}
    graph = helper.make_graph(
        nodes, "scores", [helper.make_tensor_value_info(n, TensorProto.INT64, ["B", "T"]) for n in ("input_ids", "attention_mask")],
        [helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["B", 1, "T", "T"])],
        [numpy_helper.from_array(v, k) for k, v in constants.items() if any(k in n.input for n in nodes)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])


def test_canonicalization_keeps_values_and_yields_bert_mask() -> None:
    model = _scores_graph([helper.make_node("Unsqueeze", ["mask_bool", "axes_1_2"], ["cond"])])
    canonical, rewrites = canonicalize_bert_attention(model, head_size=4)
    assert rewrites == {"padding_masks": 1, "score_scales": 1}
    ops = [n.op_type for n in canonical.graph.node]
    assert "Where" not in ops and "Div" in ops and ops.count("Unsqueeze") == 3  # x's Unsqueeze + the mask's two
    feeds = {"input_ids": np.arange(12).reshape(2, 6) % 5, "attention_mask": np.array([[1] * 6, [1, 1, 1, 0, 0, 0]])}
    np.testing.assert_allclose(cpu_session(canonical).run(None, feeds)[0], cpu_session(model).run(None, feeds)[0],
                               rtol=1e-6, atol=1e-7)


def test_canonicalization_refuses_a_mask_that_is_not_padding() -> None:
    model = _scores_graph([helper.make_node("Unsqueeze", ["mask_bool", "axes_1_2"], ["padding"]),
                           helper.make_node("And", ["padding", "causal"], ["cond"])])
    with pytest.warns(UserWarning, match="to equal attention_mask"):
        canonical, rewrites = canonicalize_bert_attention(model, head_size=4)
    assert rewrites == {"padding_masks": 0, "score_scales": 1}
    assert "Where" in [n.op_type for n in canonical.graph.node]


def test_canonicalization_keeps_a_scale_that_is_not_one_over_sqrt_head_size() -> None:
    model = _scores_graph([helper.make_node("Unsqueeze", ["mask_bool", "axes_1_2"], ["cond"])])
    _, rewrites = canonicalize_bert_attention(model, head_size=16)  # 0.5 != 1 / sqrt(16): ORT would assume 0.25
    assert rewrites == {"padding_masks": 1, "score_scales": 0}
