"""Routed-expert containers of transformers MoE models, and veil's ragged one that pruning slices into.

transformers v5 stores a layer's routed experts fused: ``gate_up_proj`` (E, 2F, D) and ``down_proj`` (E, D, F)
(``is_transposed``: (E, D, 2F) and (E, F, D)), called as ``experts(hidden (N, D), top_k_index (N, K),
top_k_weights (N, K)) -> (N, D)`` by Qwen2-MoE, Mixtral and their relatives. Older checkpoints and custom models
keep one module per expert (``gate_proj``/``up_proj``/``down_proj`` or Mixtral-v4 ``w1``/``w3``/``w2``). A single
3-D tensor cannot hold experts of different widths (spec §2.8), so both layouts are converted to
:class:`RaggedExperts`: one (F_i, D)/(F_i, D)/(D, F_i) triple per expert, same call, same arithmetic. Its widths
(and the layer's expert count, which expert-level pruning changes) are what a saved pruned model records.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import nn

UNFUSED_NAMES = (("gate_proj", "up_proj", "down_proj"), ("w1", "w3", "w2"))  # (gate, up, down) per expert


class RaggedExperts(nn.Module):
    """Routed SwiGLU experts with per-expert intermediate widths (atomic experts removable one by one).

    Expert i computes ``E_i(x) = W_down_i [act(W_gate_i x) * (W_up_i x)]`` with W_gate_i, W_up_i (F_i, D) and
    W_down_i (D, F_i); F_i may be 0 (the expert then outputs zeros). The forward has the signature of
    transformers' fused experts, so it drops into ``block.experts`` unchanged.
    """

    def __init__(self, widths: list[int], hidden_dim: int, act_fn: nn.Module) -> None:
        super().__init__()
        self.hidden_dim = hidden_dim
        self.act_fn = act_fn
        self.gate_proj = nn.ParameterList([nn.Parameter(torch.zeros(w, hidden_dim)) for w in widths])
        self.up_proj = nn.ParameterList([nn.Parameter(torch.zeros(w, hidden_dim)) for w in widths])
        self.down_proj = nn.ParameterList([nn.Parameter(torch.zeros(hidden_dim, w)) for w in widths])

    @property
    def num_experts(self) -> int:
        return len(self.gate_proj)

    @property
    def widths(self) -> list[int]:
        """Intermediate width F_i of every expert."""
        return [int(w.shape[0]) for w in self.gate_proj]

    def activations(self, x: torch.Tensor, i: int) -> torch.Tensor:
        """Atomic-expert activations a (n, F_i) of expert i on tokens x (n, D): E_i(x) = a @ W_down_iᵀ."""
        gate = nn.functional.linear(x, self.gate_proj[i])  # (n, F_i)
        return self.act_fn(gate) * nn.functional.linear(x, self.up_proj[i])

    def expert_output(self, x: torch.Tensor, i: int) -> torch.Tensor:
        """Ungated output E_i(x) (n, D) of expert i."""
        return nn.functional.linear(self.activations(x, i), self.down_proj[i])

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                top_k_weights: torch.Tensor) -> torch.Tensor:
        """Σ_k g_k(x) E_{idx_k}(x) (N, D) for hidden (N, D), top-k indices and gate weights (N, K)."""
        out = torch.zeros_like(hidden_states)
        for i in top_k_index.unique().tolist():
            token, slot = torch.where(top_k_index == i)  # (n,), (n,)
            y = self.expert_output(hidden_states[token], i) * top_k_weights[token, slot, None]  # (n, D)
            out.index_add_(0, token, y.to(out.dtype))
        return out

    def keep_neurons(self, keep: list[torch.Tensor]) -> None:
        """Slice every expert to its kept atomic experts (sorted index tensors, one per expert): real removal."""
        if len(keep) != self.num_experts:
            raise ValueError(f"keep: expected {self.num_experts} index tensors (one per expert), received {len(keep)}")
        for i, idx in enumerate(keep):
            idx = idx.sort().values
            self.gate_proj[i] = nn.Parameter(self.gate_proj[i].data[idx].clone())
            self.up_proj[i] = nn.Parameter(self.up_proj[i].data[idx].clone())
            self.down_proj[i] = nn.Parameter(self.down_proj[i].data[:, idx].clone())

    def keep_experts(self, kept: list[int]) -> None:
        """Keep only the experts ``kept`` (in that order; the router must be sliced the same way)."""
        for name in ("gate_proj", "up_proj", "down_proj"):
            old = getattr(self, name)
            setattr(self, name, nn.ParameterList([old[i] for i in kept]))


def expert_triples(experts: nn.Module) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """(W_gate (F, D), W_up (F, D), W_down (D, F)) of every expert, from a fused, unfused or ragged container.

    Raises:
        ValueError: the container is not a bias-free gated (SwiGLU-style) expert set veil knows.
    """
    if isinstance(experts, RaggedExperts):
        return [(g.data, u.data, d.data) for g, u, d in zip(experts.gate_proj, experts.up_proj, experts.down_proj, strict=True)]
    gate_up, down = getattr(experts, "gate_up_proj", None), getattr(experts, "down_proj", None)
    if isinstance(gate_up, torch.Tensor) and isinstance(down, torch.Tensor) and gate_up.dim() == 3:
        if getattr(experts, "has_bias", False) or hasattr(experts, "gate_up_proj_bias"):
            raise ValueError(f"{type(experts).__name__}: expected bias-free experts, received expert biases")
        if getattr(experts, "is_transposed", False):  # (E, D, 2F) and (E, F, D)
            gate_up, down = gate_up.transpose(1, 2), down.transpose(1, 2)
        f = gate_up.shape[1] // 2
        return [(gate_up[i, :f].data, gate_up[i, f:].data, down[i].data) for i in range(gate_up.shape[0])]
    if isinstance(experts, (nn.ModuleList, list, tuple)) or hasattr(experts, "__iter__"):
        triples = []
        for expert in experts:
            names = next((n for n in UNFUSED_NAMES if all(hasattr(expert, a) for a in n)), None)
            if names is None:
                raise ValueError(f"expert {type(expert).__name__}: expected gate_proj/up_proj/down_proj or w1/w3/w2")
            layers = [getattr(expert, a) for a in names]
            if any(getattr(layer, "bias", None) is not None for layer in layers):
                raise ValueError(f"expert {type(expert).__name__}: expected bias-free linear layers")
            triples.append(tuple(layer.weight.data for layer in layers))
        return triples
    raise ValueError(f"experts: expected a fused (gate_up_proj, down_proj), per-expert or RaggedExperts container, "
                     f"received {type(experts).__name__}")


def _act_fn(experts: nn.Module) -> nn.Module:
    if hasattr(experts, "act_fn"):
        return experts.act_fn
    first = next(iter(experts))
    for name in ("act_fn", "act"):
        if hasattr(first, name):
            return getattr(first, name)
    raise ValueError(f"experts {type(experts).__name__}: expected an act_fn attribute")


def to_ragged(experts: nn.Module) -> RaggedExperts:
    """The same experts as a :class:`RaggedExperts` (exact copy of the weights, same device and dtype)."""
    if isinstance(experts, RaggedExperts):
        return experts
    triples = expert_triples(experts)
    hidden = triples[0][0].shape[1]
    ragged = RaggedExperts([g.shape[0] for g, _, _ in triples], hidden, _act_fn(experts))
    with torch.no_grad():
        for i, (g, u, d) in enumerate(triples):
            ragged.gate_proj[i] = nn.Parameter(g.clone())
            ragged.up_proj[i] = nn.Parameter(u.clone())
            ragged.down_proj[i] = nn.Parameter(d.clone())
    return ragged


def moe_blocks(model: nn.Module) -> Iterator[tuple[str, nn.Module]]:
    """(name, block) of every sparse MoE block: a module with a routed ``experts`` container and a ``gate`` router
    whose weight is (E, D). Shared experts, attention and dense MLPs are never yielded (spec §2.5)."""
    for name, module in model.named_modules():
        experts, gate = getattr(module, "experts", None), getattr(module, "gate", None)
        weight = getattr(gate, "weight", None)
        if isinstance(experts, nn.Module) and isinstance(weight, torch.Tensor) and weight.dim() == 2:
            yield name, module


def convert_to_ragged(model: nn.Module) -> list[str]:
    """Replace every MoE block's experts by a :class:`RaggedExperts` in place; returns the block names.

    Raises:
        ValueError: the model has no MoE block veil recognises.
    """
    names = []
    for name, block in list(moe_blocks(model)):
        block.experts = to_ragged(block.experts)
        names.append(name)
    if not names:
        raise ValueError(f"{type(model).__name__}: expected MoE blocks (modules with .experts and a .gate router), "
                         "found none")
    return names


def set_expert_count(block: nn.Module, kept: list[int]) -> None:
    """Drop whole experts of ``block``: keep experts ``kept`` and slice the router's rows to match, so the router
    only ever selects kept experts (equivalent to a -inf logit for every dropped expert)."""
    experts, gate = block.experts, block.gate
    top_k = getattr(gate, "top_k", 1)
    if len(kept) < top_k:
        raise ValueError(f"kept experts: expected at least top_k={top_k}, received {len(kept)}")
    if not isinstance(experts, RaggedExperts):
        raise ValueError(f"{type(experts).__name__}: convert the model with convert_to_ragged first")
    experts.keep_experts(kept)
    gate.weight = nn.Parameter(gate.weight.data[kept].clone())
    if getattr(gate, "bias", None) is not None:
        gate.bias = nn.Parameter(gate.bias.data[kept].clone())
    for obj in (gate, block):
        for attr in ("num_experts", "num_local_experts"):
            if hasattr(obj, attr):
                setattr(obj, attr, len(kept))


def layout(model: nn.Module) -> dict[str, dict[str, list[int] | int]]:
    """Per MoE block: expert count and per-expert widths (what a pruned checkpoint must record)."""
    out: dict[str, dict[str, list[int] | int]] = {}
    for name, block in moe_blocks(model):
        widths = [g.shape[0] for g, _, _ in expert_triples(block.experts)]
        out[name] = {"experts": len(widths), "widths": widths}
    return out


def routed_expert_params(model: nn.Module) -> int:
    """Parameters held by routed experts (3 D F_i each); router, shared experts and the rest are not counted."""
    return sum(sum(g.numel() + u.numel() + d.numel() for g, u, d in expert_triples(block.experts))
               for _, block in moe_blocks(model))
