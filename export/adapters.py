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
``MeanPoolClassifier``). The head is exported as part of the graph: a second output ``logits`` = the head on the
masked-mean embedding before normalisation (exactly ``MeanPoolClassifier``), with the head's weight (labels, H)
and bias (labels,) as graph inputs ``head.weight`` / ``head.bias`` (dynamic ``labels``) whose default is empty:
with no adapter active, or an adapter without a head, ``logits`` has 0 columns. Each adapter's file carries its
own head, so tenants may have different label sets (listed per adapter in veil.json). A saved module of any
other kind is refused, naming what to do instead.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import hashlib
import inspect
import json
import math
import re
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import torch
from onnx import numpy_helper
from safetensors.torch import load_file
from torch import nn

from .encoder import DYNAMIC, random_tokens
from .onnx_export import ExportedGraph, export_graph
from .repository import NAME_PATTERN, TensorSpec, write_model
from .swap import ExportError
from .validate import TOLERANCES, ExportValidationError, cpu_session, validate_export

CONFIG_FILE, WEIGHTS_FILE = "adapter_config.json", "adapter_model.safetensors"
KEY = re.compile(r"^base_model\.model\.(?P<module>.+)\.lora_(?P<which>[AB])\.weight$")
ADAPTER_VERSION = 1  # written into every .onnx_adapter (AdapterFormat.set_adapter_version)


@dataclass
class LoraWeights:
    """One PEFT-layout LoRA adapter read from its folder.

    Attributes:
        modules: PEFT module path -> (A (r, in), B (out, r), scale); scale = alpha / r (or / sqrt(r), rsLoRA).
    """

    adapter_id: str
    folder: Path
    rank: int
    alpha: float
    target_modules: list[str]
    sha256: str
    modules: dict[str, tuple[torch.Tensor, torch.Tensor, float]] = field(default_factory=dict)
    head: tuple[torch.Tensor, torch.Tensor] | None = None  # weight (labels, H), bias (labels,)
    labels: list[str] | None = None

    def summary(self) -> dict[str, object]:
        out: dict[str, object] = {"id": self.adapter_id, "source": str(self.folder.resolve()), "sha256": self.sha256,
                                  "rank": self.rank, "alpha": self.alpha, "targets": sorted(self.modules)}
        if self.head is not None:
            out["head"] = {"num_labels": int(self.head[0].shape[0]), "labels": self.labels, "output": "logits"}
        return out


def finetune_run(folder: Path) -> dict[str, Any] | None:
    """The settings (finetune.json) of the ``veil finetune`` run ``folder`` is, or holds as ``as_lora/``; else None."""
    for run in (folder, folder.parent if folder.name == "as_lora" else None):
        if run is not None and (run / "finetune.json").is_file():
            settings = json.loads((run / "finetune.json").read_text())
            if (run / "metrics.json").is_file():
                settings["_labels"] = json.loads((run / "metrics.json").read_text()).get("labels")
            return settings
    return None


def read_lora(adapter_id: str, folder: str | Path) -> LoraWeights:
    """Read a PEFT LoRA folder; raise ExportError naming the file, field, expected and received value."""
    folder = Path(folder)
    for name in (CONFIG_FILE, WEIGHTS_FILE):
        if not (folder / name).is_file():
            raise ExportError(f"adapter {adapter_id!r}: expected {folder / name} (PEFT layout), it is missing")
    config = json.loads((folder / CONFIG_FILE).read_text())
    if config.get("peft_type") != "LORA":
        raise ExportError(f"adapter {adapter_id!r}: {CONFIG_FILE} peft_type expected 'LORA', received {config.get('peft_type')!r}")
    for key in ("use_dora", "alpha_pattern"):
        if config.get(key):
            raise ExportError(f"adapter {adapter_id!r}: {CONFIG_FILE} {key} expected false/empty (not supported), "
                              f"received {config[key]!r}")
    rank, alpha, rslora = int(config["r"]), float(config["lora_alpha"]), bool(config.get("use_rslora", False))
    digest = hashlib.sha256()
    for name in (CONFIG_FILE, WEIGHTS_FILE):
        digest.update((folder / name).read_bytes())
    saved = set(config.get("modules_to_save") or [])
    run = finetune_run(folder)
    head_run = run is not None and run.get("task") != "digits-5to9"
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    head: dict[str, torch.Tensor] = {}
    for key, tensor in load_file(str(folder / WEIGHTS_FILE)).items():
        match = KEY.match(key)
        if match is None:
            module, _, param = key.removeprefix("base_model.model.").rpartition(".")
            if module in saved and head_run and module == "classifier" and param in ("weight", "bias"):
                head[param] = tensor.float()
                continue
            if module in saved:
                raise ExportError(f"adapter {adapter_id!r}: tensor {key!r} is a saved module (modules_to_save "
                                  f"{sorted(saved)}), not LoRA; `veil export adapters` puts a head into the graph only "
                                  "for `veil finetune` text runs (the 'classifier' on the mean-pooled embedding). "
                                  "Export this model with `veil export finetuned RUN --repo REPO --name NAME`, or "
                                  "save the adapter without modules_to_save")
            raise ExportError(f"adapter {adapter_id!r}: tensor {key!r} expected 'base_model.model.<module>.lora_A|B"
                              ".weight' (LoRA on Linear layers only)")
        path = match["module"].removeprefix("bert.") if head_run else match["module"]  # MeanPoolClassifier.bert
        pairs.setdefault(path, {})[match["which"]] = tensor.float()
    if head and (set(head) != {"weight", "bias"} or head["weight"].ndim != 2
                 or head["bias"].shape != (head["weight"].shape[0],)):
        raise ExportError(f"adapter {adapter_id!r}: head 'classifier' expected weight (labels, hidden) and bias "
                          f"(labels,), received {({k: tuple(v.shape) for k, v in head.items()})}")
    modules = {}
    for path, ab in sorted(pairs.items()):
        if set(ab) != {"A", "B"}:
            raise ExportError(f"adapter {adapter_id!r}: module {path!r} expected lora_A and lora_B, received {sorted(ab)}")
        r = ab["A"].shape[0]  # rank_pattern may give a module its own rank
        modules[path] = (ab["A"], ab["B"], alpha / (math.sqrt(r) if rslora else r))
    targets = config.get("target_modules") or []
    return LoraWeights(adapter_id, folder, rank, alpha, sorted(targets) if isinstance(targets, list) else [targets],
                       digest.hexdigest(), modules, (head["weight"], head["bias"]) if head else None,
                       run.get("_labels") if head and run else None)


def resolve_module(model: nn.Module, path: str, adapter_id: str) -> str:
    """The name in ``model`` of the Linear that PEFT calls ``path`` (equal, or ending in ``.path``)."""
    names = [n for n, m in model.named_modules() if (n == path or n.endswith("." + path)) and isinstance(m, nn.Linear)]
    if len(names) != 1:
        raise ExportError(f"adapter {adapter_id!r}: module {path!r} expected to match exactly one nn.Linear of "
                          f"{type(model).__name__}, received {len(names)} matches {names[:4]}")
    return names[0]


class LoraLinear(nn.Module):
    """``base(x) + (x A^T) B^T`` where (A (R, in), B (out, R), scale folded in) are fixed or set per call."""

    def __init__(self, base: nn.Linear, a: torch.Tensor | None = None, b: torch.Tensor | None = None) -> None:
        super().__init__()
        self.base = base
        self.params: tuple[torch.Tensor, torch.Tensor] | None = None if a is None else (a, b)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = self.params  # set by the owner: fixed, or AdapterInputs.forward for this call
        return self.base(x) + (x @ a.T) @ b.T  # (..., in) -> (..., R) -> (..., out)


def _replace(model: nn.Module, name: str, module: nn.Module) -> None:
    parent, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, child, module)


def with_adapter(model: nn.Module, lora: LoraWeights) -> nn.Module:
    """The torch reference: a copy of ``model`` with the adapter applied unmerged (base + s (x A^T) B^T)."""
    model = copy.deepcopy(model).eval()
    for path, (a, b, scale) in lora.modules.items():
        name = resolve_module(model, path, lora.adapter_id)
        _replace(model, name, LoraLinear(model.get_submodule(name), a, b * scale))
    return model


def merged(model: nn.Module, lora: LoraWeights) -> nn.Module:
    """A copy of ``model`` with ``W' = W + s B A`` folded into every targeted Linear."""
    model = copy.deepcopy(model).eval()
    with torch.no_grad():
        for path, (a, b, scale) in lora.modules.items():
            linear = model.get_submodule(resolve_module(model, path, lora.adapter_id))
            if linear.weight.shape != (b.shape[0], a.shape[1]):
                raise ExportError(f"adapter {lora.adapter_id!r}: module {path!r} expected B A of shape "
                                  f"{tuple(linear.weight.shape)}, received {(b.shape[0], a.shape[1])}")
            linear.weight += scale * (b @ a)  # (out, r) @ (r, in) -> (out, in)
    return model


HEAD_INPUTS = ("head.weight", "head.bias")


class WithHead(nn.Module):
    """A sentence encoder plus a linear head on its masked mean before normalisation (``MeanPoolClassifier``):
    ``(input_ids, attention_mask[, weight, bias]) -> (sentence_embedding, logits)``.

    ``weight`` (labels, H) / ``bias`` (labels,) given per call override the fixed ones (the adapter-as-input graph).
    """

    def __init__(self, sentence: nn.Module, weight: torch.Tensor, bias: torch.Tensor) -> None:
        super().__init__()
        self.sentence, self.weight, self.bias = sentence, weight, bias

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, weight: torch.Tensor | None = None,
                bias: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        hidden = self.sentence.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state  # (B, T, H)
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)  # (B, T, 1)
        pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)  # (B, H); every row has a token
        embedding = nn.functional.normalize(pooled, dim=-1) if self.sentence.normalize else pooled
        weight, bias = (self.weight, self.bias) if weight is None else (weight, bias)
        return embedding, pooled @ weight.T + bias  # (B, H), (B, labels)


def empty_head(model: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    """The default head of a graph with heads: 0 labels (``logits`` (B, 0) with no adapter active)."""
    hidden = model.encoder.config.hidden_size
    return torch.zeros(0, hidden), torch.zeros(0)


def with_head(model: nn.Module, lora: LoraWeights | None) -> WithHead:
    """``model`` with ``lora``'s head (or the empty one) on the pooled output."""
    weight, bias = lora.head if lora is not None and lora.head is not None else empty_head(model)
    return WithHead(model, weight, bias).eval()


class AdapterInputs(nn.Module):
    """Export wrapper: ``forward(*base_inputs, A_1, B_1, ..., A_n, B_n[, head_weight, head_bias])`` sets each
    LoraLinear's pair, runs the base (with the given head when ``heads``)."""

    def __init__(self, model: nn.Module, targets: list[str], num_inputs: int, heads: bool = False) -> None:
        super().__init__()
        self.model, self.targets, self.num_inputs = copy.deepcopy(model).eval(), targets, num_inputs
        self.heads = heads
        for name in targets:
            _replace(self.model, name, LoraLinear(self.model.get_submodule(name)))
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


def write_onnx_adapter(path: Path, params: dict[str, np.ndarray], model_version: int) -> None:
    """One ``.onnx_adapter`` file (ONNX Runtime's adapter format) holding ``params``."""
    fmt = ort.AdapterFormat()
    fmt.set_adapter_version(ADAPTER_VERSION)
    fmt.set_model_version(model_version)
    fmt.set_parameters({n: ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(v)) for n, v in params.items()})
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    fmt.export_adapter(str(tmp))
    tmp.replace(path)


def run_with_adapter(session: ort.InferenceSession, feeds: dict[str, np.ndarray], output_names: list[str],
                     adapter_path: Path | None) -> list[np.ndarray]:
    """One stock-ORT run, with the ``.onnx_adapter`` at ``adapter_path`` active (None: the base)."""
    options = ort.RunOptions()
    if adapter_path is not None:
        adapter = ort.LoraAdapter()
        adapter.Load(str(adapter_path))
        options.add_active_adapter(adapter)
    return session.run(output_names, feeds, run_options=options)


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
                    max_batch_size: int = 32, cache_size: int = 8) -> dict[str, Any]:
    """Write ``<repo>/<name>`` (adapter-as-input graph, ``adapters/<id>.onnx_adapter``) and, with
    ``merged_models``, one merged model ``<repo>/<name>-<id>`` per adapter; returns the manifest.

    Raises:
        ExportError: an adapter folder, id or module does not fit the base.
        ExportValidationError: an exported graph disagrees with torch beyond the tolerance.
    """
    bad = [i for i in adapters if not NAME_PATTERN.match(i)]
    if bad or not adapters:
        raise ExportError(f"--adapter: expected one or more ids of letters, digits, '_', '.', '-', received {bad or '[]'}")
    loras = [read_lora(adapter_id, folder) for adapter_id, folder in adapters.items()]
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
                            {**(manifest or {}), "kind": "lora-merged", "adapter": lora.summary(), "validation": check},
                            max_batch_size=max_batch_size)
            rows.append({**lora.summary(), "file": f"adapters/{lora.adapter_id}.onnx_adapter",
                         "parity": adapter_parity(model, spec, session, lora, path, merged_graph)})
        full = {**(manifest or {}), "kind": "lora-adapters", "export": graph.info, "validation": base_check,
                "lora": {"rank": rank, "modules": list(targets), "inputs": graph.info["lora_inputs"]["names"],
                         "scale": "folded into B"}, "adapters": rows}
        if heads:
            full["head"] = {"inputs": list(HEAD_INPUTS), "output": "logits",
                            "on": "masked mean of the last hidden state, before normalisation",
                            "default": "0 labels (logits (batch, 0)) when no adapter or an adapter without a head"}
        files = {f"adapters/{lora.adapter_id}.onnx_adapter": Path(tmp) / f"{lora.adapter_id}.onnx_adapter"
                 for lora in loras}
        cache = f'parameters {{ key: "adapter_cache_size" value: {{ string_value: "{cache_size}" }} }}\n'
        write_model(repo, name, version, graph.model, spec.inputs, spec.outputs, full, max_batch_size=max_batch_size,
                    model_files=files, config_extra=cache)  # graph, adapters and config.pbtxt published at once
    return full
