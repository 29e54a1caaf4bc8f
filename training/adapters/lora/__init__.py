"""LoRA (PEFT-compatible): ``LoraConfig``, ``LoraLinear``, ``LoraModel``; registers the ``lora`` method."""

from ..registry import register_method
from .config import LoraConfig
from .layer import LoraLinear
from .model import LoraModel

register_method(name="lora", config_cls=LoraConfig, model_cls=LoraModel)

__all__ = ["LoraConfig", "LoraLinear", "LoraModel"]
