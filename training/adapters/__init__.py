"""veil.training.adapters: one adapter API (LoRA, PSOFT) with PEFT-layout checkpoints.

Example:
    >>> from veil.training.adapters import LoraConfig, inject
    >>> model = inject(base, LoraConfig(r=8, target_modules=["query", "value"], modules_to_save=["classifier"]))
    >>> model.save_pretrained("runs/lora")          # adapter_config.json + adapter_model.safetensors
    >>> again = AdapterModel.from_pretrained(fresh_base, "runs/lora")
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from veil.lazy import lazy_exports

if TYPE_CHECKING:
    from torch import nn

    from . import e2lora, lora, psoft
    from .config import AdapterConfig
    from .e2lora import E2LoraConfig
    from .interop import peft_base
    from .lora import LoraConfig
    from .model import AdapterModel
    from .psoft import PsoftConfig
    from .registry import METHODS, AdapterMethod, register_method

# public name -> the submodule that defines it, imported on first use (`veil finetune --help` never imports torch);
# a method package registers itself when first imported, or when the registry is first asked for it
__getattr__, __dir__ = lazy_exports(__name__, {
    "e2lora": ".e2lora", "lora": ".lora", "psoft": ".psoft", "AdapterConfig": ".config", "E2LoraConfig": ".e2lora",
    "LoraConfig": ".lora", "LoraMixerConfig": ".loramixer", "MtLoraConfig": ".mtlora", "VaptConfig": ".vapt",
    "AdapterModel": ".model", "PsoftConfig": ".psoft", "METHODS": ".registry", "AdapterMethod": ".registry",
    "get_method": ".registry", "register_method": ".registry", "peft_base": ".interop",
})


def inject(model: nn.Module, config: AdapterConfig) -> AdapterModel:
    """Wrap ``model`` (in place) with ``config``'s adapters; the base is frozen, adapters and saved modules train."""
    from .registry import get_method

    return get_method(config.method).model_cls(model, config)


__all__ = ["METHODS", "AdapterConfig", "AdapterMethod", "AdapterModel", "E2LoraConfig", "LoraConfig", "PsoftConfig",
           "e2lora", "inject", "lora", "peft_base", "psoft", "register_method"]
