"""``PsoftConfig``: PSOFT's fields (PEFT's names and defaults) and its ``adapter_config.json``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from veil.config import ConfigError, field

from ..config import AdapterConfig

# Fields of PEFT 0.21's PsoftConfig that veil fixes, at PEFT's defaults; another value is refused on load.
PEFT_PSOFT_FIXED: dict[str, Any] = {"ab_svd_init": "psoft_init", "psoft_svd": "full", "psoft_orth": True,
                                    "cayley_neumann_eps": None}
PEFT_PSOFT_IGNORED = {"psoft_svd_lowrank_niter": 10, "random_seed": 0, "init_weights": True, "revision": None,
                      "inference_mode": True}


@dataclass
class PsoftConfig(AdapterConfig):
    """PSOFT: orthogonal fine-tuning inside the top-r principal subspace of each targeted weight.

    ``W' = W + s · B (C − I) A`` with ``A = Vᵣᵀ`` (r, in), ``B = Uᵣ diag(Sᵣ / s)`` (out, r), ``s = psoft_alpha / r``,
    ``C = diag(β) R diag(α)`` and ``R = (I + Q)(I − Q)⁻¹`` (Q skew-symmetric). See ``layer.py`` and docs/adapters.md.

    Args (besides :class:`AdapterConfig`'s):
        psoft_alpha (float): scaling numerator (s = psoft_alpha / r; it cancels in ΔW, as in PEFT).
        psoft_dropout (float): dropout on the layer input of the adapter path.
        psoft_mag_a (bool): train the input-side scaling vector α.
        psoft_mag_b (bool): train the output-side scaling vector β.
        use_cayley_neumann (bool): approximate (I − Q)⁻¹ by a Neumann series instead of a solve.
        num_cayley_neumann_terms (int): number of series terms (PEFT's definition).
        orth_penalty (float): weight λ of the optional aux loss λ·‖CᵀC − I‖²_F (veil only; not saved for PEFT).

    Example:
        >>> cfg = PsoftConfig(r=16, psoft_alpha=16, target_modules=["query", "value"])
    """

    method: ClassVar[str] = "psoft"
    peft_type: ClassVar[str] = "PSOFT"

    psoft_alpha: float = field(32.0, "scaling numerator: s = psoft_alpha / r")
    psoft_dropout: float = field(0.0, "dropout probability on the adapter path's input")
    psoft_mag_a: bool = field(True, "train the input-side scaling vector alpha")
    psoft_mag_b: bool = field(True, "train the output-side scaling vector beta")
    use_cayley_neumann: bool = field(False, "Neumann-series Cayley transform instead of an exact solve")
    num_cayley_neumann_terms: int = field(5, "terms of the Neumann series")
    orth_penalty: float = field(0.0, "weight of the aux loss ||C^T C - I||_F^2 (0 = off)")

    def validate(self) -> None:
        super().validate()
        if not 0.0 <= self.psoft_dropout < 1.0:
            raise ConfigError(f"PsoftConfig.psoft_dropout: expected 0 <= p < 1, received {self.psoft_dropout}")
        if self.num_cayley_neumann_terms < 1:
            raise ConfigError(f"PsoftConfig.num_cayley_neumann_terms: expected >= 1, received "
                              f"{self.num_cayley_neumann_terms}")
        if self.alpha_pattern:
            raise ConfigError(f"PsoftConfig.alpha_pattern: expected {{}} (PSOFT has one psoft_alpha), "
                              f"received {self.alpha_pattern}")

    def scaling_for(self, module_name: str) -> float:
        return self.psoft_alpha / self.rank_for(module_name)

    def to_peft_dict(self) -> dict[str, Any]:
        target = self.target_modules if isinstance(self.target_modules, str) else sorted(self.target_modules or [])
        alpha = int(self.psoft_alpha) if float(self.psoft_alpha).is_integer() else self.psoft_alpha
        out = {**PEFT_PSOFT_FIXED, **PEFT_PSOFT_IGNORED, "peft_type": self.peft_type, "task_type": self.task_type,
               "base_model_name_or_path": self.base_model_name_or_path, "r": self.r, "psoft_alpha": alpha,
               "psoft_dropout": self.psoft_dropout, "psoft_mag_a": self.psoft_mag_a, "psoft_mag_b": self.psoft_mag_b,
               "use_cayley_neumann": self.use_cayley_neumann, "num_cayley_neumann_terms": self.num_cayley_neumann_terms,
               "target_modules": target, "exclude_modules": self.exclude_modules,
               "modules_to_save": self.modules_to_save, "layers_to_transform": self.layers_to_transform,
               "layers_pattern": self.layers_pattern, "fan_in_fan_out": self.fan_in_fan_out}
        if self.rank_pattern:  # not a PEFT PsoftConfig field; written only when used
            out["rank_pattern"] = self.rank_pattern
        return dict(sorted(out.items()))

    @classmethod
    def from_peft_dict(cls, data: dict[str, Any]) -> PsoftConfig:
        """Build from a PEFT ``adapter_config.json``; a setting veil does not implement is an error."""
        for key, default in PEFT_PSOFT_FIXED.items():
            if data.get(key, default) != default:
                raise ValueError(f"adapter_config.json: {key}: veil supports {default!r}, received {data[key]!r}")
        known = {*PEFT_PSOFT_FIXED, *PEFT_PSOFT_IGNORED, "peft_type", "peft_version", "auto_mapping"}
        return cls.from_dict({k: v for k, v in data.items() if k not in known})
