"""``LoraMixerConfig``: LoRA-Mixer's fields (experts, routing regime, RSL coefficients, plug-and-play bookkeeping).

Li et al., "LoRA-Mixer: Coordinate Modular LoRA Experts Through Serial Attention Routing", ICLR 2026
(arXiv 2507.00029). Spec: shared/specs/adapters.md §3. The official repo held only a README when this was written,
so every constant the paper does not report is veil's choice and says so in its help text.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from veil.config import ConfigError, field

from ..config import AdapterConfig

# The attention input/output projections of LLaMA/Mistral-style decoders (spec §3.1: q/k/v and o).
ATTENTION_PROJECTIONS = ["q_proj", "k_proj", "v_proj", "o_proj"]


@dataclass
class LoraMixerConfig(AdapterConfig):
    """LoRA-Mixer: E LoRA experts inside each attention projection, mixed per token by a router (spec §3.1).

    ``y = W x + Σ_e w_e(x) · s_e · B_e A_e dropout(x)``, ``s_e = alpha_e / r_e``, w(x) from ``routing``.

    Args (besides :class:`AdapterConfig`'s; ``target_modules`` defaults to LLaMA's q/k/v/o projections):
        lora_alpha (float): scaling numerator of every expert (``s = lora_alpha / r``) unless ``expert_alpha`` is set.
        lora_dropout (float): dropout on the experts' shared input (training only).
        num_experts (int): E.
        routing (str): ``"hard"`` (stage 1: every token of sample b goes to its domain expert d_b, set with
            ``set_domains``), ``"soft"`` (stage 2: softmax over all experts), ``"topk"`` (inference: sparse top-K,
            the softmax renormalised over the K chosen logits — the renormalisation is veil's reading, spec §3.2).
        top_k (int): K of ``"topk"``; also the dispatch that f̄ of the RSL counts in ``"soft"`` mode.
        fixed_expert (int | None): route every token to this expert (a per-request fixed adapter; mergeable).
        rsl_alpha (float): α of the load term α·Σ_i p̄_i f̄_i (not reported by the paper; veil's default).
        rsl_lambda (float): λ >= 0 of the entropy term (not reported by the paper; spec §3.3).
        rsl_entropy (str): the entropy term's sign (spec §3.4): ``"as_printed"`` is Eq. 5, ``−λ·E[H(p(x))]``
            (flattens per-token routing); ``"specialise"`` is ``+λ·E[H(p(x))]`` (peaky, input-specialised routing).
        preserve_beta (float): β of ``L_preserve = β Σ_{i∈C} ‖θ_i − θ_i^(0)‖²`` in the soft stage (spec §3.2).
        preserve_experts (list[int]): C, the sensitive experts whose parameters ``L_preserve`` anchors.
        train_experts (bool): False freezes the experts so only the router trains (plug-and-play, spec §3.2 (ii)).
        expert_r (list[int]): per-expert ranks (plug-and-play adapters may differ); empty = ``r`` for all.
        expert_alpha (list[float]): per-expert alphas; empty = ``lora_alpha`` for all.

    Example:
        >>> cfg = LoraMixerConfig(r=8, num_experts=6, routing="hard", target_modules=["q_proj", "v_proj"])
    """

    method: ClassVar[str] = "loramixer"
    peft_type: ClassVar[str] = "LORAMIXER"

    target_modules: list[str] | str | None = field(None, "projection names or a regex; None = q/k/v/o_proj")
    lora_alpha: float = field(16.0, "scaling numerator of each expert: s = lora_alpha / r")
    lora_dropout: float = field(0.0, "dropout probability on the experts' input")
    num_experts: int = field(6, "E, the number of LoRA experts per projection (paper: ~6)")
    routing: Literal["hard", "soft", "topk"] = field("soft", "hard (domain ids), soft (all experts) or topk (sparse)")
    top_k: int = field(2, "K of topk routing; the dispatch f-bar counts in soft mode")
    fixed_expert: int | None = field(None, "route every token to this expert (mergeable); None = use routing")
    rsl_alpha: float = field(0.01, "alpha of the RSL load term sum_i p_i f_i (not reported; veil's choice)")
    rsl_lambda: float = field(0.0, "lambda >= 0 of the RSL entropy term (not reported by the paper)")
    rsl_entropy: Literal["as_printed", "specialise"] = field(
        "as_printed", "sign of the entropy term: as_printed = -lambda*E[H] (Eq. 5), specialise = +lambda*E[H]")
    preserve_beta: float = field(0.0, "beta of the parameter-preservation penalty on preserve_experts")
    preserve_experts: list[int] = field([], "indices of the sensitive experts L_preserve anchors")
    train_experts: bool = field(True, "False: experts frozen, only the router trains (plug-and-play)")
    expert_r: list[int] = field([], "per-expert ranks; empty = r for every expert")
    expert_alpha: list[float] = field([], "per-expert alphas; empty = lora_alpha for every expert")

    def validate(self) -> None:
        if self.target_modules is None:
            self.target_modules = list(ATTENTION_PROJECTIONS)
        super().validate()
        e = self.num_experts
        if e < 1:
            raise ConfigError(f"LoraMixerConfig.num_experts: expected >= 1, received {e}")
        if not 1 <= self.top_k <= e:
            raise ConfigError(f"LoraMixerConfig.top_k: expected 1 <= top_k <= num_experts={e}, received {self.top_k}")
        if self.fixed_expert is not None and not 0 <= self.fixed_expert < e:
            raise ConfigError(f"LoraMixerConfig.fixed_expert: expected None or 0..{e - 1}, received {self.fixed_expert}")
        if not 0.0 <= self.lora_dropout < 1.0:
            raise ConfigError(f"LoraMixerConfig.lora_dropout: expected 0 <= p < 1, received {self.lora_dropout}")
        for name in ("rsl_alpha", "rsl_lambda", "preserve_beta"):
            if getattr(self, name) < 0:
                raise ConfigError(f"LoraMixerConfig.{name}: expected >= 0 (the sign is rsl_entropy's), "
                                  f"received {getattr(self, name)}")
        bad = [i for i in self.preserve_experts if not 0 <= i < e]
        if bad:
            raise ConfigError(f"LoraMixerConfig.preserve_experts: expected indices in 0..{e - 1}, received {bad}")
        for name in ("expert_r", "expert_alpha"):
            if getattr(self, name) and len(getattr(self, name)) != e:
                raise ConfigError(f"LoraMixerConfig.{name}: expected [] or {e} entries (num_experts), "
                                  f"received {len(getattr(self, name))}")
        if any(r < 1 for r in self.expert_r):
            raise ConfigError(f"LoraMixerConfig.expert_r: expected ranks >= 1, received {self.expert_r}")
        if self.expert_r and self.rank_pattern:
            raise ConfigError(f"LoraMixerConfig.rank_pattern: expected {{}} when expert_r is set, received {self.rank_pattern}")

    def expert_shapes(self, module_name: str) -> list[tuple[int, float]]:
        """(rank, scaling) of each expert at ``module_name``: ``expert_r``/``expert_alpha`` or the shared r/alpha."""
        from ..config import pattern_key

        ranks = self.expert_r or [self.rank_for(module_name)] * self.num_experts
        key = pattern_key(self.alpha_pattern, module_name)
        shared_alpha = self.alpha_pattern[key] if key is not None else self.lora_alpha
        alphas = self.expert_alpha or [shared_alpha] * self.num_experts
        return [(r, a / r) for r, a in zip(ranks, alphas, strict=True)]

    def to_peft_dict(self) -> dict[str, Any]:
        """``adapter_config.json``: PEFT has no LoRA-Mixer, so this is veil's own ``peft_type`` plus every field."""
        return dict(sorted({"peft_type": self.peft_type, **self.to_dict()}.items()))

    @classmethod
    def from_peft_dict(cls, data: dict[str, Any]) -> LoraMixerConfig:
        return cls.from_dict({k: v for k, v in data.items() if k not in ("peft_type", "peft_version")})
