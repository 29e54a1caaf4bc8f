"""``E2LoraModel``: injects :class:`E2LoraLinear` with one :class:`SharedLora` per interval; saves the shared
factors once, and exports un-shared to a plain PEFT LoRA (``save_as_lora``)."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from ..checkpoint import write_adapter
from ..config import AdapterConfig
from ..layer import linear_dims
from ..lora import LoraConfig
from ..model import PEFT_PREFIX, AdapterModel
from .config import E2LoraConfig
from .layer import E2LoraLinear, SharedLora


class E2LoraModel(AdapterModel):
    """A base model whose targeted linears share LoRAs by interval (Li, Ye, Ye, He, Chen, "Efficient and Effective
    LoRA with Entropy-Guided Adaptive Sharing", ICLR 2026). The config must carry a plan (``plan_sharing``).

    Example:
        >>> cfg = plan_sharing(base, E2LoraConfig(r=8, target_modules=["query", "value"]), loss_fn)
        >>> model = inject(base, cfg)
        >>> model.save_as_lora("runs/e2lora-as-lora")   # plain LoRA: peft, veil export adapters, serving
    """

    config: E2LoraConfig

    def __init__(self, model: nn.Module, config: AdapterConfig) -> None:
        self._pending: dict[str, SharedLora] = {}  # owner name -> factors, while layers are created
        super().__init__(model, config)
        del self._pending  # the layers hold the factors; parameters() deduplicates them

    def owner(self, name: str) -> str:
        """The module path of the first layer of ``name``'s interval (whose keys the native checkpoint uses)."""
        template, _ = self.config.split_name(name)
        return template.format(self.config.interval_of(name)[0])

    def create_layer(self, base: nn.Module, name: str) -> E2LoraLinear:
        rank = self.config.interval_of(name)[2]
        key = self.owner(name)
        d_in, d_out = linear_dims(base)
        if key not in self._pending:
            self._pending[key] = SharedLora(d_in, d_out, rank, base.weight)
        shared = self._pending[key]
        if (shared.lora_A.in_features, shared.lora_B.out_features) != (d_in, d_out):
            raise ValueError(f"E2LoraConfig.share_intervals: {name!r} is ({d_out}, {d_in}); "
                             f"expected the shape of its interval's first layer {key!r}")
        return E2LoraLinear(base, shared, self.config.lora_alpha / rank, self.config.lora_dropout)

    def adapter_state_dict(self) -> dict[str, torch.Tensor]:
        """The native checkpoint: each interval's factors once, keyed by its first layer; plus saved modules."""
        full = super().adapter_state_dict()
        owners = {f"{PEFT_PREFIX}{self.owner(n)}." for n in self.adapter_layers()}
        saved = tuple(f"{PEFT_PREFIX}{n}." for n in self.saved_modules)
        return {k: v for k, v in full.items() if k.startswith(saved) or any(k.startswith(o) for o in owners)}

    def lora_config(self) -> LoraConfig:
        """The plain-LoRA config of the export: same targets, ``rank_pattern`` for every r_k != r, same alpha."""
        c = self.config
        ranks = {n: layer.r for n, layer in self.adapter_layers().items() if layer.r != c.r}
        return LoraConfig(target_modules=c.target_modules, exclude_modules=c.exclude_modules,
                          modules_to_save=c.modules_to_save, r=c.r, rank_pattern=ranks, lora_alpha=c.lora_alpha,
                          lora_dropout=c.lora_dropout, task_type=c.task_type,
                          base_model_name_or_path=c.base_model_name_or_path)

    @torch.no_grad()
    def lora_state_dict(self) -> dict[str, torch.Tensor]:
        """Un-shared PEFT LoRA tensors: every layer gets its own copy of its interval's (A_k, B_k)."""
        out = {}
        for name, layer in self.adapter_layers().items():
            out[f"{PEFT_PREFIX}{name}.lora_A.weight"] = layer.lora_A.weight.detach().clone()  # (r_k, in)
            out[f"{PEFT_PREFIX}{name}.lora_B.weight"] = layer.lora_B.weight.detach().clone()  # (out, r_k)
        for name, module in self.saved_modules.items():
            out.update({f"{PEFT_PREFIX}{name}.{k}": v.detach().clone() for k, v in module.state_dict().items()})
        return out

    def save_as_lora(self, out_dir: str | Path) -> Path:
        """Write the un-shared export as an ordinary PEFT-layout LoRA checkpoint (atomic folder swap)."""
        return write_adapter(out_dir, self.lora_config().to_peft_dict(), self.lora_state_dict(),
                             type(self.model).__name__)
