"""``AdapterModel``: a base model with adapter layers injected, the one object every method returns.

```
inject(model, config) --> AdapterModel --forward--> model(...)   (targets wrapped, base frozen)
        |                    |-- trainable_report() / aux_loss()
        |                    |-- merge() / unmerge() / merge_and_unload()
        +-- from_pretrained(base, dir) <-- save_pretrained(dir): adapter_config.json + adapter_model.safetensors
```
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn

from .config import AdapterConfig
from .layer import AdapterLayer, Conv1D
from .targeting import PEFT_HEAD_TASK_TYPES, PEFT_TASK_HEAD_NAMES, SEQ_CLS_HEAD_NAMES, find_targets

PEFT_PREFIX = "base_model.model."  # PEFT's key prefix (PeftModel.base_model.model.<module path>)


class AdapterModel(nn.Module):
    """A model whose targeted linears carry adapters; method subclasses implement ``create_layer``.

    Args:
        model: the base model; it is modified in place (targets replaced, every base parameter frozen).
        config: the method's config.
    """

    def __init__(self, model: nn.Module, config: AdapterConfig) -> None:
        super().__init__()
        self.model = model
        self.config = with_seq_cls_head(model, config)
        model.requires_grad_(False)
        targets = find_targets(model, self.config)
        self.config = with_layout(model, targets, self.config)
        for name in targets:
            parent, attr = _parent(model, name)
            setattr(parent, attr, self.create_layer(getattr(parent, attr), name))
        self.saved_modules = find_modules_to_save(model, self.config)
        for module in self.saved_modules.values():
            module.requires_grad_(True)

    def create_layer(self, base: nn.Module, name: str) -> AdapterLayer:
        """The adapter layer wrapping ``base`` (an ``nn.Linear`` or GPT-2 ``Conv1D``, at module path ``name``)."""
        raise NotImplementedError

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.model(*args, **kwargs)

    def adapter_layers(self) -> dict[str, AdapterLayer]:
        """Module path -> adapter layer, in model order."""
        return {n: m for n, m in self.model.named_modules() if isinstance(m, AdapterLayer)}

    def aux_loss(self) -> torch.Tensor:
        """Sum of the auxiliary losses the adapter layers report (zero for LoRA); the trainer adds and logs it."""
        losses = [layer.aux_loss() for layer in self.adapter_layers().values()]
        return torch.stack(losses).sum() if losses else torch.zeros(())

    def trainable_report(self) -> dict[str, Any]:
        """Trainable and total parameter counts, and a per-module table of the trainable ones."""
        total = sum(p.numel() for p in self.model.parameters())
        trainable = sum(p.numel() for p in self.model.parameters() if p.requires_grad)
        rows = [{"module": n, "kind": type(m).__name__, "trainable": sum(p.numel() for p in m.parameters() if p.requires_grad)}
                for n, m in [*self.adapter_layers().items(), *self.saved_modules.items()]]
        return {"trainable": trainable, "total": total, "percent": 100.0 * trainable / max(total, 1), "modules": rows}

    def format_trainable_report(self) -> str:
        """The report as text: one line per module, then PEFT's summary line."""
        rep = self.trainable_report()
        width = max([len(r["module"]) for r in rep["modules"]] + [6])
        lines = [f"{'module':<{width}}  {'kind':<16} trainable"]
        lines += [f"{r['module']:<{width}}  {r['kind']:<16} {r['trainable']:,}" for r in rep["modules"]]
        lines.append(f"trainable params: {rep['trainable']:,} || all params: {rep['total']:,} || "
                     f"trainable%: {rep['percent']:.4f}")
        return "\n".join(lines)

    # Why a method cannot be folded into its base weights (None: it can); merge/unmerge then refuse.
    not_mergeable: ClassVar[str | None] = None

    def _refuse_merge(self) -> None:
        if self.not_mergeable is not None:
            raise NotImplementedError(f"{type(self).__name__}.merge: {self.not_mergeable}")

    def merge(self) -> None:
        """Fold every adapter's ΔW into its base weight (forward is then the plain model's)."""
        self._refuse_merge()
        for layer in self.adapter_layers().values():
            layer.merge()

    def unmerge(self) -> None:
        """Undo :meth:`merge`."""
        self._refuse_merge()
        for layer in self.adapter_layers().values():
            layer.unmerge()

    def merge_and_unload(self) -> nn.Module:
        """Merge, then put the plain base linears back; returns the base model (with the trained saved modules)."""
        self.merge()
        for name, layer in self.adapter_layers().items():
            parent, attr = _parent(self.model, name)
            setattr(parent, attr, layer.base_layer)
        return self.model

    def adapter_state_dict(self) -> dict[str, torch.Tensor]:
        """The tensors a checkpoint holds, keyed as PEFT keys them (adapter name removed)."""
        out = {f"{PEFT_PREFIX}{name}.{k}": v for name, layer in self.adapter_layers().items()
               for k, v in layer.adapter_state().items()}
        for name, module in self.saved_modules.items():
            out.update({f"{PEFT_PREFIX}{name}.{k}": v for k, v in module.state_dict().items()})
        return out

    def load_adapter_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Load tensors keyed as :meth:`adapter_state_dict`; missing or unexpected keys are an error."""
        own = self.adapter_state_dict()
        missing, unexpected = sorted(set(own) - set(state)), sorted(set(state) - set(own))
        if missing or unexpected:
            raise ValueError(f"adapter weights: expected the keys of this config, missing {missing[:5]}, "
                             f"unexpected {unexpected[:5]}")
        with torch.no_grad():
            for key, value in state.items():
                if own[key].shape != value.shape:
                    raise ValueError(f"adapter weights: {key}: expected shape {tuple(own[key].shape)}, "
                                     f"received {tuple(value.shape)}")
                own[key].copy_(value)

    def save_pretrained(self, out_dir: str | Path) -> Path:
        """Write ``adapter_config.json`` + ``adapter_model.safetensors`` (PEFT layout), atomically."""
        from .checkpoint import save_adapter

        return save_adapter(self, out_dir)

    @classmethod
    def from_pretrained(cls, base_model: nn.Module, path: str | Path) -> AdapterModel:
        """Inject the adapter saved at ``path`` (by veil or by PEFT) into ``base_model`` and load its weights."""
        from .checkpoint import load_adapter

        return load_adapter(base_model, path)


def with_seq_cls_head(model: nn.Module, config: AdapterConfig) -> AdapterConfig:
    """For ``task_type="SEQ_CLS"`` add the model's head (``classifier`` or ``score``) to ``modules_to_save``, as PEFT
    does, so the head trains and is saved."""
    if config.task_type != "SEQ_CLS":
        return config
    saved = list(config.modules_to_save or [])
    heads = [n for n in SEQ_CLS_HEAD_NAMES if isinstance(getattr(model, n, None), nn.Module) and n not in saved]
    return config.replace(modules_to_save=saved + heads) if heads else config


def with_layout(model: nn.Module, targets: list[str], config: AdapterConfig) -> AdapterConfig:
    """``config`` with ``fan_in_fan_out`` True when a target is GPT-2's ``Conv1D`` (what PEFT reads to transpose)."""
    conv1d = any(isinstance(model.get_submodule(n), Conv1D) for n in targets)
    return config.replace(fan_in_fan_out=True) if conv1d and not config.fan_in_fan_out else config


def find_modules_to_save(model: nn.Module, config: AdapterConfig) -> dict[str, nn.Module]:
    """Module path -> module for each ``modules_to_save`` entry (exact name or ``.name`` suffix).

    A head name PEFT adds by itself for ``SEQ_CLS`` / ``TOKEN_CLS`` (``classifier``, ``score``, since PEFT 0.22 also
    ``pre_classifier``) may match nothing: PEFT writes every candidate, a model has some of them.

    Raises:
        ValueError: an entry matches no module (other than such a head name).
    """
    found = {n: m for n, m in model.named_modules() if n and any(n == e or n.endswith(f".{e}")
                                                                  for e in config.modules_to_save or ())}
    for entry in config.modules_to_save or ():
        if config.task_type in PEFT_HEAD_TASK_TYPES and entry in PEFT_TASK_HEAD_NAMES:
            continue  # PEFT lists every candidate head for these task types; a model has some of them
        if not any(n == entry or n.endswith(f".{entry}") for n in found):
            raise ValueError(f"modules_to_save: expected module names in the model, received {entry!r} which matches none")
    return found


def _parent(model: nn.Module, name: str) -> tuple[nn.Module, str]:
    parent_name, _, attr = name.rpartition(".")
    return (model.get_submodule(parent_name) if parent_name else model), attr
