"""LoRA adapters (PEFT layout) -> ONNX: merged graphs, or one adapter-as-input graph plus ``.onnx_adapter`` files.

An adapter folder holds ``adapter_config.json`` (``peft_type: "LORA"``, ``r``, ``lora_alpha``, ``target_modules``)
and ``adapter_model.safetensors`` with ``base_model.model.<module>.lora_A.weight`` (r, in) and ``.lora_B.weight``
(out, r); a targeted ``nn.Linear`` computes ``x W^T + b + s (x A^T) B^T`` with ``s = lora_alpha / r``
(``lora_alpha / sqrt(r)`` with ``use_rslora``).

* **merged**: ``W' = W + s B A`` folded into a copy of the base, exported and validated against the base with
  the adapter applied unmerged in torch; one graph per adapter.
* **adapter-as-input**: one graph where every targeted Linear also adds ``(x A^T) B^T`` with ``A`` (R, in) and
  ``B`` (out, R) **named graph inputs** ``lora.<module>.A`` / ``.B`` whose initializers are zeros, so the base
  output is unchanged when no adapter is active. R is the largest rank of the adapters (smaller ranks are
  zero-padded, which changes nothing) and ``s`` is folded into ``B``. Each adapter becomes one
  ``.onnx_adapter`` file (``onnxruntime.AdapterFormat``) that stock ONNX Runtime activates per run with
  ``ort.LoraAdapter().Load(path)`` and ``RunOptions().add_active_adapter(adapter)``.

**Heads.** A ``veil finetune`` text run saves its classifier with the LoRA (``modules_to_save: ["classifier"]``,
tensors ``base_model.model.classifier.weight|bias``; the LoRA targets are paths under ``bert.``, the encoder of
``MeanPoolClassifier``); so does ``peft`` for a LoRA over ``peft_base(...)``, whose folder says nothing of the head's
architecture: ``mean_pool_head=True`` (``--mean-pool-head``) declares it. The head is exported as part of the graph: a second output ``logits`` = the head on the
masked-mean embedding before normalisation (exactly ``MeanPoolClassifier``), with the head's weight (labels, H)
and bias (labels,) as graph inputs ``head.weight`` / ``head.bias`` (dynamic ``labels``) whose default is empty:
with no adapter active, or an adapter without a head, ``logits`` has 0 columns. Each adapter's file carries its
own head, so tenants may have different label sets (listed per adapter in veil.json). A saved module of any
other kind is refused, naming what to do instead.

One job per module: :mod:`~veil.export.adapters_peft` reads PEFT folders, :mod:`~veil.export.adapters_torch`
holds the torch LoRA module and the head, :mod:`~veil.export.adapters_graph` builds the adapter-as-input graph,
:mod:`~veil.export.adapters_format` writes (and runs) ``.onnx_adapter`` files; this module checks parity and
writes the repository (:func:`export_adapters`). Their public names are re-exported here.
"""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import torch
from torch import nn

from veil.kinds import Kind

from .adapters_format import ADAPTER_VERSION, run_with_adapter, write_onnx_adapter  # noqa: F401  (re-exported)
from .adapters_graph import (  # noqa: F401  (re-exported)
    AdapterInputs,
    ExportSpec,
    adapter_parameters,
    adapter_targets,
    export_adapter_graph,
    input_names,
    sentence_encoder_spec,
)
from .adapters_peft import CONFIG_FILE, KEY, WEIGHTS_FILE, LoraWeights, finetune_run, read_lora  # noqa: F401  (re-exported)
from .adapters_torch import (  # noqa: F401  (re-exported)
    HEAD_INPUTS,
    ExportLoraLinear,
    WithHead,
    empty_head,
    merged,
    resolve_module,
    with_adapter,
    with_head,
)
from .errors import ExportError, ExportValidationError
from .onnx_export import export_graph
from .repository import NAME_PATTERN, TensorSpec, write_model
from .validate import TOLERANCES, cpu_session, validate_export


def adapter_parity(model: nn.Module, spec: ExportSpec, session: ort.InferenceSession, lora: LoraWeights,
                   adapter_path: Path, merged_graph: onnx.ModelProto | None) -> dict[str, Any]:
    """Adapter-as-input (stock ORT, adapter active) vs torch (adapter unmerged) and vs the merged graph."""
    reference, merged_session = with_adapter(model, lora), merged_graph and cpu_session(merged_graph)
    if "logits" in spec.output_names:
        reference = with_head(reference, lora)
    report: dict[str, Any] = {"cases": []}
    for case in spec.cases:
        inputs = spec.make_inputs(**case)
        feeds = {k: v.numpy() for k, v in inputs.items()}
        got = run_with_adapter(session, feeds, spec.output_names, adapter_path)
        with torch.no_grad():
            expected = reference(*inputs.values())
        expected = expected if isinstance(expected, (tuple, list)) else (expected,)
        entry: dict[str, Any] = {"case": case}
        for name, out, ref in zip(spec.output_names, got, expected, strict=True):
            ref = ref.numpy()
            atol, rtol = TOLERANCES["float32"]
            diff = float(np.max(np.abs(out - ref))) if ref.size else 0.0
            allowed = atol + rtol * float(np.max(np.abs(ref))) if ref.size else atol
            if out.shape != ref.shape:
                raise ExportValidationError(f"adapter {lora.adapter_id!r}, output {name!r} at {case}: shape "
                                            f"{list(out.shape)} (onnx) vs {list(ref.shape)} (torch)")
            if not diff <= allowed:
                raise ExportValidationError(f"adapter {lora.adapter_id!r}, output {name!r} at {case}: max |onnx - torch| "
                                            f"= {diff:.3g} > allowed {allowed:.3g}")
            entry[name] = {"max_abs_diff_vs_torch": diff, "allowed": allowed}
        if merged_session is not None:
            for name, out, ref in zip(spec.output_names, got, merged_session.run(spec.output_names, feeds), strict=True):
                entry[name]["max_abs_diff_vs_merged"] = float(np.max(np.abs(out - ref))) if ref.size else 0.0
        report["cases"].append(entry)
    return report


def export_adapters(model: nn.Module, spec: ExportSpec, adapters: dict[str, str | Path], repo: str | Path, name: str,
                    version: int = 1, merged_models: bool = False, manifest: dict[str, Any] | None = None,
                    max_batch_size: int = 32, cache_size: int = 8, mean_pool_head: bool = False) -> dict[str, Any]:
    """Write ``<repo>/<name>`` (adapter-as-input graph, ``adapters/<id>.onnx_adapter``) and, with
    ``merged_models``, one merged model ``<repo>/<name>-<id>`` per adapter; returns the manifest.

    Args:
        mean_pool_head: every saved ``classifier`` is veil's ``MeanPoolClassifier`` head (see :func:`read_lora`).

    Raises:
        ExportError: an adapter folder, id or module does not fit the base.
        ExportValidationError: an exported graph disagrees with torch beyond the tolerance.
    """
    bad = [i for i in adapters if not NAME_PATTERN.match(i)]
    if bad or not adapters:
        raise ExportError(f"--adapter: expected one or more ids of letters, digits, '_', '.', '-', received {bad or '[]'}")
    loras = [read_lora(adapter_id, folder, mean_pool_head) for adapter_id, folder in adapters.items()]
    targets = adapter_targets(model, loras)
    rank = max(a.shape[0] for lora in loras for a, _, _ in lora.modules.values())
    heads = any(lora.head is not None for lora in loras)
    base = model
    if heads:
        hidden = model.encoder.config.hidden_size
        bad_heads = {lora.adapter_id: tuple(lora.head[0].shape) for lora in loras
                     if lora.head is not None and lora.head[0].shape[1] != hidden}
        if bad_heads:
            raise ExportError(f"--adapter: heads expected weight (labels, {hidden}) for this base, received {bad_heads}")
        spec = dataclasses.replace(spec, outputs=[*spec.outputs, TensorSpec("logits", "float32", [-1, -1])])
        base = with_head(model, None)
    graph = export_adapter_graph(model, targets, rank, spec.example, spec.output_names, spec.dynamic, heads)
    base_check = validate_export(base, graph.model, spec.make_inputs, spec.cases, spec.dynamic, spec.output_names)
    session, rows = cpu_session(graph.model), []
    with tempfile.TemporaryDirectory() as tmp:
        for lora in loras:
            path = Path(tmp) / f"{lora.adapter_id}.onnx_adapter"
            write_onnx_adapter(path, adapter_parameters(model, lora, targets, rank), version)
            merged_graph = None
            if merged_models:
                merged_model, reference = merged(model, lora), with_adapter(model, lora)
                if heads:
                    merged_model, reference = with_head(merged_model, lora), with_head(reference, lora)
                merged_graph = export_graph(merged_model, tuple(spec.example.values()), list(spec.example),
                                            spec.output_names, spec.dynamic).model
                check = validate_export(reference, merged_graph, spec.make_inputs, spec.cases, spec.dynamic,
                                        spec.output_names)
                write_model(repo, f"{name}-{lora.adapter_id}", version, merged_graph, spec.inputs, spec.outputs,
                            {**(manifest or {}), "kind": Kind.LORA_MERGED.value, "adapter": lora.summary(), "validation": check},
                            max_batch_size=max_batch_size)
            rows.append({**lora.summary(), "file": f"adapters/{lora.adapter_id}.onnx_adapter",
                         "parity": adapter_parity(model, spec, session, lora, path, merged_graph)})
        full = {**(manifest or {}), "kind": Kind.LORA_ADAPTERS.value, "export": graph.info, "validation": base_check,
                "lora": {"rank": rank, "modules": list(targets), "inputs": graph.info["lora_inputs"]["names"],
                         "scale": "folded into B"}, "adapters": rows}
        if heads:
            full["head"] = {"inputs": list(HEAD_INPUTS), "output": "logits",
                            "on": "masked mean of the last hidden state, before normalisation",
                            "default": "0 labels (logits (batch, 0)) when no adapter or an adapter without a head"}
        files = {f"adapters/{lora.adapter_id}.onnx_adapter": Path(tmp) / f"{lora.adapter_id}.onnx_adapter"
                 for lora in loras}
        # graph, adapters and config.pbtxt published at once
        write_model(repo, name, version, graph.model, spec.inputs, spec.outputs, full, max_batch_size=max_batch_size,
                    model_files=files, parameters={"adapter_cache_size": str(cache_size)})
    return full
