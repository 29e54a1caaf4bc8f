"""LoRA-Mixer (routed LoRA experts in the attention projections, RSL, plug-and-play over PEFT LoRAs):
``LoraMixerConfig``, ``LoraMixerLinear``, ``LoraMixerModel``; registers the ``loramixer`` method."""

from ..registry import register_method
from .config import LoraMixerConfig
from .layer import LoraExpert, LoraMixerLinear, routing_entropy, rsl
from .model import LoraMixer, LoraMixerModel

register_method(name="loramixer", config_cls=LoraMixerConfig, model_cls=LoraMixerModel)

__all__ = ["LoraExpert", "LoraMixer", "LoraMixerConfig", "LoraMixerLinear", "LoraMixerModel", "routing_entropy", "rsl"]
