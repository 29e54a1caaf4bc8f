"""LoRA-Mixer's layer: E LoRA experts serially inside one attention projection, mixed per token by a router.

Li et al., "LoRA-Mixer: Coordinate Modular LoRA Experts Through Serial Attention Routing", ICLR 2026
(arXiv 2507.00029), spec §3.1–3.3. Also holds the Routing Specialization Loss (RSL) as plain functions.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..layer import AdapterLayer
from .config import LoraMixerConfig


class LoraExpert(nn.Module):
    """One LoRA expert ``s · B A x`` with PEFT's parameter names (``lora_A.weight`` (r, in), ``lora_B.weight`` (out, r)).

    Args:
        d_in: input features.
        d_out: output features.
        r: rank.
        scaling: ``alpha / r``.
    """

    def __init__(self, d_in: int, d_out: int, r: int, scaling: float, **kw: object) -> None:
        super().__init__()
        self.r, self.scaling = r, scaling
        self.lora_A = nn.Linear(d_in, r, bias=False, **kw)  # type: ignore[arg-type]
        self.lora_B = nn.Linear(r, d_out, bias=False, **kw)  # type: ignore[arg-type]
        if not self.lora_A.weight.is_meta:
            nn.init.kaiming_uniform_(self.lora_A.weight, a=math.sqrt(5))  # PEFT's default init
            nn.init.zeros_(self.lora_B.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lora_B(self.lora_A(x)) * self.scaling  # (N, in) -> (N, r) -> (N, out)

    def delta_weight(self) -> torch.Tensor:
        return (self.lora_B.weight @ self.lora_A.weight) * self.scaling  # (out, r) @ (r, in) -> (out, in)


class LoraMixerLinear(AdapterLayer):
    """``W x + Σ_e w_e(x) · s_e B_e A_e dropout(x)`` with token-level routing w(x) (Li et al., ICLR 2026, spec §3.1).

    The router is ``Linear(in, E, bias=False)``, zero-initialised so routing starts uniform (the init is not
    reported; veil's choice). In ``topk`` mode an expert only sees the tokens routed to it.

    Args:
        base_layer: the frozen projection, weight (out, in).
        config: the LoRA-Mixer config (experts, routing, RSL).
        shapes: (rank, scaling) of each expert (``LoraMixerConfig.expert_shapes``).
    """

    def __init__(self, base_layer: nn.Linear, config: LoraMixerConfig, shapes: list[tuple[int, float]]) -> None:
        super().__init__(base_layer)
        kw = {"device": base_layer.weight.device, "dtype": base_layer.weight.dtype}
        self.config, self.routing_mode = config, config.routing
        self.lora_dropout = nn.Dropout(config.lora_dropout) if config.lora_dropout > 0 else nn.Identity()
        self.experts = nn.ModuleList(LoraExpert(self.in_features, self.out_features, r, s, **kw) for r, s in shapes)
        self.experts.requires_grad_(config.train_experts)
        self.lora_router = nn.Linear(self.in_features, len(shapes), bias=False, **kw)  # weight (E, in)
        if not self.lora_router.weight.is_meta:
            nn.init.zeros_(self.lora_router.weight)
        self.domain_ids: torch.Tensor | None = None  # (B,) expert per sample, for hard routing
        self.last_probs: torch.Tensor | None = None  # (N, E) router softmax of the last training batch
        self.last_dispatch: torch.Tensor | None = None  # (N, E) bool, the top-K dispatch of that batch

    @property
    def num_experts(self) -> int:
        return len(self.experts)

    def _one_hot(self, index: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return F.one_hot(index, self.num_experts).to(x.dtype)

    def routing(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(weights, evaluated): fusion weights (..., E) and the bool mask (..., E) of experts each token runs.

        Raises:
            ValueError: ``routing="hard"`` without domain ids, or ids whose count is not the batch size.
        """
        lead = x.shape[:-1]
        if self.config.fixed_expert is not None:
            w = self._one_hot(torch.full(lead, self.config.fixed_expert, device=x.device), x)  # (..., E)
            return w, w.bool()
        if self.routing_mode == "hard":
            ids = self.domain_ids
            if ids is None or ids.shape[0] != x.shape[0]:
                raise ValueError(f"LoraMixerLinear: routing='hard' expects domain ids for {x.shape[0]} samples "
                                 f"(call model.set_domains(ids)), received {None if ids is None else tuple(ids.shape)}")
            ids = ids.to(x.device).view(-1, *([1] * (len(lead) - 1))).expand(lead)  # (B,) -> (...)
            w = self._one_hot(ids, x)
            return w, w.bool()
        logits = self.lora_router(x)  # (..., E)
        probs = logits.softmax(dim=-1)
        top_v, top_i = logits.topk(self.config.top_k, dim=-1)  # (..., K)
        dispatch = torch.zeros_like(probs, dtype=torch.bool).scatter(-1, top_i, True)
        if self.training:
            self.last_probs = probs.reshape(-1, self.num_experts)
            self.last_dispatch = dispatch.reshape(-1, self.num_experts)
        if self.routing_mode == "soft":
            return probs, torch.ones_like(dispatch)
        return torch.zeros_like(probs).scatter(-1, top_i, top_v.softmax(dim=-1)), dispatch  # renormalised top-K

    def delta_forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, evaluated = self.routing(x)  # (..., E) each
        h = self.lora_dropout(x).reshape(-1, self.in_features)  # (N, in)
        w, m = weights.reshape(-1, self.num_experts), evaluated.reshape(-1, self.num_experts)  # (N, E)
        if torch.compiler.is_exporting():  # a graph has no data-dependent gather: run every expert, weight by w
            out = sum(w[:, e : e + 1] * expert(h) for e, expert in enumerate(self.experts))  # (N, out)
            return out.reshape(*x.shape[:-1], self.out_features)
        out = h.new_zeros(h.shape[0], self.out_features)  # (N, out)
        for e, expert in enumerate(self.experts):
            rows = m[:, e].nonzero().squeeze(-1)  # tokens routed to expert e
            if rows.numel():  # rows are distinct: a plain index_put (index_add takes ~80 ms a call on torch 2.13 CPU)
                out = out.index_put((rows,), out[rows] + w[rows, e : e + 1] * expert(h[rows]))
        return out.reshape(*x.shape[:-1], self.out_features)

    def delta_weight(self) -> torch.Tensor:
        if self.config.fixed_expert is None:
            raise NotImplementedError(
                "LoRA-Mixer cannot be merged: its routing w(x) depends on the input, so no single W + ΔW reproduces "
                "it (spec §0); set fixed_expert to merge one expert")
        return self.experts[self.config.fixed_expert].delta_weight()

    def aux_loss(self) -> torch.Tensor:
        """This layer's RSL over its last training batch (zero before one, and for hard or fixed routing)."""
        if self.last_probs is None or self.last_dispatch is None or self.routing_mode == "hard":
            return self.lora_router.weight.new_zeros(())
        c = self.config
        sign = -1.0 if c.rsl_entropy == "as_printed" else 1.0
        return rsl(self.last_probs, self.last_dispatch, c.rsl_alpha, sign * c.rsl_lambda)

    def extra_repr(self) -> str:
        ranks = [e.r for e in self.experts]
        return f"experts={self.num_experts}, ranks={ranks}, routing={self.routing_mode}, top_k={self.config.top_k}"


def routing_entropy(probs: torch.Tensor) -> torch.Tensor:
    """H(p) = −Σ_i p_i log p_i per token, (..., E) -> (...); ∂H/∂p_i = −log p_i − 1 (spec §3.3)."""
    return -(probs * probs.clamp_min(1e-12).log()).sum(dim=-1)


def rsl(probs: torch.Tensor, dispatch: torch.Tensor, alpha: float, signed_lambda: float) -> torch.Tensor:
    """Routing Specialization Loss ``α · Σ_i p̄_i f̄_i + signed_λ · E_x[H(p(x))]`` (spec §3.3, Eq. 5).

    Eq. 5 as printed is ``signed_λ = −λ``; ``+λ`` is the specialising reading of spec §3.4.

    Args:
        probs: (N, E) router softmax per token; p̄ is its mean over tokens.
        dispatch: (N, E) bool, the experts each token is dispatched to; f̄_i is i's share of all dispatches.
        alpha: weight of the load term.
        signed_lambda: weight of the mean per-token entropy, with its sign.
    """
    p_bar = probs.mean(dim=0)  # (E,)
    counts = dispatch.to(probs.dtype).sum(dim=0)  # (E,)
    f_bar = counts / counts.sum()  # (E,), sums to 1
    return alpha * (p_bar * f_bar).sum() + signed_lambda * routing_entropy(probs).mean()


__all__ = ["LoraExpert", "LoraMixerLinear", "routing_entropy", "rsl"]
