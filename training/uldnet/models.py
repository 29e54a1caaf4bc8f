"""ULD-Net model families (PolyMLP, PolyCNN and its plain variant, PolyViT) and their same-architecture standard-op baselines.

Each family is built from one ModelConfig. ``baseline=True`` swaps PolyNorm -> LayerNorm (BatchNorm in
the CNN), PolyAct -> ReLU (GELU in the ViT), linear attention -> softmax attention and AvgPool -> MaxPool,
keeping every other layer the same, so accuracy differences measure the polynomial replacements only.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from torch import nn

from .attention import MultiHeadAttention
from .config import ModelConfig
from .polyact import PolyAct
from .polynorm import PolyNorm


def make_norm(config: ModelConfig, features: int, layout: str) -> nn.Module:
    """PolyNorm, or the standard normalization of the baseline (BatchNorm for maps, LayerNorm for tokens)."""
    if not config.normalize:
        return nn.Identity()
    if not config.baseline:
        return PolyNorm(features, config.norm, layout=layout)  # type: ignore[arg-type]
    return nn.BatchNorm2d(features) if layout == "channels" else nn.LayerNorm(features)


def make_act(config: ModelConfig, channels: int, channel_dim: int, standard: type[nn.Module] = nn.ReLU) -> nn.Module:
    """PolyAct, or ``standard`` (ReLU / GELU) for the baseline."""
    return standard() if config.baseline else PolyAct(channels, config.act, channel_dim=channel_dim)


class PolyMLP(nn.Module):
    """Fully polynomial MLP: depth x (Linear -> PolyNorm -> PolyAct) -> Linear.

    Example:
        >>> PolyMLP(ModelConfig(arch="mlp", input_shape=[64])).forward(torch.randn(2, 64)).shape
        torch.Size([2, 10])
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Flatten()]
        features = math.prod(config.input_shape)
        for _ in range(config.depth):
            layers += [nn.Linear(features, config.width), make_norm(config, config.width, "tokens"),
                       make_act(config, config.width, -1)]
            features = config.width
        layers.append(nn.Linear(features, config.num_classes))
        self.net = nn.Sequential(*layers)

    def forward(self, x):  # (B, *input_shape) -> (B, classes)
        return self.net(x)


class ResidualBlock(nn.Module):
    """conv3x3 (stride) -> norm -> act -> conv3x3 -> norm, plus the shortcut (identity, or a 1x1 conv with the
    same stride when the shape changes), then act. Polynomial: 2 convs + 2 PolyNorm + 2 PolyAct = 10 levels at
    degree 2 (the shortcut's 1x1 conv runs beside the longer branch)."""

    def __init__(self, config: ModelConfig, c_in: int, c_out: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1)
        self.norm1 = make_norm(config, c_out, "channels")
        self.act1 = make_act(config, c_out, 1)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, padding=1)
        self.norm2 = make_norm(config, c_out, "channels")
        self.shortcut = nn.Conv2d(c_in, c_out, 1, stride=stride) if c_in != c_out or stride != 1 else nn.Identity()
        self.act2 = make_act(config, c_out, 1)

    def forward(self, x):  # (B, C_in, H, W) -> (B, C_out, H, W)
        y = self.norm2(self.conv2(self.act1(self.norm1(self.conv1(x)))))
        return self.act2(y + self.shortcut(x))


def make_stem(config: ModelConfig) -> nn.Sequential:
    """conv3x3 (stride ``config.stem_stride``) -> norm -> act: the first layer of both CNN variants."""
    c, w = config.input_shape[0], config.width
    return nn.Sequential(nn.Conv2d(c, w, 3, stride=config.stem_stride, padding=1), make_norm(config, w, "channels"),
                         make_act(config, w, 1))


def make_head(config: ModelConfig, channels: int, spatial: int) -> nn.Sequential:
    """Global average pool (or flatten ``channels x spatial`` features), then the classifier."""
    if config.head == "gap":
        return nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(channels, config.num_classes))
    return nn.Sequential(nn.Flatten(), nn.Linear(channels * spatial, config.num_classes))


def stem_size(config: ModelConfig) -> tuple[int, int]:
    """(H, W) of the stem's output map (3x3 kernel, padding 1)."""
    return tuple(math.ceil(s / config.stem_stride) for s in config.input_shape[1:])  # type: ignore[return-value]


class PolyCNN(nn.Module):
    """Small ResNet-style polynomial CNN: stem, stage 1 (width), AvgPool 2x2, stage 2 (2 x width), GAP, Linear.

    Example:
        >>> PolyCNN(ModelConfig(arch="cnn")).forward(torch.randn(2, 1, 8, 8)).shape
        torch.Size([2, 10])
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        w = config.width
        h, wd = stem_size(config)
        self.stem = make_stem(config)
        self.stage1 = nn.Sequential(*[ResidualBlock(config, w, w) for _ in range(config.depth)])
        self.pool = nn.MaxPool2d(2) if config.baseline else nn.AvgPool2d(2)
        widths = [w] + [2 * w] * max(config.depth, 1)
        self.stage2 = nn.Sequential(*[ResidualBlock(config, widths[i], widths[i + 1]) for i in range(max(config.depth, 1))])
        self.head = make_head(config, 2 * w, (h // 2) * (wd // 2))

    def forward(self, x):  # (B, C, H, W) -> (B, classes)
        return self.head(self.stage2(self.pool(self.stage1(self.stem(x)))))


class PreActBlock(nn.Module):
    """Pre-activation residual block (He et al., ECCV 2016): x + conv3x3(act(norm(conv3x3(act(norm(x)))))), the
    first conv with the stage's stride, the shortcut identity or a strided 1x1 conv. The residual stream stays
    linear: a post-activation block squares the sum ``y + x`` with PolyAct in every block, and over 9 blocks
    that grows the activations doubly exponentially (ResNet-20 overflowed to NaN in its first epoch).
    Polynomial: PolyNorm 3 + PolyAct 1 + conv 1, twice = 10 levels at degree 2."""

    def __init__(self, config: ModelConfig, c_in: int, c_out: int, stride: int = 1) -> None:
        super().__init__()
        self.norm1 = make_norm(config, c_in, "channels")
        self.act1 = make_act(config, c_in, 1)
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1)
        self.norm2 = make_norm(config, c_out, "channels")
        self.act2 = make_act(config, c_out, 1)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, padding=1)
        self.shortcut = nn.Conv2d(c_in, c_out, 1, stride=stride) if c_in != c_out or stride != 1 else nn.Identity()

    def forward(self, x):  # (B, C_in, H, W) -> (B, C_out, H / stride, W / stride)
        y = self.conv1(self.act1(self.norm1(x)))
        return self.shortcut(x) + self.conv2(self.act2(self.norm2(y)))


class PolyResNet(nn.Module):
    """CIFAR-style ResNet (He et al., CVPR 2016, §4.2) with pre-activation blocks: stem conv3x3 -> 3 stages x n
    blocks at width, 2 width, 4 width channels (the 2nd and 3rd start with stride 2) -> norm -> act -> global
    average pool -> Linear. ``width=16, depth=3`` is ResNet-20 (6n + 2 = 20 weighted layers). Per-sample
    PolyNorm and PolyAct everywhere; the baseline twin has BatchNorm and ReLU at the same places and the
    same convolutions and pooling.

    Example:
        >>> cfg = ModelConfig(arch="resnet", input_shape=[3, 32, 32], width=16, depth=3)
        >>> PolyResNet(cfg).forward(torch.randn(2, 3, 32, 32)).shape
        torch.Size([2, 10])
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        w = config.width
        self.stem = nn.Conv2d(config.input_shape[0], w, 3, padding=1)
        stages, c_in = [], w
        for i, c_out in enumerate((w, 2 * w, 4 * w)):
            blocks = [PreActBlock(config, c_in if j == 0 else c_out, c_out, stride=2 if i and j == 0 else 1)
                      for j in range(config.depth)]
            stages.append(nn.Sequential(*blocks))
            c_in = c_out
        self.stages = nn.Sequential(*stages)
        self.head = nn.Sequential(make_norm(config, 4 * w, "channels"), make_act(config, 4 * w, 1),
                                  nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4 * w, config.num_classes))
        if config.zero_init_residual:
            for block in self.modules():
                if isinstance(block, PreActBlock):
                    nn.init.zeros_(block.conv2.weight)
                    nn.init.zeros_(block.conv2.bias)

    def forward(self, x):  # (B, C, H, W) -> (B, classes)
        return self.head(self.stages(self.stem(x)))  # stages: (B, w, H, W) -> (B, 4w, H/4, W/4)


class PlainPolyCNN(nn.Module):
    """Plain polynomial CNN for leveled CKKS: stem, ``depth`` x (conv3x3 -> [norm] -> act), head.

    No residual adds and no pooling between convs; with ``block_norm=False`` only the stem is followed by a
    PolyNorm, so a conv costs 2 levels (conv, degree-2 PolyAct) instead of 5. The ``digits-he`` CNN preset is
    stride-2 stem (8x8 -> 4x4), one conv, flatten, Linear: 8 levels.

    Example:
        >>> cfg = ModelConfig(arch="cnn", residual=False, stem_stride=2, block_norm=False, head="flatten")
        >>> PlainPolyCNN(cfg).forward(torch.randn(2, 1, 8, 8)).shape
        torch.Size([2, 10])
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        w = config.width
        h, wd = stem_size(config)
        self.stem = make_stem(config)
        layers: list[nn.Module] = []
        for _ in range(config.depth):
            layers += [nn.Conv2d(w, w, 3, padding=1), make_norm(config, w, "channels") if config.block_norm
                       else nn.Identity(), make_act(config, w, 1)]
        self.body = nn.Sequential(*layers)
        self.head = make_head(config, w, h * wd)

    def forward(self, x):  # (B, C, H, W) -> (B, classes)
        return self.head(self.body(self.stem(x)))


class TransformerBlock(nn.Module):
    """Pre-norm block: x + Attn(Norm(x)); x + MLP(Norm(x))."""

    def __init__(self, config: ModelConfig, num_tokens: int) -> None:
        super().__init__()
        d = config.width
        self.norm1 = make_norm(config, d, "tokens")
        self.attn = MultiHeadAttention(d, config.heads, num_tokens, linear=not config.baseline)
        self.norm2 = make_norm(config, d, "tokens")
        self.mlp = nn.Sequential(nn.Linear(d, config.mlp_ratio * d), make_act(config, config.mlp_ratio * d, -1, nn.GELU),
                                 nn.Linear(config.mlp_ratio * d, d))

    def forward(self, x):  # (B, N, D) -> (B, N, D)
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class PolyViT(nn.Module):
    """Tiny polynomial ViT: patch embedding, blocks with linear attention, final norm, token mean, Linear.

    Example:
        >>> PolyViT(ModelConfig(arch="vit", width=32)).forward(torch.randn(2, 1, 8, 8)).shape
        torch.Size([2, 10])
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        c, h, w = config.input_shape
        p, d = config.patch_size, config.width
        num_tokens = (h // p) * (w // p)
        self.patch = nn.Conv2d(c, d, p, stride=p)
        self.blocks = nn.Sequential(*[TransformerBlock(config, num_tokens) for _ in range(config.depth)])
        self.norm = make_norm(config, d, "tokens")
        self.fc = nn.Linear(d, config.num_classes)

    def forward(self, x):  # (B, C, H, W) -> (B, classes)
        tokens = self.patch(x).flatten(2).transpose(1, 2)  # (B, N, D)
        return self.fc(self.norm(self.blocks(tokens)).mean(dim=1))


def build_cnn(config: ModelConfig) -> nn.Module:
    """The residual PolyCNN, or the plain stack when ``config.residual`` is False."""
    return PolyCNN(config) if config.residual else PlainPolyCNN(config)


ARCHITECTURES: dict[str, Callable[[ModelConfig], nn.Module]] = {"mlp": PolyMLP, "cnn": build_cnn, "resnet": PolyResNet,
                                                                 "vit": PolyViT}


def build_model(config: ModelConfig) -> nn.Module:
    """The network ``config`` describes (a ULD-Net model, or its standard-op baseline)."""
    return ARCHITECTURES[config.arch](config)
