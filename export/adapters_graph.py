"""Building the adapter-as-input graph: every targeted Linear adds ``(x A^T) B^T`` with ``lora.<module>.A|B``
graph inputs (zero defaults), plus the head inputs; and :class:`ExportSpec`, how a base model is exported and
validated."""

from __future__ import annotations

import copy
import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
import torch
from onnx import numpy_helper
from torch import nn

from .adapters_peft import LoraWeights
from .adapters_torch import (
    HEAD_INPUTS,
    ExportLoraLinear,
    empty_head,
    replace_module,
    resolve_module,
    with_head,
)
from .encoder import DYNAMIC, random_tokens
from .errors import ExportError
from .onnx_export import ExportedGraph, export_graph
from .repository import TensorSpec


class AdapterInputs(nn.Module):
    """Export wrapper: ``forward(*base_inputs, A_1, B_1, ..., A_n, B_n[, head_weight, head_bias])`` sets each
    ExportLoraLinear's pair, runs the base (with the given head when ``heads``)."""

    def __init__(self, model: nn.Module, targets: list[str], num_inputs: int, heads: bool = False) -> None:
        super().__init__()
        self.model, self.targets, self.num_inputs = copy.deepcopy(model).eval(), targets, num_inputs
        self.heads = heads
        for name in targets:
            replace_module(self.model, name, ExportLoraLinear(self.model.get_submodule(name)))
        if heads:
            self.model = with_head(self.model, None)
            self.targets = [f"sentence.{name}" for name in targets]
        # torch.export binds inputs by signature and refuses *args: give forward one named slot per input
        count = num_inputs + 2 * len(targets) + (2 if heads else 0)
        slots = [inspect.Parameter(f"x{i}", inspect.Parameter.POSITIONAL_ONLY) for i in range(count)]
        forward = functools.partial(AdapterInputs.forward, self)
        forward.__signature__ = inspect.Signature(slots)
        self.forward = forward

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        params = inputs[self.num_inputs:]  # (A (R, in), B (out, R)) per target, then the head's weight and bias
        for i, name in enumerate(self.targets):
            self.model.get_submodule(name).params = (params[2 * i], params[2 * i + 1])
        if self.heads:
            return self.model(*inputs[:self.num_inputs], params[-2], params[-1])
        return self.model(*inputs[:self.num_inputs])


def input_names(target: str) -> tuple[str, str]:
    """The graph input names of a targeted module's A and B."""
    return f"lora.{target}.A", f"lora.{target}.B"


def adapter_targets(model: nn.Module, adapters: list[LoraWeights]) -> dict[str, tuple[int, int]]:
    """Every module any adapter targets (name in ``model``) -> (in, out) features."""
    targets = {}
    for lora in adapters:
        for path in lora.modules:
            name = resolve_module(model, path, lora.adapter_id)
            linear = model.get_submodule(name)
            targets[name] = (linear.in_features, linear.out_features)
    return dict(sorted(targets.items()))


def adapter_parameters(model: nn.Module, lora: LoraWeights, targets: dict[str, tuple[int, int]],
                       rank: int) -> dict[str, np.ndarray]:
    """Graph input name -> value for one adapter: A (R, in), B (out, R) scaled, zero-padded; zeros where untargeted;
    its head's weight and bias when it has one (else the graph's empty default head applies)."""
    params = {}
    if lora.head is not None:
        params[HEAD_INPUTS[0]], params[HEAD_INPUTS[1]] = (t.numpy().astype(np.float32) for t in lora.head)
    for name, (fan_in, fan_out) in targets.items():
        a, b = np.zeros((rank, fan_in), np.float32), np.zeros((fan_out, rank), np.float32)
        params[input_names(name)[0]], params[input_names(name)[1]] = a, b
    for path, (la, lb, scale) in lora.modules.items():
        a_name, b_name = input_names(resolve_module(model, path, lora.adapter_id))
        r = la.shape[0]
        if params[a_name].shape[1] != la.shape[1] or params[b_name].shape[0] != lb.shape[0]:
            raise ExportError(f"adapter {lora.adapter_id!r}: module {path!r} A/B expected (r, "
                              f"{params[a_name].shape[1]})/({params[b_name].shape[0]}, r), received "
                              f"{tuple(la.shape)}/{tuple(lb.shape)}")
        params[a_name][:r] = la.numpy()
        params[b_name][:, :r] = (lb * scale).numpy()
    return params


def export_adapter_graph(model: nn.Module, targets: dict[str, tuple[int, int]], rank: int,
                         example: dict[str, torch.Tensor], output_names: list[str],
                         dynamic: dict[str, dict[int, str]], heads: bool = False) -> ExportedGraph:
    """The adapter-as-input graph: base inputs, then ``lora.<module>.A|B`` inputs with zero initializers, then
    (``heads``) ``head.weight`` (labels, H) / ``head.bias`` (labels,) with empty initializers."""
    wrapper = AdapterInputs(model, list(targets), len(example), heads)
    zeros, trace = {}, {}
    for name, (fan_in, fan_out) in targets.items():
        a_name, b_name = input_names(name)
        zeros[a_name], zeros[b_name] = torch.zeros(rank, fan_in), torch.zeros(fan_out, rank)
    trace.update(zeros)
    if heads:
        weight, bias = empty_head(model)
        zeros[HEAD_INPUTS[0]], zeros[HEAD_INPUTS[1]] = weight, bias
        trace[HEAD_INPUTS[0]], trace[HEAD_INPUTS[1]] = torch.zeros(2, weight.shape[1]), torch.zeros(2)  # labels >= 2
        dynamic = {**dynamic, HEAD_INPUTS[0]: {0: "labels"}, HEAD_INPUTS[1]: {0: "labels"}}
    graph = export_graph(wrapper, (*example.values(), *trace.values()), [*example, *trace], output_names, dynamic)
    declared = {i.name for i in graph.model.graph.input}
    missing = sorted(set(zeros) - declared)
    if missing:
        raise ExportError(f"adapter-as-input export: LoRA inputs {missing[:3]} were dropped by the exporter; "
                          "expected every targeted module's A and B (and the head) as graph inputs")
    graph.model.graph.initializer.extend(numpy_helper.from_array(v.numpy(), n) for n, v in zeros.items())
    onnx.checker.check_model(graph.model, full_check=True)
    graph.info["lora_inputs"] = {"rank": rank, "modules": list(targets),
                                 "names": [n for n in zeros if n not in HEAD_INPUTS]}
    if heads:
        graph.info["head_inputs"] = list(HEAD_INPUTS)
    return graph


@dataclass
class ExportSpec:
    """How to export and validate one base model: example inputs, validation cases, tensors, dynamic dims."""

    example: dict[str, torch.Tensor]
    make_inputs: Callable[..., dict[str, torch.Tensor]]  # make_inputs(**case) -> named torch inputs
    cases: list[dict[str, int]]  # >= 2 shapes other than the example's
    dynamic: dict[str, dict[int, str]]
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]

    @property
    def output_names(self) -> list[str]:
        return [t.name for t in self.outputs]


def sentence_encoder_spec(config: Any) -> ExportSpec:
    """The ExportSpec of a :class:`~veil.export.encoder.SentenceEncoder` over a transformers ``config``."""
    def make(batch: int, sequence: int) -> dict[str, torch.Tensor]:
        return random_tokens(config.vocab_size, batch, sequence)

    ids = [TensorSpec("input_ids", "int64", [-1, -1]), TensorSpec("attention_mask", "int64", [-1, -1])]
    return ExportSpec(make(2, 16), make, [{"batch": 1, "sequence": 33}, {"batch": 3, "sequence": 7}], DYNAMIC, ids,
                      [TensorSpec("sentence_embedding", "float32", [-1, config.hidden_size])])
