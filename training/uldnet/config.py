"""ULD-Net configs: PolyNorm, PolyAct, the model families and the trainer (all JSON round-trippable)."""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Literal

from veil.config import Config, ConfigError, field

# g(x) <= 1/sqrt(x) on (0, k*mu) needs (5 - k) * sqrt(k) <= 4, i.e. k >= 2.43845 (he.md §1.3).
K_MIN_BOUNDED = 2.43845


@dataclass
class PolyNormConfig(Config):
    """PolyNorm: per-sample normalization with 1/sqrt replaced by a local quadratic (he.md §1.3)."""

    k: float = field(4.0, "b = k*mu: where g's parabola has its minimum; paper value 4, valid range (1, 5)")
    mu: float = field(2.0, "point where g matches 1/sqrt(x) in value and slope; paper value 2")
    momentum: float = field(0.1, "EMA momentum of the running mean of the per-sample variance (Var-bar)")
    eps: float = field(1e-5, "epsilon of the exact LayerNorm used during warm-up")
    token_stats: Literal["feature", "sample"] = field(
        "feature", "statistics for (B, N, D) tokens: 'feature' = over D per token, 'sample' = over N and D (the paper's ViT axis)")
    affine: bool = field(True, "learn an elementwise gain and bias after normalizing")
    channel_prenorm: bool = field(
        False, "feature maps only, veil's addition (not in the paper): standardize each channel with batch statistics "
               "(running ones at inference; BatchNorm2d without gain or bias) before the per-sample statistics. At "
               "inference it is a per-channel affine map that folds into the preceding linear op: no CKKS level, no "
               "rotation")
    train_fallback: bool = field(
        False, "in training only, samples with mu*v beyond the parabola's vertex k*mu use the exact 1/sqrt (the "
               "authors' precursor code does this); evaluation and export are always polynomial")

    def validate(self) -> None:
        if not 1.0 < self.k < 5.0:
            raise ConfigError(f"PolyNormConfig.k: expected 1 < k < 5, received {self.k}")
        if self.k < K_MIN_BOUNDED:
            warnings.warn(f"PolyNormConfig.k={self.k} < {K_MIN_BOUNDED}: g(x) <= 1/sqrt(x) no longer holds on (0, k*mu)",
                          UserWarning, stacklevel=3)
        if self.mu <= 0:
            raise ConfigError(f"PolyNormConfig.mu: expected > 0, received {self.mu}")
        if not 0.0 < self.momentum <= 1.0:
            raise ConfigError(f"PolyNormConfig.momentum: expected in (0, 1], received {self.momentum}")

    def quadratic(self) -> tuple[float, float, float]:
        """(a, b, c) of g(x) = a (x - b)^2 + c, the fit of 1/sqrt(x) at x = mu with b = k mu."""
        a = -1.0 / (4.0 * (1.0 - self.k) * self.mu**2.5)
        c = (5.0 - self.k) / (4.0 * math.sqrt(self.mu))
        return a, self.k * self.mu, c


@dataclass
class PolyActConfig(Config):
    """PolyAct(x) = Dropout(sum_i alpha_i c_i x^i): trainable alpha_i, fixed scale factors c_i (he.md §1.4)."""

    degree: int = field(2, "polynomial degree, 0..3 (paper: 2 for ResNets, 3 for VanillaNet)")
    init: Literal["relu_fit", "gelu_fit", "identity", "square"] = field(
        "relu_fit", "initial coefficients: least-squares fit of ReLU/GELU under N(0,1), identity x, or pure x^2")
    per_channel: bool = field(True, "one coefficient set per channel (as in the authors' precursor code)")
    scales: list[float] = field([1.0, 1.0, 0.1, 0.1], "fixed factors c_0..c_3 (per-coefficient learning-rate scalers)")
    dropout: float = field(0.0, "dropout after the polynomial")
    trainable: bool = field(True, "train the coefficients alpha (False keeps the initial polynomial)")

    def validate(self) -> None:
        if not 0 <= self.degree <= 3:
            raise ConfigError(f"PolyActConfig.degree: expected 0..3 (depth <= 3), received {self.degree}")
        if len(self.scales) < self.degree + 1 or any(s <= 0 for s in self.scales[: self.degree + 1]):
            raise ConfigError(f"PolyActConfig.scales: expected {self.degree + 1} positive factors, received {self.scales}")
        if self.init == "square" and self.degree < 2:
            raise ConfigError(f"PolyActConfig.init: 'square' needs degree >= 2, received degree {self.degree}")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"PolyActConfig.dropout: expected in [0, 1), received {self.dropout}")


@dataclass
class ModelConfig(Config):
    """One of the ULD-Net model families, or the same architecture with standard ops (baseline=True)."""

    arch: Literal["mlp", "cnn", "resnet", "vit"] = field(
        "cnn", "model family: PolyMLP, PolyCNN (small ResNet-style), PolyResNet (CIFAR ResNet-20 style) or PolyViT")
    baseline: bool = field(False, "build the same network with standard ops (ReLU, LayerNorm/BatchNorm, softmax, MaxPool)")
    input_shape: list[int] = field([1, 8, 8], "shape of one sample: (C, H, W) for images, (F,) for feature vectors (mlp)")
    num_classes: int = field(10, "number of output classes")
    width: int = field(32, "hidden size (mlp), base channels (cnn; resnet: stages width/2w/4w, 16 for ResNet-20) or "
                           "embedding size (vit)")
    depth: int = field(1, "hidden layers (mlp), residual blocks per stage (cnn; resnet: n, 3 for ResNet-20, 6n+2 "
                          "layers) or transformer blocks (vit)")
    heads: int = field(4, "attention heads (vit)")
    patch_size: int = field(2, "patch size (vit)")
    mlp_ratio: int = field(2, "hidden expansion of the transformer MLP (vit)")
    normalize: bool = field(True, "insert normalization layers (mlp only may switch them off)")
    residual: bool = field(True, "cnn: ResNet-style residual stages; False: a plain stack stem -> depth x conv3x3 -> "
                                 "head (fewer CKKS levels, for leveled encrypted inference)")
    stem_stride: int = field(1, "cnn: stride of the stem convolution (2 halves H and W before any stage)")
    block_norm: bool = field(True, "cnn plain stack (residual False): a PolyNorm after every conv; False: after the "
                                   "stem only (3 levels fewer per conv)")
    head: Literal["gap", "flatten"] = field("gap", "cnn: global average pool or flatten the last feature map before "
                                                   "the classifier")
    zero_init_residual: bool = field(False, "resnet: start each block's last conv at zero, so every block starts as "
                                            "its shortcut (Goyal et al. 2017; torchvision's zero_init_residual)")
    norm: PolyNormConfig = field(None, "PolyNorm settings")  # type: ignore[arg-type]
    act: PolyActConfig = field(None, "PolyAct settings")  # type: ignore[arg-type]

    def __post_init__(self) -> None:
        self.norm = PolyNormConfig() if self.norm is None else self.norm
        self.act = PolyActConfig() if self.act is None else self.act
        super().__post_init__()

    def validate(self) -> None:
        if any(s <= 0 for s in self.input_shape) or not self.input_shape:
            raise ConfigError(f"ModelConfig.input_shape: expected positive sizes, received {self.input_shape}")
        if self.arch in ("cnn", "resnet", "vit") and len(self.input_shape) != 3:
            raise ConfigError(f"ModelConfig.input_shape: arch '{self.arch}' expects (C, H, W), received {self.input_shape}")
        if self.arch == "cnn":
            if self.stem_stride not in (1, 2):
                raise ConfigError(f"ModelConfig.stem_stride: expected 1 or 2, received {self.stem_stride}")
            h, w = (math.ceil(s / self.stem_stride) for s in self.input_shape[1:])
            if self.residual and (h < 2 or w < 2):
                raise ConfigError(f"ModelConfig.stem_stride: the residual PolyCNN pools the {h}x{w} map after the "
                                  f"stem, expected at least 2x2, received stem_stride {self.stem_stride} on "
                                  f"{self.input_shape[1]}x{self.input_shape[2]}")
        if self.arch != "mlp" and not self.normalize:
            raise ConfigError(f"ModelConfig.normalize: only arch 'mlp' may switch normalization off, received arch '{self.arch}'")
        if self.arch == "resnet" and min(self.input_shape[1:]) < 4:
            raise ConfigError(f"ModelConfig.input_shape: arch 'resnet' halves H and W twice, expected at least 4x4, "
                              f"received {self.input_shape}")
        if self.arch == "vit":
            _, h, w = self.input_shape
            if h % self.patch_size or w % self.patch_size:
                raise ConfigError(f"ModelConfig.patch_size: expected a divisor of {h}x{w}, received {self.patch_size}")
            if self.width % (2 * self.heads):
                raise ConfigError(f"ModelConfig.width: expected a multiple of 2*heads={2 * self.heads} (RoPE pairs), received {self.width}")
        for name in ("num_classes", "width"):
            if getattr(self, name) < 1:
                raise ConfigError(f"ModelConfig.{name}: expected >= 1, received {getattr(self, name)}")
        at_least = 1 if self.arch in ("resnet", "vit") else 0
        if self.depth < at_least:
            raise ConfigError(f"ModelConfig.depth: expected >= {at_least} for arch '{self.arch}', received {self.depth}")


@dataclass
class TrainConfig(Config):
    """How a ULD-Net model is trained (the same settings train its standard-op baseline)."""

    epochs: int = field(40, "training epochs")
    warmup_epochs: int = field(5, "epochs with the exact LayerNorm before switching PolyNorm on (initialises Var-bar)")
    batch_size: int = field(64, "mini-batch size")
    lr: float = field(1e-3, "peak learning rate (AdamW, cosine decay)")
    weight_decay: float = field(5e-4, "AdamW weight decay")
    lambda1: float = field(0.0, "L1 penalty weight on the mean relative variance v (paper value NOT FOUND)")
    lambda2: float = field(1e-2, "L2 penalty weight on the mean (v - 1)^2 (paper value NOT FOUND)")
    warmup_penalty: bool = field(False, "apply the variance penalties during the warm-up too, so the relative "
                                        "variances v are near 1 when PolyNorm switches to the polynomial")
    grad_clip: float = field(1.0, "clip the gradient norm to this value (0 disables)")
    augment: bool = field(True, "random pixel shifts of image inputs (up to --shift pixels each way, zero fill)")
    shift: int = field(1, "with augment: the largest random shift in pixels each way (CIFAR's pad-4 crop is 4)")
    flip_rotate: bool = field(False, "with augment: also flip each square image at random and turn it by a random "
                                     "multiple of 90 degrees (photos32's crops are drawn that way)")
    label_smoothing: float = field(0.1, "cross-entropy label smoothing")
    seed: int = field(0, "seed of initialisation, shuffling and augmentation")
    threads: int = field(0, "torch CPU threads (0 keeps torch's default)")

    def validate(self) -> None:
        if self.shift < 0:
            raise ConfigError(f"TrainConfig.shift: expected >= 0 pixels, received {self.shift}")
        for name in ("epochs", "batch_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"TrainConfig.{name}: expected >= 1, received {getattr(self, name)}")
        if not 0 <= self.warmup_epochs < self.epochs:
            raise ConfigError(f"TrainConfig.warmup_epochs: expected 0 <= TrainConfig.warmup_epochs < TrainConfig.epochs="
                              f"{self.epochs}, received {self.warmup_epochs}; lower TrainConfig.warmup_epochs (e.g. to "
                              f"{max(0, min(self.epochs // 5, self.epochs - 1))}) or raise TrainConfig.epochs")
        for name in ("lr", "weight_decay", "lambda1", "lambda2", "grad_clip", "label_smoothing"):
            if getattr(self, name) < 0:
                raise ConfigError(f"TrainConfig.{name}: expected >= 0, received {getattr(self, name)}")


# The digits preset per family: ModelConfig and TrainConfig fields over their defaults. Chosen on the
# validation split (docs/results.md has the measured test accuracy); flags and --config override them.
DIGITS_PRESETS: dict[str, dict[str, dict]] = {
    "mlp": {"model": {"width": 128, "depth": 2}, "train": {}},
    "cnn": {"model": {"width": 32, "depth": 1}, "train": {}},
    "vit": {"model": {"width": 64, "depth": 2, "heads": 4, "patch_size": 4}, "train": {"epochs": 100}},
}

# A digits model shallow enough for leveled CKKS (6 levels: Linear, PolyNorm, PolyAct, Linear): the
# encrypted-inference digits benchmark uses it; the digits PolyCNN (28 levels) needs bootstrapping.
DIGITS_HE_PRESET: dict[str, dict] = {"model": {"arch": "mlp", "width": 64, "depth": 1},
                                     "train": {"lr": 1e-2, "epochs": 60}}

# `--preset digits-he`, per family: models whose compiled HE plan fits one leveled 128-bit parameter set.
# The CNN is the plain ULD-Net stack: conv3x3 stride 2 (8x8 -> 4x4, 24 channels) -> PolyNorm -> PolyAct ->
# conv3x3 24 -> 24 -> PolyAct -> flatten -> Linear: 8 levels (1 + 3 + 1, 1 + 1, 1), N = 16384. Chosen on the
# validation split among plain stacks of 1-2 convs (docs/uldnet.md has the 3-seed test accuracy).
DIGITS_HE_PRESETS: dict[str, dict[str, dict]] = {
    "mlp": DIGITS_HE_PRESET,
    "cnn": {"model": {"arch": "cnn", "width": 24, "depth": 1, "residual": False, "stem_stride": 2,
                      "block_norm": False, "head": "flatten"},
            "train": {"lr": 1e-2}},
}

# `--preset photos32` (the bundled 32x32 RGB task, photos.py), per family. ResNet-20: width 16 (16/32/64
# channels), n = 3 pre-activation blocks per stage, 97 levels at degree 2; the ViT: patch 4 (64 tokens), 4
# blocks of width 64. PolyNorm's training-time fallback to the exact 1/sqrt for samples past the parabola's
# vertex (train_fallback) is what keeps the deep nets alive when PolyNorm switches on: without it the
# PolyResNet-20 fell to chance in that epoch (lr 3e-3, with or without the warm-up penalty) and the ViT
# overflowed to NaN (and per-token statistics overflowed at lr 1e-3 too). Evaluation is always polynomial.
# The polynomial nets train for lr in 1e-3 ... 3e-2 (docs/uldnet.md); the twin gets the same budget. The ResNet's
# blocks start as their shortcuts (zero_init_residual: +3 pts at 8 epochs, the twin +2) and its batches are
# flipped and turned as photos32's crops are; 30 epochs fit the 15-minute budget on 2 cores. Its PolyNorms standardize
# each channel before the per-sample statistics (channel_prenorm, veil's addition: free under HE, +12.5 points at 8
# epochs, docs/results.md § uldnet_ablation).
PHOTOS32_PRESETS: dict[str, dict[str, dict]] = {
    "resnet": {"model": {"arch": "resnet", "width": 16, "depth": 3, "zero_init_residual": True,
                         "norm": {"train_fallback": True, "channel_prenorm": True}},
               "train": {"epochs": 30, "warmup_epochs": 2, "lr": 3e-3, "batch_size": 64, "lambda2": 0.1,
                         "warmup_penalty": True, "flip_rotate": True}},
    "vit": {"model": {"arch": "vit", "width": 64, "depth": 4, "heads": 4, "patch_size": 4, "mlp_ratio": 2,
                      "norm": {"token_stats": "sample", "train_fallback": True}},
            "train": {"epochs": 20, "warmup_epochs": 3, "lr": 1e-3, "batch_size": 64}},
}

# the family --preset gives when --arch is not named
DEFAULT_ARCH: dict[str, str] = {"digits": "cnn", "digits-he": "cnn", "photos32": "resnet"}

# `--data` / `--image-folder` (your own data): the families whose shape has a recipe of its own (the
# photos32 one: ResNet-20, the patch-4 ViT); the other families start from the ModelConfig defaults.
ARCH_RECIPES: dict[str, dict[str, dict]] = {"resnet": PHOTOS32_PRESETS["resnet"]}
