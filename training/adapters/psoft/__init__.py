"""PSOFT (principal-subspace orthogonal fine-tuning): ``PsoftConfig``, ``PsoftLinear``, ``PsoftModel``."""

from veil.lazy import lazy_exports

from ..registry import register_method
from .config import PsoftConfig

register_method(name="psoft", config_cls=PsoftConfig, model_cls="veil.training.adapters.psoft.model:PsoftModel")

# layers and model load on first use: registering the method and building its config need no torch
__getattr__, __dir__ = lazy_exports(__name__, {"OrthRotation": ".layer", "PsoftLinear": ".layer", "canonical_signs": ".layer", "canonical_svd": ".layer", "PsoftModel": ".model"})

__all__ = ["OrthRotation", "PsoftConfig", "PsoftLinear", "PsoftModel", "canonical_signs", "canonical_svd"]
