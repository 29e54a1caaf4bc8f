"""``MtLoraConfig``: mtLoRA's fields (official-code names where they exist), defaults from the reproduction scripts.

Tian, Ledent, Sun, "Scalable Multi-Task Low-Rank Model Adaptation", ICLR 2026 (arXiv 2603.01526); official code
``doem97/ICLR26_mtLoRA`` @ 61dea0d. Spec: shared/specs/adapters.md §1.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from veil.config import ConfigError, field

from ..config import AdapterConfig

# block_adapter_type -> sub-layer module names (LLaMA-style decoders: ``layers.{i}.mlp``, ``layers.{i}.self_attn``).
BLOCK_TARGETS: dict[str, list[str]] = {"ffn": ["mlp"], "attention": ["self_attn"], "both": ["mlp", "self_attn"]}


@dataclass
class MtLoraConfig(AdapterConfig):
    """mtLoRA: a HydraLoRA (shared A, N expert B's) block adapter beside each targeted sub-layer, with fine-grained
    (per-dimension-group) routing, a spectral-aware regulariser and a load-balance loss (spec §1).

    ``sub_layer(x̂) + Δ(x̂)``, ``Δ(x̂) = s · Σ_i Π_i(x̂) ⊙ B_i A dropout(x̂)``, ``s = lora_alpha / r``.

    Args (besides :class:`AdapterConfig`'s; ``target_modules`` names whole sub-layers, e.g. ``"mlp"``; when it is
    None, ``block_adapter_type`` picks LLaMA's names):
        lora_alpha (float): scaling numerator (s = lora_alpha / r).
        lora_dropout (float): dropout on the adapter input.
        num_experts (int): N, the number of B heads.
        routing_groups (int): g, softmax groups over output dimensions (code: routing_group_size = d / g); 1 = scalar.
        router (str): ``"linear_per_token"`` (official code: Linear(d, N·g, bias=False) per token) or
            ``"mlp_mean_pool"`` (paper text: 2-layer MLP on the sequence-mean of x̂).
        router_hidden (int): hidden width of the ``mlp_mean_pool`` router (not given by the paper; veil's choice).
        block_adapter_type (str): ``ffn`` / ``attention`` / ``both``; used only when ``target_modules`` is None.
        style (str): ``lowrank`` (the paper) or ``bottleneck`` (ReLU after A, AdaptFormer-like).
        spectral_mode (str): ``official_per_B`` (code: per-B weighted Gram vs scaled identity) or
            ``paper_cross_expert`` (paper: Σ_{i<j}‖B′_iᵀB′_j‖²_F).
        spectral_lambda (float): λ1 (Flan-v2→BBH script: 1.0; 0 = off).
        spectral_every (int): the spectral term is added on every ``spectral_every``-th optimizer step (script: 500).
        spectral_max_matrices (int): ``official_per_B`` averages over at most this many randomly sampled B's (code: 64).
        spectral_keep_sigma (bool): paper mode, B′ = U diag(wσ) Vᵀ (True) or U diag(w) Vᵀ (False) — unverified.
        balance_alpha (float): λ2 of the CV² load-balance loss (code ``blc_alpha``: 0.01; 0 = off).

    Example:
        >>> cfg = MtLoraConfig(r=16, lora_alpha=64, num_experts=16, routing_groups=2, target_modules=["mlp"])
    """

    method: ClassVar[str] = "mtlora"
    peft_type: ClassVar[str] = "MTLORA"

    target_modules: list[str] | str | None = field(None, "sub-layer module names or a regex; None = block_adapter_type")
    r: int = field(16, "rank of the shared A")
    lora_alpha: float = field(64.0, "scaling numerator: s = lora_alpha / r")
    lora_dropout: float = field(0.05, "dropout probability on the adapter input")
    num_experts: int = field(16, "number of expert up-projections B_i")
    routing_groups: int = field(2, "g: softmax groups over output dims (code routing_group_size = d / g)")
    router: Literal["linear_per_token", "mlp_mean_pool"] = field("linear_per_token", "router form: code or paper")
    router_hidden: int = field(64, "hidden width of the mlp_mean_pool router")
    block_adapter_type: Literal["ffn", "attention", "both"] = field("ffn", "sub-layers adapted when target_modules is None")
    style: Literal["lowrank", "bottleneck"] = field("lowrank", "lowrank (paper) or bottleneck (ReLU after A)")
    spectral_mode: Literal["official_per_B", "paper_cross_expert"] = field("official_per_B", "spectral regulariser form")
    spectral_lambda: float = field(1.0, "weight of the spectral term (0 = off)")
    spectral_every: int = field(500, "add the spectral term on every n-th optimizer step")
    spectral_max_matrices: int = field(64, "official_per_B: B matrices sampled per evaluation")
    spectral_keep_sigma: bool = field(True, "paper mode: B' = U diag(w*sigma) V^T (True) or U diag(w) V^T")
    balance_alpha: float = field(0.01, "weight of the CV^2 load-balance loss (0 = off)")

    def validate(self) -> None:
        if self.target_modules is None:
            self.target_modules = list(BLOCK_TARGETS[self.block_adapter_type])
        super().validate()
        for name, low in (("num_experts", 1), ("routing_groups", 1), ("router_hidden", 1), ("spectral_every", 1),
                          ("spectral_max_matrices", 1)):
            if getattr(self, name) < low:
                raise ConfigError(f"MtLoraConfig.{name}: expected >= {low}, received {getattr(self, name)}")
        if not 0.0 <= self.lora_dropout < 1.0:
            raise ConfigError(f"MtLoraConfig.lora_dropout: expected 0 <= p < 1, received {self.lora_dropout}")
        for name in ("spectral_lambda", "balance_alpha"):
            if getattr(self, name) < 0:
                raise ConfigError(f"MtLoraConfig.{name}: expected >= 0, received {getattr(self, name)}")
        if self.alpha_pattern:
            raise ConfigError(f"MtLoraConfig.alpha_pattern: expected {{}} (one lora_alpha), received {self.alpha_pattern}")

    def scaling_for(self, module_name: str) -> float:
        return self.lora_alpha / self.rank_for(module_name)

    def to_peft_dict(self) -> dict[str, Any]:
        """``adapter_config.json``: PEFT has no mtLoRA, so this is veil's own ``peft_type`` plus every field."""
        return dict(sorted({"peft_type": self.peft_type, **self.to_dict()}.items()))

    @classmethod
    def from_peft_dict(cls, data: dict[str, Any]) -> MtLoraConfig:
        return cls.from_dict({k: v for k, v in data.items() if k not in ("peft_type", "peft_version")})
