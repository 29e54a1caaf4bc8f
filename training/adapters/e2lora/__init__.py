"""E²LoRA (entropy-guided adaptive LoRA sharing): ``E2LoraConfig``, ``plan_sharing``, ``E2LoraModel``."""

from veil.lazy import lazy_exports

from ..registry import register_method
from .config import E2LoraConfig

register_method(name="e2lora", config_cls=E2LoraConfig, model_cls="veil.training.adapters.e2lora.model:E2LoraModel")

# layers and model load on first use: registering the method and building its config need no torch
__getattr__, __dir__ = lazy_exports(__name__, {"E2LoraLinear": ".layer", "SharedLora": ".layer", "E2LoraModel": ".model", "allocate_ranks": ".plan", "partition": ".plan", "plan_sharing": ".plan", "proxy_entropy": ".plan", "rmi_matrix": ".plan", "thresholds": ".plan"})

__all__ = ["E2LoraConfig", "E2LoraLinear", "E2LoraModel", "SharedLora", "allocate_ranks", "partition",
           "plan_sharing", "proxy_entropy", "rmi_matrix", "thresholds"]
