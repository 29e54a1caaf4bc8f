"""``LoraModel``: injects :class:`LoraLinear` into every targeted linear."""

from __future__ import annotations

from torch import nn

from ..model import AdapterModel
from .config import LoraConfig
from .layer import LoraLinear


class LoraModel(AdapterModel):
    """A base model with LoRA layers (Hu et al., "LoRA: Low-Rank Adaptation of Large Language Models", ICLR 2022).

    Example:
        >>> from veil.training.adapters import LoraConfig, inject
        >>> model = inject(base, LoraConfig(r=8, target_modules=["query", "value"]))
        >>> print(model.format_trainable_report())
    """

    config: LoraConfig

    def create_layer(self, base: nn.Linear, name: str) -> LoraLinear:
        return LoraLinear(base, self.config.rank_for(name), self.config.scaling_for(name), self.config.lora_dropout)
