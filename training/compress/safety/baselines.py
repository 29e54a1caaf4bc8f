"""Weight-space realignment baselines (spec §3.6), run on the same θ0 / θ* as the one-example patch.

- **RESTA** (Bhardwaj et al. 2024, "Language Models are Homer Simpson"): add the safety vector
  v = θ_aligned − θ_unaligned back to the fine-tuned model, θ* + s·v. θ_unaligned is the aligned model fine-tuned
  by the defender on its own harmful -> compliance pairs (never the attacker's). The optional DARE step of the
  paper (drop-and-rescale of the fine-tuning delta) is not implemented.
- **SafeLoRA** (Hsu et al., NeurIPS 2024): per weight matrix, the alignment matrix V = W_aligned − W_base and
  C = V Vᵀ / ‖V‖_F; the fine-tuning update ΔW is replaced by C ΔW in the layers where cos(ΔW, C ΔW) is lowest.
  The paper projects LoRA updates ΔW = BA; the attack here is full fine-tuning, so ΔW = W* − W_aligned of every
  decoder Linear (a stated variant). Its 'number' mode: project the ``n`` least similar layers.

Each has one setting (s, or n), chosen on val prompts by the one-example selection's own upper-level objective,
KL(π_θ0 ‖ π) on harmful prompts + KL(π_θ* ‖ π) on task prompts (benign tasks and the user's task): the same
criterion for every method. (Chosen by the benign gate alone, SafeLoRA projects 22 of 28 matrices, reaches 0 % ASR
and erases the user's task: θ* reverts to θ0.)
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from .data import SafetyData
from .judge import GateSet, safety_gate
from .patch import Reference, upper_level_references
from .train import sft


def _matrices(model: nn.Module) -> dict[str, nn.Parameter]:
    """The decoder's Linear weights (2-D, embedding and head excluded): where SafeLoRA projects."""
    return {n: p for n, p in model.named_parameters() if p.dim() == 2 and "embed" not in n and "lm_head" not in n}


@torch.no_grad()
def resta(attacked: nn.Module, aligned: nn.Module, unaligned: nn.Module, scale: float = 1.0) -> nn.Module:
    """A copy of θ* plus ``scale`` times the safety vector θ_aligned − θ_unaligned (every parameter)."""
    model = copy.deepcopy(attacked)
    a, u = dict(aligned.named_parameters()), dict(unaligned.named_parameters())
    for name, p in model.named_parameters():
        p.add_(scale * (a[name] - u[name]))
    return model


@torch.no_grad()
def safelora_projections(attacked: nn.Module, aligned: nn.Module, base: nn.Module,
                         ) -> list[tuple[str, float, torch.Tensor]]:
    """(name, cos(ΔW, CΔW), W_aligned + CΔW) per decoder matrix, least similar first."""
    a, b = dict(aligned.named_parameters()), dict(base.named_parameters())
    out = []
    for name, w in _matrices(attacked).items():
        v = (a[name] - b[name]).double()  # (d_out, d_in) alignment matrix
        c = v @ v.T / v.norm()  # (d_out, d_out), C = V Vᵀ / ‖V‖_F
        delta = (w - a[name]).double()
        projected = c @ delta
        denom = float(delta.norm() * projected.norm())
        cos = float((delta * projected).sum()) / denom if denom else 1.0
        out.append((name, cos, (a[name].double() + projected).to(w.dtype)))
    return sorted(out, key=lambda item: item[1])


@torch.no_grad()
def safelora(attacked: nn.Module, projections: Sequence[tuple[str, float, torch.Tensor]], n_layers: int) -> nn.Module:
    """A copy of θ* with the ``n_layers`` least similar matrices of :func:`safelora_projections` projected."""
    model = copy.deepcopy(attacked)
    params = dict(model.named_parameters())
    for name, _, weight in projections[:n_layers]:
        params[name].copy_(weight)
    return model


def choose_by_objective(settings: Sequence[Any], build: Callable[[Any], nn.Module], harmful_ref: Reference,
                        task_ref: Reference) -> tuple[Any, list[dict[str, Any]]]:
    """The setting whose model scores lowest on the upper-level objective, and every setting's two KL terms."""
    table = []
    for setting in settings:
        model = build(setting)
        kh, kt = harmful_ref.kl(model), task_ref.kl(model)
        table.append({"setting": setting, "score": kh + kt, "kl_harmful": kh, "kl_task": kt})
    return min(table, key=lambda row: row["score"])["setting"], table


RESTA_SCALES = (0.25, 0.5, 1.0, 1.5, 2.0)


def run_baselines(data: SafetyData, gate: GateSet, base: nn.Module, aligned: nn.Module, attacked: nn.Module, *,
                  unalign_examples: int, epochs: int, lr: float, batch_size: int, seed: int, val_prompts: int = 32,
                  max_new_bytes: int = 48) -> dict[str, Any]:
    """RESTA and SafeLoRA with their setting chosen by the upper-level objective on val, then gated on ``gate``."""
    harmful_ref, task_ref = upper_level_references(data, aligned, attacked, val_prompts)
    # the defender's own harmful -> compliance pairs: the train split after the attacker's K (never the same ones)
    own = data.compliance("train", 2 * unalign_examples)[unalign_examples:]
    unaligned = copy.deepcopy(aligned)
    sft(unaligned, own, epochs=epochs, lr=lr, batch_size=batch_size, seed=seed + 2)
    scale, resta_val = choose_by_objective(RESTA_SCALES, lambda s: resta(attacked, aligned, unaligned, s),
                                           harmful_ref, task_ref)
    projections = safelora_projections(attacked, aligned, base)
    n_layers, safelora_val = choose_by_objective(range(len(projections) + 1),
                                                 lambda n: safelora(attacked, projections, n), harmful_ref, task_ref)
    return {
        "resta": {**safety_gate(resta(attacked, aligned, unaligned, scale), gate, max_new_bytes=max_new_bytes),
                  "setting": {"scale": scale}, "val": resta_val},
        "safelora": {**safety_gate(safelora(attacked, projections, n_layers), gate, max_new_bytes=max_new_bytes),
                     "setting": {"layers_projected": n_layers, "of": len(projections)}, "val": safelora_val,
                     "similarities": {name: cos for name, cos, _ in projections}},
    }
