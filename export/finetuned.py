"""A ``veil finetune`` run folder -> one validated ONNX classifier in a Triton-layout model repository.

Every adapter method exports, each the way its maths allows:

* **merged** (``lora``, ``psoft``, ``e2lora``): ``W + ΔW`` folded into the base weights, so the graph is the plain
  base architecture — no cost at serving time;
* **routed / unmerged** (``mtlora``, ``loramixer``, ``vapt``): the adapter depends on the input (mtLoRA's and
  LoRA-Mixer's routers, VAPT's prompt experts), so no ``W + ΔW`` exists and the graph carries the router or prompt
  generator. LoRA-Mixer runs every expert weighted by its (zero when not dispatched) routing weight in the graph,
  which equals the sparse top-k dispatch of PyTorch up to summation order.

Either way the graph is checked against the unmerged PyTorch model on input shapes other than the export example.
A text run (the MiniLM workload) gives inputs ``input_ids``/``attention_mask`` (int64, [batch, sequence]); the
digits ViT run gives ``pixel_values`` (float32, [batch, C, H, W]); the output is ``logits`` [batch, labels].
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import torch
from torch import nn
from veil.training.adapters import AdapterModel
from veil.training.adapters.finetune import build_classifier
from veil.training.adapters.interop import encoder_source

from veil.kinds import Kind

from .adapters import ExportSpec
from .encoder import DYNAMIC, random_tokens
from .errors import ExportError
from .onnx_export import export_graph
from .repository import TensorSpec, write_model
from .validate import validate_export

MERGED_METHODS = ("lora", "psoft", "e2lora")  # input-independent ΔW: folded into W
ROUTED_METHODS = ("mtlora", "loramixer", "vapt")  # input-dependent: exported with router / prompt generator
DIGITS_TASK = "digits-5to9"


class TextClassifier(nn.Module):
    """Named positional inputs for export: (input_ids, attention_mask) -> logits."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids, attention_mask)  # (B, labels)


class ImageClassifier(nn.Module):
    """A transformers image classifier as pixel_values -> logits."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.model(pixel_values=pixel_values).logits  # (B, labels)


def read_json(path: Path, what: str) -> dict[str, Any]:
    """A JSON file of a run folder; a missing one is an ExportError (a PEFT LoRA folder: the way it is served)."""
    if not path.is_file():
        hint = ""
        if path.name == "finetune.json" and (path.parent / "adapter_config.json").is_file():
            hint = ("; a PEFT LoRA folder without it (e.g. saved by peft over `peft_base(...)`, head in "
                    "modules_to_save) is served by `veil export adapters BASE --adapter ID=FOLDER --mean-pool-head "
                    "--repo REPO --name NAME`")
        raise ExportError(f"{what}: expected {path.name} in the run folder {str(path.parent)!r} (written by veil "
                          f"finetune), received no such file{hint}")
    return json.loads(path.read_text())


def load_run(run: str | Path, base: str | None = None) -> tuple[nn.Module, dict[str, Any], dict[str, Any]]:
    """The fine-tuned model of a run folder (adapter loaded, unmerged, eval mode), its settings and metrics.

    Args:
        run: a ``veil finetune --out`` folder.
        base: the text base (``bundled:all-MiniLM-L6-v2`` or a transformers folder); default: the checkpoint's
            ``base_model_name_or_path``. The digits workload always uses the run's ``base/`` ViT.
    """
    run = Path(run)
    settings = read_json(run / "finetune.json", "run")
    metrics = read_json(run / "metrics.json", "run")
    if settings.get("method") == "probe":
        raise ExportError("run: method 'probe' saves no adapter (head-only training is a baseline); expected a run "
                          f"of one of {list(MERGED_METHODS + ROUTED_METHODS)}, received 'probe'")
    adapter = read_json(run / "adapter_config.json", "run")
    if settings.get("task") == DIGITS_TASK:
        from transformers import ViTForImageClassification

        backbone = ViTForImageClassification.from_pretrained(run / "base").eval()
        return ImageClassifier(AdapterModel.from_pretrained(backbone, run)).eval(), settings, metrics
    labels = metrics.get("labels")
    if not labels:
        raise ExportError(f"run: expected 'labels' in {run / 'metrics.json'}, received {sorted(metrics)}")
    classifier, _ = build_classifier(base or encoder_source(adapter.get("base_model_name_or_path")), len(labels),
                                     seed=settings.get("seed", 0))
    return TextClassifier(AdapterModel.from_pretrained(classifier.eval(), run)).eval(), settings, metrics


def classifier_spec(model: nn.Module, num_labels: int) -> ExportSpec:
    """Example inputs, validation cases and tensor declarations of a text or image classifier."""
    logits = [TensorSpec("logits", "float32", [-1, num_labels])]
    if isinstance(model, ImageClassifier):
        config = model.model.model.config
        shape = (config.num_channels, config.image_size, config.image_size)

        def images(batch: int) -> dict[str, torch.Tensor]:
            return {"pixel_values": torch.randn(batch, *shape, generator=torch.Generator().manual_seed(batch))}

        return ExportSpec(images(2), images, [{"batch": 1}, {"batch": 5}], {"pixel_values": {0: "batch"}},
                          [TensorSpec("pixel_values", "float32", [-1, *shape])], logits)
    vocab = model.model.model.bert.config.vocab_size

    def tokens(batch: int, sequence: int) -> dict[str, torch.Tensor]:
        return random_tokens(vocab, batch, sequence)

    ids = [TensorSpec("input_ids", "int64", [-1, -1]), TensorSpec("attention_mask", "int64", [-1, -1])]
    return ExportSpec(tokens(2, 16), tokens, [{"batch": 1, "sequence": 33}, {"batch": 3, "sequence": 7}], DYNAMIC,
                      ids, logits)


def export_finetuned(run: str | Path, repo: str | Path, name: str, version: int = 1, base: str | None = None,
                     merge: bool = True, max_batch_size: int = 32) -> dict[str, Any]:
    """Export the run's classifier to ``<repo>/<name>/<version>``; returns the manifest written to veil.json.

    Args:
        merge: fold ΔW into W for the linear methods (``lora``, ``psoft``, ``e2lora``); routed methods and VAPT
            are always exported unmerged, with their routers / prompt generators.

    Raises:
        ExportError: the run folder is incomplete or of a method without an adapter (``probe``).
        ExportValidationError: the graph disagrees with the unmerged PyTorch model beyond the tolerance.
    """
    reference, settings, metrics = load_run(run, base)
    method, labels = settings["method"], metrics["labels"]
    adapted: AdapterModel = reference.model
    spec = classifier_spec(reference, len(labels))
    folded = merge and method in MERGED_METHODS
    exported = reference
    if folded:
        exported = copy.deepcopy(reference)
        exported.model = exported.model.merge_and_unload()  # AdapterModel -> base with W + ΔW
    graph = export_graph(exported, tuple(spec.example.values()), list(spec.example), spec.output_names, spec.dynamic)
    check = validate_export(reference, graph.model, spec.make_inputs, spec.cases, spec.dynamic, spec.output_names)
    manifest = {"kind": (Kind.FINETUNED_MERGED if folded else Kind.FINETUNED_UNMERGED).value, "method": method,
                "task": settings.get("task"), "labels": labels, "run": str(run),
                "adapter": {"peft_type": adapted.config.to_peft_dict().get("peft_type"),
                            "trainable": adapted.trainable_report()["trainable"]},
                "graph": "W + ΔW (plain base)" if folded else f"base + {method} adapter (router / prompts in graph)",
                "training_metrics": {k: v for k, v in metrics.items() if isinstance(v, (int, float))},
                "export": graph.info, "validation": check}
    write_model(repo, name, version, graph.model, spec.inputs, spec.outputs, manifest, max_batch_size=max_batch_size)
    return manifest
