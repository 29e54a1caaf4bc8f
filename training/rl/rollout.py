"""Group sampling from a causal LM and token log-probabilities of its completions.

```
prompts (list of token lists) --pad_prompts--> (B0, P) left-padded
    --sample_groups(model, ..., generator)--> Rollout: prompt (B, P) + completion (B, L), B = B0 × group
    --completion_log_probs(model, rollout, T)--> (B, L) log π(o_t | prompt, o_<t) at temperature T
```
Any ``transformers`` causal LM works (and a veil ``AdapterModel`` around one): the model is called with
``input_ids``, ``attention_mask``, ``position_ids`` (so left padding does not shift positions) and a KV cache.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


@dataclass
class Rollout:
    """One batch of sampled completions; groups of ``group_size`` rows share a prompt and are contiguous.

    Attributes:
        prompt_ids: (B, P) left-padded prompts; prompt_mask: (B, P) 1 on real prompt tokens.
        completion_ids: (B, L) sampled tokens, ``pad_id`` after the first EOS.
        response_mask: (B, L) 1 on sampled tokens up to and including the first EOS, 0 on padding.
    """

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    completion_ids: torch.Tensor
    response_mask: torch.Tensor

    def completions(self) -> list[list[int]]:
        """Each completion's tokens before its EOS (what a reward function reads)."""
        out = []
        for ids, m in zip(self.completion_ids.tolist(), self.response_mask.tolist(), strict=True):
            n = int(sum(m))
            out.append(ids[:n])
        return out

    def prompts(self) -> list[list[int]]:
        """Each row's prompt without its left padding."""
        return [[t for t, m in zip(ids, mask, strict=True) if m]
                for ids, mask in zip(self.prompt_ids.tolist(), self.prompt_mask.tolist(), strict=True)]


def pad_prompts(prompts: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad token lists to one (B, P) tensor and its (B, P) attention mask."""
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("prompts: expected a non-empty list of non-empty token lists")
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p, dtype=torch.long)
        mask[i, width - len(p):] = 1
    return ids, mask


def _positions(mask: torch.Tensor) -> torch.Tensor:
    """Position ids that start at 0 on each row's first real token: (B, T) -> (B, T)."""
    return (mask.cumsum(dim=-1) - 1).clamp_min(0)


@torch.no_grad()
def sample_groups(model: nn.Module, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, group_size: int,
                  max_new_tokens: int, temperature: float, eos_id: int, pad_id: int,
                  generator: torch.Generator) -> Rollout:
    """Sample ``group_size`` completions per prompt with temperature sampling from ``generator``.

    Args:
        prompt_ids, prompt_mask: (B0, P) left-padded prompts.
    Returns:
        a Rollout with B = B0 × group_size rows (each prompt's group contiguous).
    """
    ids = prompt_ids.repeat_interleave(group_size, dim=0)  # (B, P)
    mask = prompt_mask.repeat_interleave(group_size, dim=0)  # (B, P)
    b = ids.shape[0]
    pos = _positions(mask)
    out = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True)
    next_pos = pos[:, -1:] + 1  # (B, 1)
    done = torch.zeros(b, dtype=torch.bool)
    tokens, alive = [], []
    for t in range(max_new_tokens):
        probs = torch.softmax(out.logits[:, -1].float() / temperature, dim=-1)  # (B, V)
        tok = torch.multinomial(probs, 1, generator=generator)[:, 0]  # (B,)
        tok = torch.where(done, torch.full_like(tok, pad_id), tok)
        alive.append(~done)
        tokens.append(tok)
        done = done | (tok == eos_id)
        if bool(done.all()) or t == max_new_tokens - 1:
            break
        mask = torch.cat([mask, torch.ones(b, 1, dtype=mask.dtype)], dim=1)
        out = model(input_ids=tok[:, None], attention_mask=mask, position_ids=next_pos,
                    cache=out.cache, use_cache=True)
        next_pos = next_pos + 1
    return Rollout(ids, prompt_mask.repeat_interleave(group_size, dim=0), torch.stack(tokens, dim=1),
                   torch.stack(alive, dim=1).long())


def completion_log_probs(model: nn.Module, rollout: Rollout, temperature: float) -> torch.Tensor:
    """log π(o_t | ·) of every completion token at ``temperature`` (as verl scales logits), 0 on padding.

    Returns:
        (B, L); differentiable when called outside ``torch.no_grad``.
    """
    p = rollout.prompt_ids.shape[1]
    ids = torch.cat([rollout.prompt_ids, rollout.completion_ids], dim=1)  # (B, P + L)
    mask = torch.cat([rollout.prompt_mask, rollout.response_mask], dim=1)  # (B, P + L)
    logits = model(input_ids=ids, attention_mask=mask, position_ids=_positions(mask), use_cache=False).logits
    logits = logits[:, p - 1:-1].float() / temperature  # (B, L, V): the logits that predicted each completion token
    logp = torch.log_softmax(logits, dim=-1).gather(-1, rollout.completion_ids[..., None])[..., 0]  # (B, L)
    return logp * rollout.response_mask.to(logp.dtype)
