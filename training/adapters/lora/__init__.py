"""LoRA (PEFT-compatible): ``LoraConfig``, ``LoraLinear``, ``LoraModel``; registers the ``lora`` method."""

from veil.lazy import lazy_exports

from ..registry import register_method
from .config import LoraConfig

register_method(name="lora", config_cls=LoraConfig, model_cls="veil.training.adapters.lora.model:LoraModel")

# layers and model load on first use: registering the method and building its config need no torch
__getattr__, __dir__ = lazy_exports(__name__, {"LoraLinear": ".layer", "LoraModel": ".model"})

__all__ = ["LoraConfig", "LoraLinear", "LoraModel"]
