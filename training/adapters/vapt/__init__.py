"""VAPT (visual adaptive prompt tuning): ``VaptConfig``, ``VaptBlock``, ``VaptModel``; registers the ``vapt`` method."""

from veil.lazy import lazy_exports

from ..registry import register_method
from .config import VaptConfig

register_method(name="vapt", config_cls=VaptConfig, model_cls="veil.training.adapters.vapt.model:VaptModel")

# layers and model load on first use: registering the method and building its config need no torch
__getattr__, __dir__ = lazy_exports(__name__, {"AdaptivePrompt": ".layer", "FeatureProjector": ".layer", "VaptBlock": ".layer", "VaptModel": ".model", "vapt_param_count": ".model"})

__all__ = ["AdaptivePrompt", "FeatureProjector", "VaptBlock", "VaptConfig", "VaptModel", "vapt_param_count"]
