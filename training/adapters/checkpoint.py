"""PEFT-layout adapter checkpoints: ``adapter_config.json`` + ``adapter_model.safetensors``.

Keys are PEFT's (``base_model.model.<module path>.lora_A.weight``, adapter name removed), so ``peft`` and every
serving system that reads PEFT LoRA load what veil writes, and veil loads what ``peft`` writes. Methods whose
saved tensors are relative to bases re-derived at load (PSOFT) convert them to PEFT's convention in their own
``adapter_state_dict`` / ``load_adapter_state_dict`` (see ``psoft/model.py``); this module writes what they give.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch import nn

from veil.atomic import atomic_dir

from .registry import METHODS, get_method

if TYPE_CHECKING:
    from .model import AdapterModel

CONFIG_NAME, WEIGHTS_NAME = "adapter_config.json", "adapter_model.safetensors"
BASE_KEY = "veil_base"  # safetensors metadata: the class of the base the adapter was saved over (peft ignores it)
# Dicts whose key order is kept in adapter_config.json (every other dict's keys are sorted): the first matching pattern
# wins, so sorting them can change a module's rank or alpha. PEFT keeps them in order since 0.22
# (``CONFIG_KEYS_WITH_PRESERVED_ORDER``); PEFT 0.21 and earlier sorted them, as veil did.
ORDERED_KEYS = ("rank_pattern", "alpha_pattern")


def save_adapter(model: AdapterModel, out_dir: str | Path) -> Path:
    """Write the adapter's config and tensors into ``out_dir`` as one atomic folder swap."""
    return write_adapter(out_dir, model.config.to_peft_dict(), model.adapter_state_dict(), type(model.model).__name__)


def write_adapter(out_dir: str | Path, config: dict[str, Any], state: dict[str, torch.Tensor],
                  base: str | None = None) -> Path:
    """Write ``adapter_config.json`` and ``adapter_model.safetensors`` into ``out_dir`` atomically; ``base`` (the
    base model's class name) goes into the tensors' metadata, which :func:`load_adapter` checks.

    Raises:
        ValueError: ``state`` is empty (an empty checkpoint is refused, not written).
    """
    out_dir = Path(out_dir)
    with atomic_dir(out_dir) as tmp:
        write_files(tmp, config, state, base)
    return out_dir


def write_files(folder: Path, config: dict[str, Any], state: dict[str, torch.Tensor], base: str | None = None) -> None:
    """The two files, written into an existing (temporary) folder; see :func:`write_adapter`."""
    tensors = {k: v.detach().contiguous().cpu() for k, v in state.items()}
    if not tensors:
        raise ValueError("save_pretrained: expected adapter tensors, received none (nothing to save)")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / CONFIG_NAME).write_text(json.dumps(_sorted_keys(config), indent=2))
    save_file(tensors, str(folder / WEIGHTS_NAME), metadata={"format": "pt", **({BASE_KEY: base} if base else {})})


def _sorted_keys(obj: Any) -> Any:
    """``obj`` with every dict's keys sorted (``json.dumps(sort_keys=True)``) but those under :data:`ORDERED_KEYS`."""
    if isinstance(obj, dict):
        return {k: v if k in ORDERED_KEYS else _sorted_keys(v) for k, v in sorted(obj.items())}
    if isinstance(obj, (list, tuple)):
        return [_sorted_keys(v) for v in obj]
    return obj


def read_config(path: str | Path):
    """The veil config of the adapter saved at ``path`` (by veil or PEFT), chosen by its ``peft_type``."""
    path = Path(path)
    if not (path / CONFIG_NAME).is_file():
        raise FileNotFoundError(f"adapter {str(path)!r}: expected {CONFIG_NAME}, not found")
    data = json.loads((path / CONFIG_NAME).read_text())
    if not isinstance(data, dict):
        raise ValueError(f"{CONFIG_NAME}: expected a JSON object, received {type(data).__name__}")
    peft_type = data.get("peft_type")
    for entry in METHODS.values():
        if entry.config_cls.peft_type == peft_type:
            return entry.config_cls.from_peft_dict(data)
    known = [e.config_cls.peft_type for e in METHODS.values()]
    raise ValueError(f"{CONFIG_NAME}: peft_type: expected one of {known}, received {peft_type!r}")


def load_adapter(base_model: nn.Module, path: str | Path) -> AdapterModel:
    """Inject the adapter saved at ``path`` into ``base_model`` (modified in place) and load its tensors.

    Warns when veil saved the adapter over a base of another class (the keys may fit while the function differs:
    a ``MeanPoolClassifier`` adapter on ``BertForSequenceClassification``).
    """
    path = Path(path)
    config = read_config(path)
    if not (path / WEIGHTS_NAME).is_file():
        raise FileNotFoundError(f"adapter {str(path)!r}: expected {WEIGHTS_NAME}, not found")
    with safe_open(str(path / WEIGHTS_NAME), framework="pt") as weights:
        saved = (weights.metadata() or {}).get(BASE_KEY)
    if saved is not None and saved != type(base_model).__name__:
        warnings.warn(f"adapter {str(path)!r}: base model expected a {saved} (what it was saved over), received a "
                      f"{type(base_model).__name__}; matching keys do not make the same function (a veil finetune "
                      "text run: load it onto peft_base(path))", UserWarning, stacklevel=3)
    model = get_method(config.method).model_cls(base_model, config)
    model.load_adapter_state_dict(load_file(str(path / WEIGHTS_NAME)))
    return model
