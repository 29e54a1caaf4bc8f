"""``VaptModel``: wraps a ViT's transformer blocks with :class:`VaptBlock`; one shared feature projector."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from ..model import AdapterModel, _parent, find_modules_to_save, with_seq_cls_head
from ..targeting import find_targets
from .config import VaptConfig
from .layer import FeatureProjector, VaptBlock

PROJECTOR_KEY = "vapt_feature_projector."  # checkpoint prefix of the shared projector (not a base-model path)


def vit_geometry(model: nn.Module) -> tuple[int, tuple[int, int], int]:
    """(d, (H, W) patch grid, p² · channels) read from a ``transformers`` ViT config (``model.config``).

    Raises:
        ValueError: the model has no config with ``hidden_size``, ``image_size``, ``patch_size``, ``num_channels``.
    """
    cfg = getattr(model, "config", None)
    keys = ("hidden_size", "image_size", "patch_size", "num_channels")
    if cfg is None or not all(hasattr(cfg, k) for k in keys):
        raise ValueError(f"VAPT: model.config: expected a transformers ViT config with {list(keys)}, received "
                         f"{type(cfg).__name__} (veil's PolyViT is not supported: its RoPE tables fix the token count)")
    size = cfg.image_size if isinstance(cfg.image_size, (tuple, list)) else (cfg.image_size, cfg.image_size)
    patch = cfg.patch_size if isinstance(cfg.patch_size, (tuple, list)) else (cfg.patch_size, cfg.patch_size)
    return cfg.hidden_size, (size[0] // patch[0], size[1] // patch[1]), patch[0] * patch[1] * cfg.num_channels


class VaptModel(AdapterModel):
    """A ViT with VAPT prompt experts (Le et al., "Revisit Visual Prompt Tuning: The Expressiveness of Prompt
    Experts", ICLR 2026, arXiv 2501.18936).

    The backbone is frozen and stays in eval mode while training (official code); only the prompts, the shared
    feature projector and ``modules_to_save`` train.

    Example:
        >>> vit = ViTForImageClassification(ViTConfig(image_size=8, patch_size=2, num_channels=1, hidden_size=32,
        ...     num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, num_labels=5))
        >>> model = inject(vit, VaptConfig(num_tokens=4, modules_to_save=["classifier"]))
        >>> model(pixel_values=torch.randn(2, 1, 8, 8)).logits.shape
        torch.Size([2, 5])
    """

    config: VaptConfig

    def __init__(self, model: nn.Module, config: VaptConfig) -> None:
        nn.Module.__init__(self)
        self.model = model
        self.config = with_seq_cls_head(model, config)
        model.requires_grad_(False)
        self.d, self.grid, patch_fan_in = vit_geometry(model)
        self.static_init_bound = math.sqrt(6.0 / (3 * patch_fan_in + self.d))  # VPT's uniform prompt init
        self.feature_projector = FeatureProjector(self.d, self.config) if self.config.feature_projector else None
        names = find_targets(model, self.config, supported=(nn.Module,))  # whole blocks, in model order
        for index, name in enumerate(names):
            parent, attr = _parent(model, name)
            setattr(parent, attr, self.create_block(getattr(parent, attr), adaptive=index >= self.config.vpt_depth))
        self.saved_modules = find_modules_to_save(model, self.config)
        for module in self.saved_modules.values():
            module.requires_grad_(True)
        self.train(self.training)

    def create_block(self, base: nn.Module, adaptive: bool) -> VaptBlock:
        """The :class:`VaptBlock` wrapping ``base``; adaptive blocks share ``self.feature_projector``."""
        return VaptBlock(base, self.d, self.grid, adaptive, self.feature_projector, self.config, self.static_init_bound)

    def train(self, mode: bool = True) -> VaptModel:
        """Train mode for prompts, projector and saved modules; the frozen backbone stays in eval mode."""
        super().train(mode)
        if mode:
            self.model.eval()
            for layer in self.adapter_layers().values():
                for name, child in layer.named_children():
                    if name != "base_layer":
                        child.train()
            for module in self.saved_modules.values():
                module.train()
        return self

    def trainable_report(self) -> dict[str, Any]:
        """As :meth:`AdapterModel.trainable_report`, plus the shared feature projector."""
        rep = super().trainable_report()
        if self.feature_projector is not None:
            n = sum(p.numel() for p in self.feature_projector.parameters() if p.requires_grad)
            total = sum(p.numel() for p in self.feature_projector.parameters())
            rep["trainable"] += n
            rep["total"] += total
            rep["percent"] = 100.0 * rep["trainable"] / max(rep["total"], 1)
            rep["modules"].append({"module": "feature_projector", "kind": "FeatureProjector", "trainable": n})
        return rep

    def adapter_state_dict(self) -> dict[str, torch.Tensor]:
        out = super().adapter_state_dict()
        if self.feature_projector is not None:
            out.update({f"{PROJECTOR_KEY}{k}": v for k, v in self.feature_projector.state_dict().items()})
        return out

    not_mergeable = (
        "VAPT is not mergeable: its prompts are extra input tokens computed from each image, "
        "not a weight update W + ΔW (spec §0); keep the VaptModel for inference"
    )


def vapt_param_count(config: VaptConfig, d: int, grid: tuple[int, int], num_blocks: int) -> int:
    """Trainable prompt parameters (spec §5.2: ``L·N_p·H′W′ + L·k² + 2rd`` + token-wise biases, LayerNorms and
    static prompts), head excluded. ``num_blocks`` counts the adapted blocks."""
    static = min(config.vpt_depth, num_blocks)
    adaptive = num_blocks - static
    h, w = grid
    if config.conv:
        k, pad = config.kernel_size, config.padding
        h, w = h + 2 * pad - k + 1, w + 2 * pad - k + 1
    per_block = config.num_tokens * h * w + config.num_tokens + 2 * d + (config.kernel_size ** 2 if config.conv else 0)
    projector = (2 * config.r * d + int(config.learnable_scale)) if config.feature_projector else 0
    return adaptive * per_block + projector + static * config.num_tokens * d
