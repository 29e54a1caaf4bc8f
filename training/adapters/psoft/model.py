"""``PsoftModel``: injects :class:`PsoftLinear`; exports exactly to a PEFT-layout rank-r LoRA."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from ..checkpoint import write_adapter
from ..lora import LoraConfig
from ..model import PEFT_PREFIX, AdapterModel
from .config import PsoftConfig
from .layer import PsoftLinear


class PsoftModel(AdapterModel):
    """A base model with PSOFT layers (Wu, Hu, Min, Wang, "Efficient Orthogonal Fine-Tuning with Principal
    Subspace Adaptation", ICLR 2026, arXiv 2505.11235).

    Example:
        >>> model = inject(base, PsoftConfig(r=16, psoft_alpha=16, target_modules=["query", "value"]))
        >>> model.save_as_lora("runs/psoft-as-lora")   # loads in peft, vLLM, veil's engine
    """

    config: PsoftConfig

    def create_layer(self, base: nn.Linear, name: str) -> PsoftLinear:
        return PsoftLinear(base, self.config.rank_for(name), self.config)

    def lora_config(self) -> LoraConfig:
        """The LoRA config of the exact export: same targets and ranks, ``lora_alpha = psoft_alpha``."""
        c = self.config
        return LoraConfig(target_modules=c.target_modules, exclude_modules=c.exclude_modules,
                          modules_to_save=c.modules_to_save, r=c.r, rank_pattern=dict(c.rank_pattern),
                          lora_alpha=c.psoft_alpha, task_type=c.task_type,
                          base_model_name_or_path=c.base_model_name_or_path)

    @torch.no_grad()
    def lora_state_dict(self) -> dict[str, torch.Tensor]:
        """PEFT LoRA tensors reproducing this PSOFT adapter exactly (ΔW = s·B(C − I)A has rank ≤ r)."""
        out = {}
        for name, layer in self.adapter_layers().items():
            lora_a, lora_b = layer.lora_factors()
            out[f"{PEFT_PREFIX}{name}.lora_A.weight"] = lora_a
            out[f"{PEFT_PREFIX}{name}.lora_B.weight"] = lora_b
        for name, module in self.saved_modules.items():
            out.update({f"{PEFT_PREFIX}{name}.{k}": v for k, v in module.state_dict().items()})
        return out

    def save_as_lora(self, out_dir: str | Path) -> Path:
        """Write the exact LoRA export in the PEFT layout (atomic folder swap)."""
        return write_adapter(out_dir, self.lora_config().to_peft_dict(), self.lora_state_dict())
