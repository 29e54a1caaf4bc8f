"""LoRA-Mixer (routed LoRA experts in the attention projections, RSL, plug-and-play over PEFT LoRAs):
``LoraMixerConfig``, ``LoraMixerLinear``, ``LoraMixerModel``; registers the ``loramixer`` method."""

from veil.lazy import lazy_exports

from ..registry import register_method
from .config import LoraMixerConfig

register_method(name="loramixer", config_cls=LoraMixerConfig, model_cls="veil.training.adapters.loramixer.model:LoraMixerModel")

# layers and model load on first use: registering the method and building its config need no torch
__getattr__, __dir__ = lazy_exports(__name__, {"LoraExpert": ".layer", "LoraMixerLinear": ".layer", "routing_entropy": ".layer", "rsl": ".layer", "LoraMixer": ".model", "LoraMixerModel": ".model"})

__all__ = ["LoraExpert", "LoraMixer", "LoraMixerConfig", "LoraMixerLinear", "LoraMixerModel", "routing_entropy", "rsl"]
