"""VAPT (visual adaptive prompt tuning): ``VaptConfig``, ``VaptBlock``, ``VaptModel``; registers the ``vapt`` method."""

from ..registry import register_method
from .config import VaptConfig
from .layer import AdaptivePrompt, FeatureProjector, VaptBlock
from .model import VaptModel, vapt_param_count

register_method(name="vapt", config_cls=VaptConfig, model_cls=VaptModel)

__all__ = ["AdaptivePrompt", "FeatureProjector", "VaptBlock", "VaptConfig", "VaptModel", "vapt_param_count"]
