"""Export a compressed model (``veil compress``) to a model repository: each FactorizedLinear becomes two MatMuls
in the ONNX graph.

Byte LMs export as ``input_ids (B, T) int64 -> logits (B, T, 256)``; sentence encoders as
``input_ids, attention_mask -> sentence_embedding``. Both are validated against torch (ORT vs torch on shapes
other than the export example) before the repository is written; the engine serves the folder as any ONNX model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import onnx
import torch
from torch import nn
from veil.training.compress.lowrank.layer import FactorizedLinear
from veil.training.encoder import SentenceEncoder

from veil.kinds import Kind

from .encoder import DYNAMIC, random_tokens
from .onnx_export import export_graph
from .repository import TensorSpec, write_model
from .validate import validate_export

LM_DYNAMIC = {"input_ids": {0: "batch", 1: "sequence"}}


class LMLogits(nn.Module):
    """A transformers causal LM as ``input_ids -> logits`` (the graph's one output)."""

    def __init__(self, lm: nn.Module) -> None:
        super().__init__()
        self.lm = lm

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:  # (B, T) -> (B, T, V)
        return self.lm(input_ids=input_ids).logits


def factorised_matmul_pairs(model: onnx.ModelProto) -> list[tuple[list[int], list[int]]]:
    """MatMul pairs x·B1 -> ·B2 with constant weights (in, r) then (r, out): the two halves of a factorised
    layer. Returns the two weight shapes of every pair."""
    consts = {i.name: list(i.dims) for i in model.graph.initializer}
    consts.update({n.output[0]: list(a.t.dims) for n in model.graph.node if n.op_type == "Constant"
                   for a in n.attribute if a.name == "value"})
    producer = {n.output[0]: n for n in model.graph.node if n.op_type == "MatMul"}
    pairs = []
    for node in model.graph.node:
        if node.op_type != "MatMul" or node.input[1] not in consts:
            continue
        first = producer.get(node.input[0])
        if first is not None and first.input[1] in consts:
            w1, w2 = consts[first.input[1]], consts[node.input[1]]
            if len(w1) == len(w2) == 2 and w1[1] == w2[0]:
                pairs.append((w1, w2))
    return pairs


def export_compressed(model: nn.Module, repo: str | Path, name: str, version: int = 1,
                      vocab_size: int | None = None, max_batch_size: int = 32) -> dict[str, Any]:
    """Export, validate and write a compressed model (byte LM or SentenceEncoder); returns the manifest."""
    model = model.eval()
    ranks = {n: m.rank for n, m in model.named_modules() if isinstance(m, FactorizedLinear)}
    if isinstance(model, SentenceEncoder):
        vocab = model.encoder.config.vocab_size
        width = model.encoder.config.hidden_size
        example = random_tokens(vocab, batch=2, sequence=16)
        graph = export_graph(model, tuple(example.values()), list(example), ["sentence_embedding"], DYNAMIC)
        validation = validate_export(model, graph.model, lambda batch, sequence: random_tokens(vocab, batch, sequence),
                                     [{"batch": 1, "sequence": 64}, {"batch": 3, "sequence": 7}], DYNAMIC,
                                     ["sentence_embedding"])
        inputs = [TensorSpec("input_ids", "int64", [-1, -1]), TensorSpec("attention_mask", "int64", [-1, -1])]
        outputs = [TensorSpec("sentence_embedding", "float32", [-1, width])]
        kind = Kind.SENTENCE_EMBEDDING.value
    else:
        vocab = vocab_size or model.config.vocab_size
        wrapped = LMLogits(model).eval()

        def make(batch: int, sequence: int) -> dict[str, torch.Tensor]:
            gen = torch.Generator().manual_seed(batch * 1000 + sequence)
            return {"input_ids": torch.randint(0, vocab, (batch, sequence), generator=gen)}

        graph = export_graph(wrapped, (make(2, 16)["input_ids"],), ["input_ids"], ["logits"], LM_DYNAMIC)
        validation = validate_export(wrapped, graph.model, make, [{"batch": 1, "sequence": 64},
                                                                  {"batch": 3, "sequence": 7}], LM_DYNAMIC, ["logits"])
        inputs = [TensorSpec("input_ids", "int64", [-1, -1])]
        outputs = [TensorSpec("logits", "float32", [-1, -1, vocab])]
        kind = Kind.CAUSAL_LM_LOGITS.value
    pairs = factorised_matmul_pairs(graph.model)
    manifest = {"name": name, "version": version, "kind": kind, "export": graph.info, "validation": validation,
                "compression": {"factorised_layers": len(ranks), "ranks": ranks, "matmul_pairs": len(pairs)},
                "precision": "fp32"}
    write_model(repo, name, version, graph.model, inputs, outputs, manifest, max_batch_size=max_batch_size)
    return manifest
