"""``PsoftModel``: injects :class:`PsoftLinear`; checkpoints PEFT loads as the same function; exact LoRA export.

A PSOFT checkpoint stores only the rotation (Q, α, β); the bases A, B are re-derived from the base weight at
load. veil's bases have canonical signs, PEFT's the signs its SVD returns, so the same Q means different
functions in the two (issue 19: 138 of 288 pairs differed, logits off by 5.8). The checkpoint is therefore
written in **PEFT's** convention: Q conjugated by D = diag(d), d_k = sign of PEFT's v_k against veil's, computed
by PEFT's own SVD call on the saving machine, plus D itself (``<module>.psoft_R.veil_signs``, int8; PEFT ignores
the key). Loading a veil checkpoint uses the stored D, so it is exact on any machine; loading a PEFT checkpoint
(no D) re-derives D with PEFT's SVD on the device holding the base weights, as PEFT itself does there.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
from torch import nn

from ..checkpoint import write_adapter
from ..layer import linear_weight
from ..lora import LoraConfig
from ..model import PEFT_PREFIX, AdapterModel
from .config import PsoftConfig
from .layer import SIGN_AGREEMENT, PsoftLinear, conjugate, peft_signs

SIGNS = "psoft_R.veil_signs"  # per module: D of the saved Q (int8 ±1, r values)


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

    def _signs(self, name: str, layer: PsoftLinear, loading: bool) -> torch.Tensor:
        """D of PEFT's bases against veil's for one layer (see the module docstring)."""
        signs, agreement = peft_signs(linear_weight(layer.base_layer), layer.psoft_A)
        if agreement >= SIGN_AGREEMENT:
            return signs
        advice = ("load it in PEFT and convert it to a LoRA there" if loading else
                  "PEFT will not reproduce this layer from the checkpoint; for PEFT and serving use "
                  "PsoftModel.save_as_lora (exact and basis-free)")
        message = (f"PSOFT module {name!r}: PEFT's singular vectors of the base weight are not a sign flip of "
                   f"veil's (|cos| {agreement:.3f} < {SIGN_AGREEMENT}; repeated singular values), so no sign "
                   f"convention relates the two bases; {advice}")
        if loading:
            raise ValueError(message)
        warnings.warn(message, UserWarning, stacklevel=3)
        return torch.ones_like(signs)

    @torch.no_grad()
    def adapter_state_dict(self) -> dict[str, torch.Tensor]:
        """The checkpoint tensors in PEFT's convention (Q conjugated by D) plus D per module (``veil_signs``)."""
        out = super().adapter_state_dict()
        for name, layer in self.adapter_layers().items():
            signs = self._signs(name, layer, loading=False)
            key = f"{PEFT_PREFIX}{name}.psoft_R.weight"
            out[key] = conjugate(out[key], signs, layer.psoft_R.rows, layer.psoft_R.cols)
            out[f"{PEFT_PREFIX}{name}.{SIGNS}"] = signs.to(torch.int8)
        return out

    @torch.no_grad()
    def load_adapter_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Load a veil- or PEFT-written PSOFT checkpoint: Q back to veil's bases with the stored (or re-derived) D.

        Raises:
            ValueError: missing, unexpected or mis-shaped tensors; a sign tensor that is not ±1 of length r; a
                PEFT checkpoint whose bases no sign vector relates to veil's.
        """
        state = dict(state)
        own = super().adapter_state_dict()  # the live parameters
        for name, layer in self.adapter_layers().items():
            stored = state.pop(f"{PEFT_PREFIX}{name}.{SIGNS}", None)
            if stored is None:
                signs = self._signs(name, layer, loading=True)
            elif stored.shape != (layer.r,) or not bool((stored.abs() == 1).all()):
                raise ValueError(f"adapter weights: {PEFT_PREFIX}{name}.{SIGNS}: expected {layer.r} values of ±1, "
                                 f"received shape {tuple(stored.shape)}")
            else:
                signs = stored.to(torch.float64)
            key = f"{PEFT_PREFIX}{name}.psoft_R.weight"
            if key in state and state[key].shape == own[key].shape:
                state[key] = conjugate(state[key].to(own[key].dtype), signs, layer.psoft_R.rows, layer.psoft_R.cols)
        missing, unexpected = sorted(set(own) - set(state)), sorted(set(state) - set(own))
        if missing or unexpected:
            raise ValueError(f"adapter weights: expected the keys of this config, missing {missing[:5]}, "
                             f"unexpected {unexpected[:5]}")
        for key, value in state.items():
            if own[key].shape != value.shape:
                raise ValueError(f"adapter weights: {key}: expected shape {tuple(own[key].shape)}, "
                                 f"received {tuple(value.shape)}")
            own[key].copy_(value)

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
        return write_adapter(out_dir, self.lora_config().to_peft_dict(), self.lora_state_dict(),
                             type(self.model).__name__)
