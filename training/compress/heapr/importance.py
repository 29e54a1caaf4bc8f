"""Calibration statistics: HEAPr atomic-expert scores and REAP expert saliencies.

HEAPr (spec §2.3). With a layer's routed output y(x) = Σ_i g_i(x) E_i(x) and E_i = Σ_k e_k (atomic experts
e_k(x) = a_k(x) w^down_k), removing atomic expert k of expert i changes E_i by -e_k. Second order in that output
change, with the Hessian replaced by the Fisher of the loss gradient g_{E_i}(x) = ∂ℓ/∂E_i(x) = g_i(x) ∂ℓ/∂y(x):

    pass 1 (forward + backward):  Ḡ_i = (1/|T_i|) Σ_{x∈T_i} g_{E_i}(x) g_{E_i}(x)ᵀ                    (D, D) per expert
    pass 2 (forward):             s_k = (1/|T_i|) Σ_{x∈T_i} ½ e_k(x)ᵀ Ḡ_i e_k(x)
                                      = ½ (w^down_kᵀ Ḡ_i w^down_k) · (1/|T_i|) Σ_{x∈T_i} a_k(x)²     (factorised)

The first-order term is dropped (OBS at a trained model). ℓ is the summed next-token NLL of a calibration batch.
``fisher="per_token"`` instead uses s_k = ½ mean (a_k(x) w^down_kᵀ g_{E_i}(x))² (collected in pass 1, no pass 2);
``weighting="by_frequency"`` divides by all calibration tokens instead of |T_i|. Statistics are float64 and
take E·D² numbers per layer (spec §2.4).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from .config import HEAPrConfig
from .experts import RaggedExperts, moe_blocks

Batch = dict[str, torch.Tensor]


def batch_loss(model: nn.Module, batch: Batch) -> tuple[torch.Tensor, int]:
    """Summed next-token NLL of a batch (padding excluded) and the number of predicted tokens."""
    ids = batch["input_ids"]  # (B, T)
    mask = batch.get("attention_mask")
    logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1]  # (B, T-1, V)
    nll = F.cross_entropy(logits.flatten(0, 1).float(), ids[:, 1:].flatten(), reduction="none")  # (B (T-1),)
    if mask is None:
        return nll.sum(), nll.numel()
    valid = (mask[:, 1:] * mask[:, :-1]).flatten().to(nll.dtype)
    return (nll * valid).sum(), int(valid.sum())


@dataclass
class LayerStats:
    """Running statistics of one MoE layer: Fisher sums, token counts and score sums per expert."""

    experts: RaggedExperts
    gram: list[torch.Tensor]  # E x (D, D) float64: Σ g gᵀ
    count: torch.Tensor  # (E,) float64: |T_i| (or the number of tokens when tokens="all")
    routed: torch.Tensor  # (E,) float64: tokens whose top-k picks expert i (the real routing frequency)
    score_sum: list[torch.Tensor]  # E x (F_i,) float64
    first_sum: list[torch.Tensor]  # E x (F_i,) float64: Σ_x -a_k(x) w^down_kᵀ g_{E_i}(x) (first-order term)
    saved: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = field(default_factory=list)

    @classmethod
    def empty(cls, experts: RaggedExperts) -> LayerStats:
        d, widths = experts.hidden_dim, experts.widths
        return cls(experts, [torch.zeros(d, d, dtype=torch.float64) for _ in widths],
                   torch.zeros(len(widths), dtype=torch.float64), torch.zeros(len(widths), dtype=torch.float64),
                   [torch.zeros(w, dtype=torch.float64) for w in widths],
                   [torch.zeros(w, dtype=torch.float64) for w in widths])


def _token_sets(idx: torch.Tensor, weights: torch.Tensor, probs: torch.Tensor | None,
                i: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokens (n,) that feed expert i's statistics and their gate weights (n,): the routed ones with their top-k
    weight, or (``probs`` given) every token with the router's softmax probability of expert i."""
    if probs is not None:
        return torch.arange(len(probs)), probs[:, i]
    token, slot = torch.where(idx == i)
    return token, weights[token, slot]


class _Recorder:
    """Forward hooks on every MoE block that feed :class:`LayerStats` during the calibration passes."""

    def __init__(self, model: nn.Module, config: HEAPrConfig) -> None:
        self.config = config
        self.layers: dict[str, LayerStats] = {}
        self.probs: dict[str, torch.Tensor] = {}
        self.phase = "fisher"
        self.handles = []
        for name, block in moe_blocks(model):
            if not isinstance(block.experts, RaggedExperts):
                raise ValueError(f"{name}.experts: expected RaggedExperts (call convert_to_ragged first)")
            self.layers[name] = LayerStats.empty(block.experts)
            self.handles.append(block.experts.register_forward_hook(self._experts_hook(name)))
            self.handles.append(block.gate.register_forward_hook(self._gate_hook(name)))

    def _gate_hook(self, name: str) -> Callable[..., None]:
        def hook(module: nn.Module, inputs: tuple, output: tuple) -> None:
            logits = output[0] if isinstance(output, tuple) else output  # (N, E) router logits
            self.probs[name] = torch.softmax(logits.detach().double(), dim=-1)
        return hook

    def _experts_hook(self, name: str) -> Callable[..., None]:
        def hook(module: nn.Module, inputs: tuple, output: torch.Tensor) -> None:
            hidden, idx, weights = (t.detach() for t in inputs[:3])  # (N, D), (N, K), (N, K)
            probs = self.probs[name] if self.config.tokens == "all" else None
            if self.phase == "fisher":
                self.layers[name].routed += torch.bincount(idx.flatten(), minlength=module.num_experts).double()
                output.register_hook(lambda grad: self._fisher(name, hidden, idx, weights.double(), probs, grad))
            else:
                self._activations(name, hidden, idx, weights.double(), probs)
        return hook

    @torch.no_grad()
    def _fisher(self, name: str, hidden: torch.Tensor, idx: torch.Tensor, weights: torch.Tensor,
                probs: torch.Tensor | None, grad: torch.Tensor) -> None:
        """Backward of pass 1: accumulate Σ g gᵀ (and per-token scores) with g = gate · ∂ℓ/∂y."""
        stats, grad = self.layers[name], grad.double()  # grad (N, D)
        for i in range(stats.experts.num_experts):
            token, gate = _token_sets(idx, weights, probs, i)
            if len(token) == 0:
                continue
            g = gate[:, None] * grad[token]  # (n, D) = ∂ℓ/∂E_i
            stats.gram[i] += g.T @ g
            stats.count[i] += len(token)
            if self.config.fisher == "per_token" or self.config.first_order:
                a = stats.experts.activations(hidden[token], i).double()  # (n, F_i)
                proj = g @ stats.experts.down_proj[i].double()  # (n, F_i) = w^down_kᵀ g
                stats.first_sum[i] -= (a * proj).sum(0)
                if self.config.fisher == "per_token":
                    stats.score_sum[i] += 0.5 * ((a * proj) ** 2).sum(0)

    @torch.no_grad()
    def _activations(self, name: str, hidden: torch.Tensor, idx: torch.Tensor, weights: torch.Tensor,
                     probs: torch.Tensor | None) -> None:
        """Forward of pass 2: accumulate Σ_x a_k(x)² per atomic expert."""
        stats = self.layers[name]
        for i in range(stats.experts.num_experts):
            token, _ = _token_sets(idx, weights, probs, i)
            if len(token):
                stats.score_sum[i] += (stats.experts.activations(hidden[token], i).double() ** 2).sum(0)

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


def heapr_scores(model: nn.Module, batches: Iterable[Batch],
                 config: HEAPrConfig) -> tuple[dict[str, list[torch.Tensor]], dict[str, LayerStats], int]:
    """HEAPr score of every atomic expert: {block name: [scores (F_i,) per expert]}, the layer statistics, and the
    number of calibration tokens. The model's weights are not changed; MoE blocks must hold RaggedExperts.

    Experts that no calibration token reaches get +inf (``unrouted="keep"``) or 0 (``"prune"``).
    """
    batches = list(batches)
    recorder = _Recorder(model, config)
    was_training, flags = model.training, [p.requires_grad for p in model.parameters()]
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    embed_hook = model.get_input_embeddings().register_forward_hook(lambda m, i, o: o.requires_grad_(True))
    tokens = 0
    try:
        for batch in batches:  # pass 1: forward + backward
            loss, n = batch_loss(model, batch)
            loss.backward()
            tokens += n
        embed_hook.remove()
        if config.fisher == "expert_mean":
            recorder.phase = "activations"
            with torch.no_grad():
                for batch in batches:  # pass 2: forward
                    model(input_ids=batch["input_ids"], attention_mask=batch.get("attention_mask"))
    finally:
        embed_hook.remove()
        recorder.remove()
        for p, flag in zip(model.parameters(), flags, strict=True):
            p.requires_grad_(flag)
        model.train(was_training)
    return {name: _finish(stats, config, tokens) for name, stats in recorder.layers.items()}, recorder.layers, tokens


def _finish(stats: LayerStats, config: HEAPrConfig, tokens: int) -> list[torch.Tensor]:
    """Per-expert score vectors from the accumulated sums (see the module docstring)."""
    scores = []
    for i in range(stats.experts.num_experts):
        n = float(stats.count[i])
        if n == 0:
            fill = float("inf") if config.unrouted == "keep" else 0.0
            scores.append(torch.full_like(stats.score_sum[i], fill))
            continue
        if config.fisher == "expert_mean":
            w = stats.experts.down_proj[i].detach().double()  # (D, F_i)
            curvature = ((stats.gram[i] / n) @ w * w).sum(0)  # (F_i,) w_kᵀ Ḡ_i w_k
            s = 0.5 * curvature * stats.score_sum[i]  # Σ_x ½ e_kᵀ Ḡ_i e_k
        else:
            s = stats.score_sum[i].clone()
        if config.first_order:
            s = s + stats.first_sum[i]
        scores.append(s / (n if config.weighting == "per_expert" else tokens))
    return scores


@torch.no_grad()
def expert_saliency(model: nn.Module, batches: Iterable[Batch], criterion: str) -> dict[str, torch.Tensor]:
    """Per MoE block (E,) saliency from one forward pass: REAP mean_{x∈T_j} g_j(x) ||E_j(x)||, or routed counts."""
    sums: dict[str, torch.Tensor] = {}
    counts: dict[str, torch.Tensor] = {}
    handles = []

    def make_hook(name: str) -> Callable[..., None]:
        def hook(module: RaggedExperts, inputs: tuple, output: torch.Tensor) -> None:
            hidden, idx, weights = inputs[:3]
            for i in range(module.num_experts):
                token, slot = torch.where(idx == i)
                counts[name][i] += len(token)
                if len(token):
                    norm = module.expert_output(hidden[token], i).double().norm(dim=-1)  # (n,)
                    sums[name][i] += (weights[token, slot].double() * norm).sum()
        return hook

    for name, block in moe_blocks(model):
        sums[name] = torch.zeros(block.experts.num_experts, dtype=torch.float64)
        counts[name] = torch.zeros(block.experts.num_experts, dtype=torch.float64)
        handles.append(block.experts.register_forward_hook(make_hook(name)))
    was_training = model.training
    model.eval()
    try:
        for batch in batches:
            model(input_ids=batch["input_ids"], attention_mask=batch.get("attention_mask"))
    finally:
        for handle in handles:
            handle.remove()
        model.train(was_training)
    if criterion == "frequency":
        return counts
    return {name: sums[name] / counts[name].clamp_min(1) for name in sums}
