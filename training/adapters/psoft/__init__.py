"""PSOFT (principal-subspace orthogonal fine-tuning): ``PsoftConfig``, ``PsoftLinear``, ``PsoftModel``."""

from ..registry import register_method
from .config import PsoftConfig
from .layer import OrthRotation, PsoftLinear, canonical_signs, canonical_svd
from .model import PsoftModel

register_method(name="psoft", config_cls=PsoftConfig, model_cls=PsoftModel)

__all__ = ["OrthRotation", "PsoftConfig", "PsoftLinear", "PsoftModel", "canonical_signs", "canonical_svd"]
