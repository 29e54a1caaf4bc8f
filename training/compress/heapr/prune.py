"""Ranking, real slicing, the two recipe stages (``heapr``, ``expert_prune``) and pruned-model save/load.

Both stages convert the model's routed experts to :class:`RaggedExperts` first (fused transformers-v5 tensors and
per-expert modules alike), so the pruned model really holds fewer parameters, still runs ``forward`` and
``generate``, and saves its per-expert widths next to its weights.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .config import ExpertPruneConfig, HEAPrConfig
from .experts import convert_to_ragged, layout, moe_blocks, routed_expert_params, set_expert_count
from .importance import expert_saliency, heapr_scores


def count_params(model: nn.Module) -> int:
    """Distinct parameters of ``model`` (tied tensors counted once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def removal_mask(scores: dict[str, list[torch.Tensor]], ratio: float, ranking: str) -> dict[str, list[torch.Tensor]]:
    """True where an atomic expert is removed: the ``round(ratio * N)`` lowest scores over all layers (``global``)
    or ``round(ratio * N_layer)`` per layer (``per_layer``). Ties break by position (stable sort)."""
    groups = [list(scores)] if ranking == "global" else [[name] for name in scores]
    masks: dict[str, list[torch.Tensor]] = {}
    for names in groups:
        flat = torch.cat([s for name in names for s in scores[name]])  # (N,)
        n_remove = round(ratio * len(flat))
        removed = torch.zeros(len(flat), dtype=torch.bool)
        removed[torch.sort(flat, stable=True).indices[:n_remove]] = True
        offset = 0
        for name in names:
            masks[name] = []
            for s in scores[name]:
                masks[name].append(removed[offset:offset + len(s)])
                offset += len(s)
    return masks


def routed_flops_per_token(model: nn.Module, frequency: dict[str, torch.Tensor]) -> float:
    """Expected multiply-adds per token in routed experts: Σ_layers Σ_i P(i routed) · 3 D F_i."""
    total = 0.0
    for name, block in moe_blocks(model):
        experts = block.experts
        widths = torch.tensor(experts.widths, dtype=torch.float64)
        total += float((frequency[name] * widths).sum()) * 3 * experts.hidden_dim
    return total


def apply_heapr(model: nn.Module, config: HEAPrConfig, calibration: Any, log: Any) -> dict[str, Any]:
    """Score atomic experts on ``calibration.batches``, remove the lowest ``config.ratio`` by slicing (in place)."""
    start = time.perf_counter()
    params_before, routed_before = count_params(model), routed_expert_params(model)
    convert_to_ragged(model)
    scores, stats, tokens = heapr_scores(model, calibration.batches, config)
    masks = removal_mask(scores, config.ratio, config.ranking)
    frequency = {name: s.routed / max(1, tokens) for name, s in stats.items()}
    flops_before = routed_flops_per_token(model, frequency)
    blocks = dict(moe_blocks(model))
    score_seconds = time.perf_counter() - start
    for name, layer_masks in masks.items():
        experts = blocks[name].experts
        before = sum(p.numel() for p in experts.parameters())
        removed_score = float(sum(s[m].sum() for s, m in zip(scores[name], layer_masks, strict=True)))
        experts.keep_neurons([(~m).nonzero().flatten() for m in layer_masks])
        log(f"{name}.experts", seconds=score_seconds / len(masks), error=removed_score, params_before=before,
            params_after=sum(p.numel() for p in experts.parameters()), widths=experts.widths)
    removed = sum(int(m.sum()) for ms in masks.values() for m in ms)
    total = sum(len(m) for ms in masks.values() for m in ms)
    return {"method": "heapr", "config": config.to_dict(), "ratio_convention": RATIO_CONVENTION,
            "atomic_experts_total": total, "atomic_experts_removed": removed, "removed_fraction": removed / total,
            "params_before": params_before, "params_after": count_params(model),
            "routed_expert_params_before": routed_before, "routed_expert_params_after": routed_expert_params(model),
            "routed_flops_per_token_before": flops_before,
            "routed_flops_per_token_after": routed_flops_per_token(model, frequency),
            "calibration_tokens": tokens, "passes": _passes(config), "layout": layout(model),
            "seconds": time.perf_counter() - start}


RATIO_CONVENTION = ("ratio = fraction of routed-expert parameters removed (HEAPr: atomic experts of routed "
                    "experts, ranked as configured; expert_prune: whole experts); shared experts, routers, "
                    "attention, embeddings and dense MLPs untouched")


def _passes(config: HEAPrConfig) -> dict[str, int]:
    return {"forward": 2 if config.fisher == "expert_mean" else 1, "backward": 1}


def expert_removals(saliency: dict[str, torch.Tensor], ratio: float, top_k: dict[str, int]) -> dict[str, list[int]]:
    """Experts to drop per layer: ``round(ratio * E_total)`` spread evenly, the remainder going to the layers whose
    next candidate has the lowest saliency relative to its layer's mean; each layer keeps >= top_k experts."""
    names = list(saliency)
    total = sum(len(s) for s in saliency.values())
    n_remove = round(ratio * total)
    order = {n: torch.sort(saliency[n], stable=True).indices.tolist() for n in names}
    count = dict.fromkeys(names, n_remove // len(names))
    extra = n_remove - sum(count.values())
    rel = {n: saliency[n] / saliency[n].mean().clamp_min(1e-30) for n in names}
    candidates = sorted((float(rel[n][order[n][count[n]]]), k, n) for k, n in enumerate(names)
                        if count[n] < len(order[n]))
    for _, _, n in candidates[:extra]:
        count[n] += 1
    for n in names:
        if len(order[n]) - count[n] < top_k[n]:
            raise ValueError(f"ExpertPruneConfig.ratio: removes {count[n]} of {len(order[n])} experts in {n}, "
                             f"expected to keep at least top_k={top_k[n]}; received ratio {ratio}")
    return {n: sorted(order[n][:count[n]]) for n in names}


def apply_expert_prune(model: nn.Module, config: ExpertPruneConfig, calibration: Any, log: Any) -> dict[str, Any]:
    """Drop whole routed experts (lowest REAP saliency or routing frequency) and their router rows, in place."""
    start = time.perf_counter()
    params_before, routed_before = count_params(model), routed_expert_params(model)
    convert_to_ragged(model)
    saliency = expert_saliency(model, calibration.batches, config.criterion)
    blocks = dict(moe_blocks(model))
    drops = expert_removals(saliency, config.ratio, {n: getattr(b.gate, "top_k", 1) for n, b in blocks.items()})
    for name, dropped in drops.items():
        block = blocks[name]
        before = sum(p.numel() for p in block.experts.parameters()) + block.gate.weight.numel()
        kept = [i for i in range(block.experts.num_experts) if i not in dropped]
        set_expert_count(block, kept)
        log(f"{name}.experts", seconds=(time.perf_counter() - start) / len(drops), error=None,
            params_before=before, params_after=sum(p.numel() for p in block.experts.parameters())
            + block.gate.weight.numel(), dropped_experts=dropped)
    total = sum(len(s) for s in saliency.values())
    removed = sum(len(d) for d in drops.values())
    return {"method": "expert_prune", "config": config.to_dict(), "ratio_convention": RATIO_CONVENTION,
            "experts_total": total, "experts_removed": removed, "removed_fraction": removed / total,
            "dropped": drops, "params_before": params_before, "params_after": count_params(model),
            "routed_expert_params_before": routed_before, "routed_expert_params_after": routed_expert_params(model),
            "layout": layout(model), "seconds": time.perf_counter() - start}


def save_pruned(model: nn.Module, out_dir: str | Path, metrics: dict[str, Any] | None = None) -> Path:
    """Write a (pruned) transformers MoE model as a veil checkpoint: config.json with the transformers config and
    the per-layer expert counts and widths, model.safetensors, metrics.json (atomically)."""
    from veil.training.checkpoint import save_checkpoint

    config = {"kind": "moe_pruned", "transformers_config": model.config.to_dict(), "layout": layout(model)}
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}  # clone: tied tensors stored apart
    return save_checkpoint(out_dir, config, state, metrics or {})


def load_pruned(path: str | Path) -> nn.Module:
    """Rebuild a model written by :func:`save_pruned` (ragged experts at the recorded widths), in eval mode."""
    from transformers import AutoConfig, AutoModelForCausalLM
    from veil.training.checkpoint import load_checkpoint

    config, state, _ = load_checkpoint(path)
    if config.get("kind") != "moe_pruned":
        raise ValueError(f"checkpoint {str(path)!r}: expected kind 'moe_pruned', received {config.get('kind')!r}")
    hf = dict(config["transformers_config"])
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(hf.pop("model_type"), **hf))
    apply_layout(model, config["layout"])
    model.load_state_dict(state)
    return model.eval()


def apply_layout(model: nn.Module, recorded: dict[str, dict[str, Any]]) -> nn.Module:
    """Shape a freshly built model's MoE blocks like a pruned one (expert counts and widths from :func:`layout`),
    so the pruned state dict loads strictly; the weights are placeholders until then.

    Raises:
        ValueError: ``recorded`` names an MoE block the model lacks.
    """
    convert_to_ragged(model)
    blocks = dict(moe_blocks(model))
    for name, entry in recorded.items():
        if name not in blocks:
            raise ValueError(f"layout names MoE block {name!r}, which the model lacks; expected some of {sorted(blocks)}")
        set_expert_count(blocks[name], list(range(entry["experts"])))
        blocks[name].experts.keep_neurons([torch.arange(w) for w in entry["widths"]])
    return model
