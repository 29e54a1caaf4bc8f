"""mtLoRA (multi-task block-level HydraLoRA with fine-grained routing): ``MtLoraConfig``, ``MtLoraBlock``,
``MtLoraModel``; registers the ``mtlora`` method."""

from ..registry import register_method
from .config import MtLoraConfig
from .layer import MtLoraBlock, block_param_count
from .model import MtLoraModel

register_method(name="mtlora", config_cls=MtLoraConfig, model_cls=MtLoraModel)

__all__ = ["MtLoraBlock", "MtLoraConfig", "MtLoraModel", "block_param_count"]
