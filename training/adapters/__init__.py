"""veil.training.adapters: one adapter API (LoRA, PSOFT) with PEFT-layout checkpoints.

Example:
    >>> from veil.training.adapters import LoraConfig, inject
    >>> model = inject(base, LoraConfig(r=8, target_modules=["query", "value"], modules_to_save=["classifier"]))
    >>> model.save_pretrained("runs/lora")          # adapter_config.json + adapter_model.safetensors
    >>> again = AdapterModel.from_pretrained(fresh_base, "runs/lora")
"""

from __future__ import annotations

from torch import nn

from . import e2lora, lora, psoft
from .config import AdapterConfig
from .e2lora import E2LoraConfig
from .lora import LoraConfig
from .loramixer import LoraMixerConfig  # noqa: F401  (registers the loramixer method)
from .model import AdapterModel
from .mtlora import MtLoraConfig  # noqa: F401  (registers the mtlora method)
from .psoft import PsoftConfig
from .registry import METHODS, AdapterMethod, get_method, register_method
from .vapt import VaptConfig  # noqa: F401  (registers the vapt method)


def inject(model: nn.Module, config: AdapterConfig) -> AdapterModel:
    """Wrap ``model`` (in place) with ``config``'s adapters; the base is frozen, adapters and saved modules train."""
    return get_method(config.method).model_cls(model, config)


__all__ = ["METHODS", "AdapterConfig", "AdapterMethod", "AdapterModel", "E2LoraConfig", "LoraConfig", "PsoftConfig",
           "e2lora", "inject", "lora", "psoft", "register_method"]
