"""E²LoRA (entropy-guided adaptive LoRA sharing): ``E2LoraConfig``, ``plan_sharing``, ``E2LoraModel``."""

from ..registry import register_method
from .config import E2LoraConfig
from .layer import E2LoraLinear, SharedLora
from .model import E2LoraModel
from .plan import allocate_ranks, partition, plan_sharing, proxy_entropy, rmi_matrix, thresholds

register_method(name="e2lora", config_cls=E2LoraConfig, model_cls=E2LoraModel)

__all__ = ["E2LoraConfig", "E2LoraLinear", "E2LoraModel", "SharedLora", "allocate_ranks", "partition",
           "plan_sharing", "proxy_entropy", "rmi_matrix", "thresholds"]
