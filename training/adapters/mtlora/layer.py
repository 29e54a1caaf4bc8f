"""mtLoRA's block adapter: a shared-A / N-expert-B low-rank path beside a whole sub-layer, with fine-grained routing.

Tian, Ledent, Sun, "Scalable Multi-Task Low-Rank Model Adaptation", ICLR 2026 (arXiv 2603.01526), spec §1.1–1.3;
official code ``peft/tuners/block_adapters.py`` (``doem97/ICLR26_mtLoRA`` @ 61dea0d).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..layer import LINEAR_TYPES, AdapterLayer, linear_dims
from .config import MtLoraConfig


def sublayer_dims(module: nn.Module) -> tuple[int, int]:
    """(d_in, d_out) of a sub-layer: in_features of its first linear, out_features of its last (``nn.Linear`` or
    GPT-2's ``Conv1D``).

    Raises:
        ValueError: the module holds no linear layer.
    """
    linears = [m for m in module.modules() if isinstance(m, LINEAR_TYPES)]
    if not linears:
        raise ValueError(f"target_modules: expected a sub-layer containing nn.Linear or Conv1D, received a "
                         f"{type(module).__name__} with none")
    return linear_dims(linears[0])[0], linear_dims(linears[-1])[1]


class MeanPoolRouter(nn.Module):
    """The paper's router: a 2-layer MLP on the sequence-mean of x̂, one routing per sequence (spec §1.3)."""

    def __init__(self, d_in: int, hidden: int, out: int, **kw: Any) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(d_in, hidden, **kw), nn.Linear(hidden, out, **kw)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pooled = x.mean(dim=-2, keepdim=True) if x.dim() >= 3 else x  # (B, 1, d) or (B, d)
        return self.fc2(torch.relu(self.fc1(pooled)))  # broadcasts over tokens


class MtLoraBlock(AdapterLayer):
    """``sub_layer(x̂) + s · Σ_i Π_i(x̂) ⊙ B_i A dropout(x̂)`` (Tian et al., ICLR 2026, spec §1.2).

    Wrapping the sub-layer module (e.g. LLaMA's ``mlp``) means the adapter sees exactly the LayerNorm'd tensor the
    sub-layer sees and its output is added before the residual. A tuple output (attention) gets Δ on element 0.

    Args:
        base_layer: the frozen sub-layer (any module whose first argument is x̂ (..., d_in)).
        r: rank of the shared A.
        config: the mtLoRA config (experts, groups, router, style, dropout, losses).
    """

    def __init__(self, base_layer: nn.Module, r: int, config: MtLoraConfig) -> None:
        super().__init__(base_layer)  # type: ignore[arg-type]
        self.d_in, self.d_out = sublayer_dims(base_layer)
        n, g = config.num_experts, config.routing_groups
        if self.d_out % g:
            raise ValueError(f"MtLoraConfig.routing_groups: expected a divisor of the sub-layer output dim "
                             f"{self.d_out}, received {g}")
        ref = next(base_layer.parameters())
        kw = {"device": ref.device, "dtype": ref.dtype}
        self.r, self.n, self.g, self.config, self.scaling = r, n, g, config, config.lora_alpha / r
        self.lora_dropout = nn.Dropout(config.lora_dropout) if config.lora_dropout > 0 else nn.Identity()
        self.lora_A = nn.Linear(self.d_in, r, bias=False, **kw)  # weight (r, d_in), Kaiming-uniform(a=√5)
        self.lora_B = nn.Parameter(torch.zeros(n, self.d_out, r, **kw))  # (N, d_out, r), zero-init
        if config.router == "linear_per_token":
            self.lora_router: nn.Module = nn.Linear(self.d_in, n * g, bias=False, **kw)
        else:
            self.lora_router = MeanPoolRouter(self.d_in, config.router_hidden, n * g, **kw)
        self.last_routing: torch.Tensor | None = None

    @property
    def in_features(self) -> int:
        return self.d_in

    @property
    def out_features(self) -> int:
        return self.d_out

    def routing(self, x: torch.Tensor) -> torch.Tensor:
        """Π (..., g, N): softmax over experts within each dimension group (spec §1.3)."""
        logits = self.lora_router(x)  # (..., N·g) or (B, 1, N·g)
        return logits.unflatten(-1, (self.g, self.n)).softmax(dim=-1)  # (..., g, N)

    def delta_forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.lora_A(self.lora_dropout(x))  # (..., r)
        if self.config.style == "bottleneck":
            h = torch.relu(h)
        experts = torch.einsum("...r,ndr->...nd", h, self.lora_B)  # (..., N, d_out)
        pi = self.routing(x)  # (..., g, N)
        if self.training:
            self.last_routing = pi
        weights = pi.repeat_interleave(self.d_out // self.g, dim=-2)  # (..., d_out, N)
        return self.scaling * (weights.transpose(-1, -2) * experts).sum(dim=-2)  # (..., d_out)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        x = args[0] if args else kwargs["hidden_states"]  # x̂ (..., d_in), the sub-layer's own input
        out = self.base_layer(*args, **kwargs)
        if isinstance(out, tuple):
            return (out[0] + self.delta_forward(x), *out[1:])
        return out + self.delta_forward(x)

    def merge(self) -> None:
        raise NotImplementedError(
            "mtLoRA cannot be merged: the routing Π(x̂) depends on the input and the block adapter runs beside a "
            "non-linear sub-layer, so there is no weight W with W + ΔW equal to it (spec §0)")

    unmerge = merge

    def aux_loss(self) -> torch.Tensor:
        """λ2 · CV² of this adapter's mean routing weights over the last training batch (code ``blc_alpha``)."""
        if self.config.balance_alpha == 0.0 or self.last_routing is None:
            return self.lora_B.new_zeros(())
        return self.config.balance_alpha * balance_cv2(self.last_routing)

    def extra_repr(self) -> str:
        return f"d_in={self.d_in}, d_out={self.d_out}, r={self.r}, experts={self.n}, groups={self.g}"


def balance_cv2(routing: torch.Tensor) -> torch.Tensor:
    """CV² = Var(p̄) / (mean(p̄)² + 1e-10) of the per-expert mean routing weight p̄ (N,) over tokens and groups."""
    p_bar = routing.reshape(-1, routing.shape[-1]).mean(dim=0)  # (N,)
    return p_bar.var(correction=0) / (p_bar.mean() ** 2 + 1e-10)


def block_param_count(d_in: int, d_out: int, r: int, n: int, g: int) -> int:
    """Trainable parameters of one block adapter with the linear router: A + N·B + router."""
    return r * d_in + n * d_out * r + d_in * n * g


__all__ = ["MeanPoolRouter", "MtLoraBlock", "balance_cv2", "block_param_count", "sublayer_dims"]
