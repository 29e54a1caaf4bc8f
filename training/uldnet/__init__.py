"""ULD-Net (ICLR 2026): fully polynomial networks trained from scratch for CKKS encrypted inference.

Public names: PolyNorm, PolyAct, LinearAttention, the model families, multiplicative_depth and the trainer.
"""

from .attention import LinearAttention, MultiHeadAttention, SoftmaxAttention
from .config import ModelConfig, PolyActConfig, PolyNormConfig, TrainConfig
from .data import Splits, load_digits_preset, load_image_folder, load_npz
from .depth import DepthReport, multiplicative_depth
from .models import PolyCNN, PolyMLP, PolyViT, build_model
from .polyact import PolyAct
from .polynorm import PolyNorm
from .trainer import TrainResult, load_uldnet, save_uldnet, train_uldnet

__all__ = [
    "DepthReport", "LinearAttention", "ModelConfig", "MultiHeadAttention", "PolyAct", "PolyActConfig", "PolyCNN", "PolyMLP", "PolyNorm",
    "PolyNormConfig", "PolyViT", "SoftmaxAttention", "Splits", "TrainConfig", "TrainResult", "build_model",
    "load_digits_preset", "load_image_folder", "load_npz", "load_uldnet", "multiplicative_depth", "save_uldnet",
    "train_uldnet",
]
