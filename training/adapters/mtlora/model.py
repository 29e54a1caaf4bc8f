"""``MtLoraModel``: injects :class:`MtLoraBlock` around whole sub-layers; aux loss = balance + spectral (spec §1.4)."""

from __future__ import annotations

import torch
from torch import nn

from ..model import AdapterModel, _parent, find_modules_to_save, with_seq_cls_head
from ..targeting import find_targets
from .config import MtLoraConfig
from .layer import MtLoraBlock, balance_cv2
from .spectral import official_per_b, paper_cross_expert


class MtLoraModel(AdapterModel):
    """A base model with mtLoRA block adapters (Tian, Ledent, Sun, "Scalable Multi-Task Low-Rank Model Adaptation",
    ICLR 2026, arXiv 2603.01526).

    ``aux_loss()`` = λ2 · mean_adapters CV²(p̄) + λ1 · L_spec, the spectral term only on every
    ``spectral_every``-th call in training mode (one call per optimizer step, as the trainer makes it).

    Example:
        >>> model = inject(llama, MtLoraConfig(r=16, num_experts=16, block_adapter_type="ffn"))
        >>> loss = task_loss + model.aux_loss()
    """

    config: MtLoraConfig

    def __init__(self, model: nn.Module, config: MtLoraConfig) -> None:
        nn.Module.__init__(self)
        self.model = model
        self.config = with_seq_cls_head(model, config)
        model.requires_grad_(False)
        for name in find_targets(model, self.config, supported=(nn.Module,)):  # sub-layers, not only Linears
            parent, attr = _parent(model, name)
            setattr(parent, attr, self.create_layer(getattr(parent, attr), name))
        self.saved_modules = find_modules_to_save(model, self.config)
        for module in self.saved_modules.values():
            module.requires_grad_(True)
        self.step = 0
        self.generator = torch.Generator().manual_seed(0)  # samples the B's of official_per_B

    def create_layer(self, base: nn.Module, name: str) -> MtLoraBlock:  # type: ignore[override]
        return MtLoraBlock(base, self.config.rank_for(name), self.config)

    def balance_loss(self) -> torch.Tensor:
        """Mean over adapters of CV² of the mean routing weights of the last training batch (unweighted)."""
        routed = [layer.last_routing for layer in self.adapter_layers().values() if layer.last_routing is not None]
        if not routed:
            return torch.zeros(())
        return torch.stack([balance_cv2(p) for p in routed]).mean()

    def spectral_loss(self) -> torch.Tensor:
        """L_spec (unweighted) in ``config.spectral_mode``; paper mode averages Σ_{i<j} over adapters."""
        layers = list(self.adapter_layers().values())
        if self.config.spectral_mode == "official_per_B":
            bs = [b for layer in layers for b in layer.lora_B.unbind(0)]  # each (d_out, r)
            return official_per_b(bs, self.config.spectral_max_matrices, self.generator)
        return torch.stack([paper_cross_expert(layer.lora_B, self.config.spectral_keep_sigma) for layer in layers]).mean()

    def aux_loss(self) -> torch.Tensor:
        c = self.config
        loss = c.balance_alpha * self.balance_loss() if c.balance_alpha else torch.zeros(())
        if c.spectral_lambda and self.training:
            if self.step % c.spectral_every == 0:
                loss = loss + c.spectral_lambda * self.spectral_loss()
            self.step += 1
        return loss

    not_mergeable = (
        "mtLoRA is not mergeable: its routing Π(x̂) depends on the input and the block adapter "
        "runs beside a non-linear sub-layer, so no weight update W + ΔW reproduces it (spec §0)"
    )
