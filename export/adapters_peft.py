"""Reading LoRA adapters in the PEFT layout (``adapter_config.json`` + ``adapter_model.safetensors``), and the
head a ``veil finetune`` text run saves beside them; see :mod:`veil.export.adapters` for the export as a whole."""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from .errors import ExportError

CONFIG_FILE, WEIGHTS_FILE = "adapter_config.json", "adapter_model.safetensors"
KEY = re.compile(r"^base_model\.model\.(?P<module>.+)\.lora_(?P<which>[AB])\.weight$")


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


def read_lora(adapter_id: str, folder: str | Path, mean_pool_head: bool = False) -> LoraWeights:
    """Read a PEFT LoRA folder; raise ExportError naming the file, field, expected and received value.

    Args:
        mean_pool_head: a saved ``classifier`` is the head of veil's ``MeanPoolClassifier`` (a LoRA ``peft`` saved
            over ``peft_base(...)`` has no finetune.json to say so); a ``veil finetune`` text run needs no flag.
    """
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
    head_run = mean_pool_head or (run is not None and run.get("task") != "digits-5to9")
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
                raise ExportError(saved_module_error(adapter_id, key, sorted(saved), run is not None))
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


def saved_module_error(adapter_id: str, key: str, saved: list[str], has_run: bool) -> str:
    """Why a saved module cannot go into the graph, and the one way out that accepts this folder."""
    what = (f"adapter {adapter_id!r}: tensor {key!r} is a saved module (modules_to_save {saved}), not LoRA; `veil "
            "export adapters` puts a head into the graph only as veil's MeanPoolClassifier head (the 'classifier' "
            "on the mean-pooled embedding). ")
    if has_run:  # a veil finetune run of another workload (the digits ViT): its own exporter reads finetune.json
        return what + "Export this run with `veil export finetuned RUN --repo REPO --name NAME`"
    return what + ("If it is that head (a LoRA peft saved over `peft_base(...)` or `build_classifier(...)`), pass "
                   "--mean-pool-head (Python: mean_pool_head=True); a head of another architecture (e.g. "
                   "BertForSequenceClassification's CLS pooler) cannot be served this way: save the adapter "
                   "without modules_to_save")
