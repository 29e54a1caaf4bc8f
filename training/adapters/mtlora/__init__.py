"""mtLoRA (multi-task block-level HydraLoRA with fine-grained routing): ``MtLoraConfig``, ``MtLoraBlock``,
``MtLoraModel``; registers the ``mtlora`` method."""

from veil.lazy import lazy_exports

from ..registry import register_method
from .config import MtLoraConfig

register_method(name="mtlora", config_cls=MtLoraConfig, model_cls="veil.training.adapters.mtlora.model:MtLoraModel")

# layers and model load on first use: registering the method and building its config need no torch
__getattr__, __dir__ = lazy_exports(__name__, {"MtLoraBlock": ".layer", "block_param_count": ".layer", "MtLoraModel": ".model"})

__all__ = ["MtLoraBlock", "MtLoraConfig", "MtLoraModel", "block_param_count"]
