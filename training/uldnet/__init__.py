"""ULD-Net (ICLR 2026): fully polynomial networks trained from scratch for CKKS encrypted inference.

Public names: PolyNorm, PolyAct, LinearAttention, the model families, multiplicative_depth and the trainer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from veil.lazy import lazy_exports

if TYPE_CHECKING:
    from .attention import LinearAttention, MultiHeadAttention, SoftmaxAttention
    from .config import ModelConfig, PolyActConfig, PolyNormConfig, TrainConfig
    from .data import (
        DataError,
        Splits,
        load_cifar,
        load_data_spec,
        load_digits_preset,
        load_image_folder,
        load_npz,
    )
    from .depth import DepthReport, multiplicative_depth
    from .lr_range import LrRangeResult, lr_range_test
    from .models import PolyCNN, PolyMLP, PolyResNet, PolyViT, build_model
    from .photos import load_photos32
    from .polyact import PolyAct
    from .polynorm import PolyNorm
    from .trainer import TrainResult, load_uldnet, save_uldnet, train_uldnet

# public name -> the submodule that defines it, imported on first use (a CLI's --help never imports torch)
__getattr__, __dir__ = lazy_exports(__name__, {
    "LinearAttention": ".attention",
    "MultiHeadAttention": ".attention",
    "SoftmaxAttention": ".attention",
    "ModelConfig": ".config",
    "PolyActConfig": ".config",
    "PolyNormConfig": ".config",
    "TrainConfig": ".config",
    "DataError": ".data",
    "Splits": ".data",
    "load_cifar": ".data",
    "load_data_spec": ".data",
    "load_digits_preset": ".data",
    "load_image_folder": ".data",
    "load_npz": ".data",
    "DepthReport": ".depth",
    "multiplicative_depth": ".depth",
    "LrRangeResult": ".lr_range",
    "lr_range_test": ".lr_range",
    "PolyCNN": ".models",
    "PolyMLP": ".models",
    "PolyResNet": ".models",
    "load_photos32": ".photos",
    "PolyViT": ".models",
    "build_model": ".models",
    "PolyAct": ".polyact",
    "PolyNorm": ".polynorm",
    "TrainResult": ".trainer",
    "load_uldnet": ".trainer",
    "save_uldnet": ".trainer",
    "train_uldnet": ".trainer",
})

__all__ = [
    "DataError", "DepthReport", "LinearAttention", "LrRangeResult", "ModelConfig", "MultiHeadAttention", "PolyAct", "PolyActConfig", "PolyCNN",
    "PolyMLP", "PolyNorm", "PolyNormConfig", "PolyResNet", "PolyViT", "SoftmaxAttention", "Splits", "TrainConfig",
    "TrainResult", "build_model", "load_cifar", "load_data_spec", "load_digits_preset", "load_image_folder", "load_npz",
    "load_photos32", "load_uldnet", "lr_range_test", "multiplicative_depth", "save_uldnet", "train_uldnet",
]
