"""``LoraConfig``: LoRA's fields (PEFT names) and the ``adapter_config.json`` PEFT writes for them."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

from veil.config import ConfigError, field

from ..config import AdapterConfig

# Fields PEFT 0.21 writes for a LoraConfig that veil does not model, at PEFT's defaults. A checkpoint whose value
# differs for one of these changes the function (DoRA, LoRA bias, ...), so loading it is refused, not ignored.
PEFT_LORA_DEFAULTS: dict[str, Any] = {
    "alora_invocation_tokens": None, "arrow_config": None, "corda_config": None, "ensure_weight_tying": False,
    "eva_config": None, "inference_mode": True, "init_lora_weights": True,
    "kasa_config": None, "layer_replication": None, "loftq_config": {}, "lora_bias": False, "lora_ga_config": None, "megatron_config": None,
    "megatron_core": "megatron.core", "monteclora_config": None, "qalora_group_size": 16, "revision": None,
    "target_parameters": None, "trainable_token_indices": None, "use_bdlora": None, "use_dora": False,
    "use_qalora": False, "velora_config": None,
}
# Fields newer PEFT versions write that veil reads but does not write: a PEFT that knows them fills in these defaults
# when they are absent, and an older one would warn about them ("saved using a higher version"), so veil writes the
# 0.21 set above. On load they are checked as the fields above are, not dropped as unknown keys.
PEFT_LORA_NEWER: dict[str, Any] = {
    "astra_config": None,  # PEFT 0.22: the sub-config of init_lora_weights="astra"
}
# Of the fields of both tables, the ones that do not change the adapted function (initialisation, bookkeeping,
# training-only).
PEFT_LORA_HARMLESS = {"inference_mode", "init_lora_weights", "revision", "megatron_core", "qalora_group_size",
                      "loftq_config", "eva_config", "corda_config", "lora_ga_config", "ensure_weight_tying",
                      "astra_config"}


def _number(x: float) -> int | float:
    return int(x) if float(x).is_integer() else x


@dataclass
class LoraConfig(AdapterConfig):
    """LoRA: ``h = W x + (lora_alpha / r) · B A dropout(x)``, A Kaiming-uniform(a=√5), B = 0.

    Args (besides :class:`AdapterConfig`'s):
        lora_alpha (float): scaling numerator; the update is scaled by ``lora_alpha / r``.
        lora_dropout (float): dropout on the input of A (training only).
        use_rslora (bool): rank-stabilised LoRA (Kalajdzievski 2023): scale by ``lora_alpha / √r`` instead.

    Example:
        >>> cfg = LoraConfig(r=8, lora_alpha=16, target_modules=["query", "value"], modules_to_save=["classifier"])
    """

    method: ClassVar[str] = "lora"
    peft_type: ClassVar[str] = "LORA"

    lora_alpha: float = field(8.0, "scaling numerator: the update is scaled by lora_alpha / r")
    lora_dropout: float = field(0.0, "dropout probability on the input of A")
    use_rslora: bool = field(False, "rank-stabilised LoRA: scale by lora_alpha / sqrt(r) instead of lora_alpha / r")

    def validate(self) -> None:
        super().validate()
        if not 0.0 <= self.lora_dropout < 1.0:
            raise ConfigError(f"LoraConfig.lora_dropout: expected 0 <= p < 1, received {self.lora_dropout}")

    def scaling_for(self, module_name: str) -> float:
        """``alpha / rank`` (rsLoRA: ``alpha / √rank``) of ``module_name`` after ``alpha_pattern`` /
        ``rank_pattern`` (PEFT's rule)."""
        from ..config import pattern_key

        key = pattern_key(self.alpha_pattern, module_name)
        alpha = self.alpha_pattern[key] if key is not None else self.lora_alpha
        rank = self.rank_for(module_name)
        return alpha / math.sqrt(rank) if self.use_rslora else alpha / rank

    def to_peft_dict(self) -> dict[str, Any]:
        target = self.target_modules if isinstance(self.target_modules, str) else sorted(self.target_modules or [])
        return dict(sorted({
            **PEFT_LORA_DEFAULTS, "peft_type": self.peft_type, "task_type": self.task_type,
            "base_model_name_or_path": self.base_model_name_or_path, "r": self.r,
            "lora_alpha": _number(self.lora_alpha), "lora_dropout": self.lora_dropout, "bias": self.bias,
            "target_modules": target, "exclude_modules": self.exclude_modules, "modules_to_save": self.modules_to_save,
            "rank_pattern": self.rank_pattern, "alpha_pattern": {k: _number(v) for k, v in self.alpha_pattern.items()},
            "use_rslora": self.use_rslora, "fan_in_fan_out": self.fan_in_fan_out,
            "layers_to_transform": self.layers_to_transform, "layers_pattern": self.layers_pattern,
        }.items()))

    @classmethod
    def from_peft_dict(cls, data: dict[str, Any]) -> LoraConfig:
        """Build from a PEFT ``adapter_config.json``; a non-default value veil cannot honour is an error. A key neither
        table lists (a PEFT newer than veil knows) is ignored with a warning, as PEFT ignores keys a newer PEFT wrote."""
        peft_fields = {**PEFT_LORA_DEFAULTS, **PEFT_LORA_NEWER}
        for key, default in peft_fields.items():
            if key not in PEFT_LORA_HARMLESS and data.get(key, default) != default:
                raise ValueError(f"adapter_config.json: {key}: veil supports {default!r}, received {data[key]!r}")
        known = {*peft_fields, "peft_type", "peft_version", "auto_mapping"}
        return cls.from_dict({k: v for k, v in data.items() if k not in known})
