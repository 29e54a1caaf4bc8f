"""The one-example patch (spec §3.2 step 2) and the choice of that example (step 1, reconstructed).

Patch: standard SFT on one (prompt, refusal) pair, ``epochs`` passes = ``epochs`` optimizer steps (the batch is the
one example), constant small learning rate, AdamW; full fine-tuning by default, or LoRA on every linear of the
decoder (then merged, so the model keeps its plain layers). The paper's choice between the two is not in the
available sources (spec §3.2 [NF]): both are offered.

Selection: the paper's bi-level optimisation over 256 candidates is not released. ``select_bilevel`` brute-forces
its upper-level objective for every candidate of a small pool (spec §5.3): patch a copy of θ* with the candidate,
then score ``KL(π_θ0 || π_θc)`` on harmful prompts + ``KL(π_θ* || π_θc)`` on task prompts (λ||w||² is constant
for single examples). KL is per response byte, teacher-forced on the reference model's own greedy responses (a
one-sample estimate of the sequence KL under the reference). ``select_gradient`` is a one-backward proxy from the
low-rank-safety-gradient view (§3.3): the candidate whose descent direction points most towards θ₀.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from .data import Example, SafetyData
from .judge import generate
from .train import IGNORE, SFTResult, encode_batch, sft, sft_loss

LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def patch(model: nn.Module, example: Example, *, epochs: int = 10, lr: float = 1e-4,
          mode: Literal["full", "lora"] = "full", lora_rank: int = 8, weight_decay: float = 0.0) -> SFTResult:
    """Fine-tune ``model`` in place on the single ``example`` for ``epochs`` optimizer steps."""
    if mode == "full":
        return sft(model, [example], epochs=epochs, lr=lr, batch_size=1, weight_decay=weight_decay, grad_clip=0.0)
    if mode != "lora":
        raise ValueError(f"patch mode: expected 'full' or 'lora', received {mode!r}")
    from veil.training.adapters import LoraConfig, inject

    grad_state = {n: p.requires_grad for n, p in model.named_parameters()}
    wrapped = inject(model, LoraConfig(r=lora_rank, lora_alpha=2.0 * lora_rank, target_modules=LORA_TARGETS))
    try:
        result = sft(wrapped, [example], epochs=epochs, lr=lr, batch_size=1, weight_decay=weight_decay, grad_clip=0.0)
    finally:
        wrapped.merge_and_unload()
        for n, p in model.named_parameters():
            p.requires_grad_(grad_state[n])
    return result


@torch.no_grad()
def _logprobs(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """(B, T, 256) next-byte log-probabilities."""
    model.eval()
    return F.log_softmax(model(input_ids=x).logits, -1)


@dataclass
class Reference:
    """Teacher-forced sequences and the reference model's log-probabilities on them, for one KL term."""

    x: torch.Tensor  # (B, T) inputs
    mask: torch.Tensor  # (B, T) bool, response positions
    logp: torch.Tensor  # (B, T, 256) reference log-probabilities

    @classmethod
    def of(cls, model: nn.Module, prompts: Sequence[str]) -> Reference:
        """The reference ``model``'s greedy responses to ``prompts`` and its log-probabilities on them."""
        responses = generate(model, prompts)
        x, y = encode_batch(list(zip(prompts, responses, strict=True)))
        return cls(x, y != IGNORE, _logprobs(model, x))

    def kl(self, model: nn.Module) -> float:
        """Mean per-byte KL(π_ref || π_model) over the response positions."""
        logq = _logprobs(model, self.x)
        kl = (self.logp.exp() * (self.logp - logq)).sum(-1)  # (B, T)
        return float(kl[self.mask].mean())


def upper_level_references(data: SafetyData, aligned: nn.Module, attacked: nn.Module, n: int,
                           ) -> tuple[Reference, Reference]:
    """The two KL terms' references on val: θ0 on ``n`` harmful prompts, θ* on ``n`` task prompts (half benign
    tasks, half the user's downstream task)."""
    task = data.benign("val", n // 2) + data.downstream("val", n - n // 2)
    return (Reference.of(aligned, data.harmful_prompts("val", n)),
            Reference.of(attacked, [prompt for prompt, _ in task]))


@dataclass
class Candidate:
    """One candidate's upper-level score (lower is better) and its two KL terms."""

    example: Example
    score: float
    kl_harmful: float
    kl_task: float


def select_bilevel(attacked: nn.Module, candidates: Sequence[Example], harmful_ref: Reference, task_ref: Reference,
                   patch_fn: Callable[[nn.Module, Example], SFTResult]) -> list[Candidate]:
    """Every candidate scored by the upper-level objective after its own patch of a copy of ``attacked``; best
    first. ``harmful_ref`` holds θ0 on harmful prompts and ``task_ref`` θ* on task prompts."""
    scored = []
    for example in candidates:
        trial = copy.deepcopy(attacked)
        patch_fn(trial, example)
        kh, kt = harmful_ref.kl(trial), task_ref.kl(trial)
        scored.append(Candidate(example, kh + kt, kh, kt))
    return sorted(scored, key=lambda c: c.score)


def flat_grad(model: nn.Module, examples: Sequence[Example]) -> dict[str, torch.Tensor]:
    """Gradient of the SFT loss of ``examples`` at ``model``, per 2-D weight matrix."""
    model.zero_grad(set_to_none=True)
    model.train()
    sft_loss(model, examples).backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None and p.dim() == 2}
    model.zero_grad(set_to_none=True)
    return grads


def select_gradient(attacked: nn.Module, aligned: nn.Module, candidates: Sequence[Example]) -> list[Candidate]:
    """Candidates ranked by cos(g_c, θ* − θ0) (best first): a descent step −g_c moves θ* towards θ0."""
    aligned_params = dict(aligned.named_parameters())
    delta = {n: (p.detach() - aligned_params[n].detach()).flatten() for n, p in attacked.named_parameters()
             if p.dim() == 2}
    scored = []
    for example in candidates:
        g = flat_grad(attacked, [example])
        dot = sum(float(g[n].flatten() @ delta[n]) for n in g)
        norm = (sum(float(g[n].norm() ** 2) for n in g) * sum(float(delta[n].norm() ** 2) for n in g)) ** 0.5
        cos = dot / norm if norm else 0.0
        scored.append(Candidate(example, -cos, float("nan"), float("nan")))
    return sorted(scored, key=lambda c: c.score)
