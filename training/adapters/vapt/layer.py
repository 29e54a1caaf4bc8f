"""VAPT's prompt experts and the block wrapper that inserts them (spec §5.1).

Le et al., "Revisit Visual Prompt Tuning: The Expressiveness of Prompt Experts", ICLR 2026 (arXiv 2501.18936);
the official code (``Minhchuyentoancbn/VAPT`` @ ff3e65b, ``src/models/vit_prompt/vit.py``: ``PromptMLP``,
``ChannelWiseConv2d``, ``PromptedTransformerAdaptive``) was read, not copied (CC-BY-NC 4.0).

```
block input (B, P+N, d) --split--> prefix (B, P, d), patches X (B, N, d)
  static  (l < vpt_depth): prompts = dropout(E)                              E (N_p, d), shared by the batch
  adaptive (l >= vpt_depth): LN(X) -> (B, d, H, W) -> conv_k (one kernel, all channels) -> Dropout2d
                             -> flatten (B, d, H'W') -> token-wise Linear(H'W' -> N_p) -> G (B, N_p, d)
                             -> shared feature projector P = G + s·W2·ReLU(W1·G)        (B, N_p, d)
block([prefix; prompts; X]) -> drop the N_p prompt outputs -> (B, P+N, d)
```
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..layer import AdapterLayer
from .config import VaptConfig


class FeatureProjector(nn.Module):
    """The feature projector shared by all adaptive blocks: ``P = G + s · W2 · dropout(ReLU(W1 · G))``
    (official code) or ``P = s · W2 · dropout(ReLU(W1 · G))`` (paper formula, ``projector_residual=False``)."""

    def __init__(self, d: int, config: VaptConfig) -> None:
        super().__init__()
        self.residual = config.projector_residual
        self.down = nn.Linear(d, config.r, bias=False)  # W1 (r, d)
        self.up = nn.Linear(config.r, d, bias=False)  # W2 (d, r)
        self.dropout = nn.Dropout(config.mlp_dropout)
        self.scale = nn.Parameter(torch.ones(()), requires_grad=config.learnable_scale)

    def forward(self, g: torch.Tensor) -> torch.Tensor:  # (B, N_p, d) -> (B, N_p, d)
        out = self.scale * self.up(self.dropout(torch.relu(self.down(g))))
        return g + out if self.residual else out


class AdaptivePrompt(nn.Module):
    """Per-block prompt experts ``G = TokenWise(Dropout2d(Conv_k(LN(X))))`` over the (H, W) patch grid.

    Args:
        d: token width.
        grid: (H, W) patch grid of the block input.
        config: the VAPT config (kernel, padding, conv / no-conv ablation, N_p, dropout).
    """

    def __init__(self, d: int, grid: tuple[int, int], config: VaptConfig) -> None:
        super().__init__()
        self.grid, self.use_conv = grid, config.conv
        self.norm = nn.LayerNorm(d)
        h, w = grid
        if config.conv:
            self.padding = config.padding
            out_h, out_w = h + 2 * config.padding - config.kernel_size + 1, w + 2 * config.padding - config.kernel_size + 1
            if out_h < 1 or out_w < 1:
                raise ValueError(f"VaptConfig.kernel_size: expected <= the padded patch grid {grid} + 2·"
                                 f"{config.padding}, received {config.kernel_size}")
            # one k×k kernel shared by all d channels (d-fold fewer parameters than a depthwise conv); nn.Conv2d's
            # default init for fan_in = k² (the spec does not give the code's init)
            self.kernel = nn.Parameter(torch.empty(1, 1, config.kernel_size, config.kernel_size))
            nn.init.kaiming_uniform_(self.kernel, a=math.sqrt(5))
            self.conv_dropout = nn.Dropout2d(config.conv_dropout)
            h, w = out_h, out_w
        self.token_wise = nn.Linear(h * w, config.num_tokens)  # the N_p prompt experts: α_{j,k}, zero-initialised
        nn.init.zeros_(self.token_wise.weight)
        nn.init.zeros_(self.token_wise.bias)

    def forward(self, patches: torch.Tensor) -> torch.Tensor:  # (B, N, d) -> (B, N_p, d)
        b, n, d = patches.shape
        h, w = self.grid
        if n != h * w:
            raise ValueError(f"VAPT: patch tokens: expected {h}·{w} = {h * w} (the grid), received {n}")
        x = self.norm(patches).transpose(1, 2)  # (B, d, N)
        if self.use_conv:
            weight = self.kernel.expand(d, 1, -1, -1)  # (d, 1, k, k), the same kernel for every channel
            x = F.conv2d(x.reshape(b, d, h, w), weight, padding=self.padding, groups=d)  # (B, d, H', W')
            x = self.conv_dropout(x).flatten(2)  # (B, d, H'W')
        return self.token_wise(x).transpose(1, 2)  # (B, d, N_p) -> (B, N_p, d)


class VaptBlock(AdapterLayer):
    """A frozen transformer block run on ``[prefix; prompts; patches]``; the prompt outputs are dropped after it.

    Args:
        base_layer: the block, any module mapping (B, T, d) to (B, T, d) or a tuple whose first element is that.
        d: token width.
        grid: (H, W) patch grid.
        adaptive: input-adaptive prompts (True) or static VPT prompts (False).
        projector: the shared :class:`FeatureProjector` (held, not registered, so it is saved and counted once).
        config: the VAPT config.
        static_init_bound: VPT's uniform init bound sqrt(6 / (3·p² + d)) for static prompts.
    """

    def __init__(self, base_layer: nn.Module, d: int, grid: tuple[int, int], adaptive: bool,
                 projector: FeatureProjector | None, config: VaptConfig, static_init_bound: float) -> None:
        super().__init__(base_layer)  # type: ignore[arg-type]
        self.num_prefix, self.num_tokens, self.adaptive = config.num_prefix_tokens, config.num_tokens, adaptive
        self._projector = (projector,)  # a tuple keeps it out of this module's parameters and state_dict
        if adaptive:
            self.prompt = AdaptivePrompt(d, grid, config)
        else:
            self.prompt_embeddings = nn.Parameter(torch.empty(config.num_tokens, d).uniform_(-static_init_bound,
                                                                                              static_init_bound))
            self.prompt_dropout = nn.Dropout(config.prompt_dropout)

    def prompts(self, hidden: torch.Tensor) -> torch.Tensor:
        """The N_p prompts for this block's input ``hidden`` (B, P+N, d) -> (B, N_p, d)."""
        if not self.adaptive:
            return self.prompt_dropout(self.prompt_embeddings).expand(hidden.shape[0], -1, -1)
        g = self.prompt(hidden[:, self.num_prefix:])  # (B, N_p, d)
        projector = self._projector[0]
        return projector(g) if projector is not None else g

    def forward(self, hidden: torch.Tensor, *args: Any, **kwargs: Any) -> Any:  # (B, P+N, d) -> (B, P+N, d)
        p = self.num_prefix
        x = torch.cat([hidden[:, :p], self.prompts(hidden), hidden[:, p:]], dim=1)  # (B, P+N_p+N, d)
        if args and isinstance(args[0], torch.Tensor):  # the encoder's attention mask covers P+N tokens only
            args = (self.with_prompt_positions(args[0]), *args[1:])
        out = self.base_layer(x, *args, **kwargs)
        y = out[0] if isinstance(out, tuple) else out
        y = torch.cat([y[:, :p], y[:, p + self.num_tokens:]], dim=1)  # prompt outputs dropped: (B, P+N, d)
        return (y, *out[1:]) if isinstance(out, tuple) else y

    def with_prompt_positions(self, mask: torch.Tensor) -> torch.Tensor:
        """Widen an attention mask (..., Q, K) over P+N tokens to P+N_p+N: prompts attend and are attended to.

        transformers materialises a mask when tracing for export even if the caller passed none.
        """
        p, n_p = self.num_prefix, self.num_tokens
        open_value = True if mask.dtype == torch.bool else 0.0  # bool masks: True = attend; float masks: 0 = attend
        for dim in (-2, -1):
            if mask.shape[dim] == 1:  # broadcast over this axis
                continue
            shape = list(mask.shape)
            shape[dim] = n_p
            prompt = torch.full(shape, open_value, dtype=mask.dtype, device=mask.device)
            mask = torch.cat([mask.narrow(dim, 0, p), prompt, mask.narrow(dim, p, mask.shape[dim] - p)], dim=dim)
        return mask

    def aux_loss(self) -> torch.Tensor:
        return torch.zeros(())

    def delta_weight(self) -> torch.Tensor:
        raise NotImplementedError("VaptBlock: VAPT prompts are inputs to the block, not a weight delta; "
                                  "there is nothing to merge (spec §0)")
