"""Tiny ARPC in one file: conv encoder/decoder, bitwise multi-scale residual quantizer, next-scale prior.

References: ARPC, "Autoregressive-based Progressive Coding for Ultra-Low Bitrate Image Compression"
(ICLR 2026, github.com/Joanna-0421/ARPC) on Infinity's bitwise VAR (arXiv 2412.04431). Spec:
specs/codec_priorguide.md A2-A3, B5. What differs is listed in docs/codec.md: no caption, tiny sizes, a
learned code magnitude per scale, masked channels contribute 0, the prior reads the accumulated code's 3x3
neighbourhood (VAR's next-scale input) and normalised cell centres.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from veil.codec.scales import area_matrix, bilinear_matrix, scale_sizes

from .config import CodecModelConfig


def _init_convs(module: nn.Module) -> None:
    """He (fan-in) normal weights and zero biases on every conv: with torch's default init the signal shrinks
    ~3x per layer, the biases dominate after a few layers and the untrained encoder's signs (hence the tokens
    and the decoded image) do not depend on the input; a short training never leaves that collapse."""
    for m in module.modules():
        if isinstance(m, (nn.Conv2d, nn.ConvTranspose2d)):
            nn.init.kaiming_normal_(m.weight, nonlinearity="relu")
            nn.init.zeros_(m.bias)


def _resample(x: torch.Tensor, size: tuple[int, int], matrix) -> torch.Tensor:
    """(B, C, H, W) -> (B, C, h, w) with the shared per-axis matrices (area down or bilinear up)."""
    a = torch.from_numpy(matrix(size[0], x.shape[2]))  # (h, H)
    b = torch.from_numpy(matrix(size[1], x.shape[3]))  # (w, W)
    return torch.einsum("ih,bchw,jw->bcij", a, x, b)


class Encoder(nn.Module):
    """(B, 3, H, W) in [-0.5, 0.5] -> (B, d, H/16, W/16): four stride-2 3x3 convs, each followed by a 3x3 conv,
    then l2-normalised over channels as BSQ (so the latent's scale matches the code magnitudes)."""

    def __init__(self, cfg: CodecModelConfig) -> None:
        super().__init__()
        layers, c_in = [], 3
        for c in cfg.channels:
            layers += [nn.Conv2d(c_in, c, 3, 2, 1), nn.GELU(), nn.Conv2d(c, c, 3, 1, 1), nn.GELU()]
            c_in = c
        layers.append(nn.Conv2d(c_in, cfg.d, 1))
        self.net = nn.Sequential(*layers)
        _init_convs(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.normalize(self.net(x), dim=1, eps=1e-6)


class Decoder(nn.Module):
    """(B, d, h, w) quantized latent -> (B, 3, 16h, 16w): the encoder's mirror with 4x4 stride-2 transposed convs."""

    def __init__(self, cfg: CodecModelConfig) -> None:
        super().__init__()
        widths = list(reversed(cfg.channels))
        layers: list[nn.Module] = [nn.Conv2d(cfg.d, widths[0], 3, 1, 1), nn.GELU()]
        for c_in, c_out in zip(widths, [*widths[1:], widths[-1]], strict=True):
            layers += [nn.Conv2d(c_in, c_in, 3, 1, 1), nn.GELU(), nn.ConvTranspose2d(c_in, c_out, 4, 2, 1), nn.GELU()]
        layers.append(nn.Conv2d(widths[-1], 3, 3, 1, 1))
        self.net = nn.Sequential(*layers)
        _init_convs(self)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.net(z)


class Tokenizer(nn.Module):
    """Encoder + BSQ multi-scale residual quantizer with group masks + decoder (stage 1 of the paper)."""

    def __init__(self, cfg: CodecModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.encoder, self.decoder = Encoder(cfg), Decoder(cfg)
        # code magnitude per scale, log-parametrised; starts geometric (coarse scales carry more energy)
        self.log_alpha = nn.Parameter(torch.log(torch.tensor([0.2 * 0.75 ** k for k in range(len(cfg.scales))])))
        self.register_buffer("masks", torch.tensor([[1.0] * b + [0.0] * (cfg.d - b) for b in cfg.bits]))  # (K, d)

    def alphas(self) -> list[float]:
        return [float(a) for a in self.log_alpha.detach().exp()]

    def quantize(self, z: torch.Tensor, keep: int | None = None) -> tuple[torch.Tensor, list[torch.Tensor], torch.Tensor]:
        """Residual bitwise quantization of z (B, d, h, w) over the scales (straight-through gradients).

        Returns:
            zq (B, d, h, w) the sum of the first ``keep`` scales' upsampled codes, the bits of every scale as
            (B, h_k, w_k, bits_k) uint8 tensors, and the commitment loss.
        """
        _, _, h, w = z.shape
        keep = len(self.cfg.scales) if keep is None else keep
        zq, acc, commit, tokens = torch.zeros_like(z), torch.zeros_like(z), z.new_zeros(()), []
        for k, (size, m) in enumerate(zip(scale_sizes(h, w, self.cfg.scales), self.cfg.bits, strict=True)):
            r = _resample(z - acc.detach(), size, area_matrix)  # (B, d, h_k, w_k) residual at this scale
            mask = self.masks[k].view(1, -1, 1, 1)
            hard = self.log_alpha[k].exp() * torch.where(r > 0, 1.0, -1.0) * mask
            q = (r * mask) + (hard - r * mask).detach()  # straight-through estimator
            commit = commit + F.mse_loss(r * mask, hard.detach())
            code = _resample(hard + (q - q.detach()), (h, w), bilinear_matrix)  # (B, d, h, w)
            acc = acc + code
            if k < keep:
                zq = zq + code
            tokens.append((r[:, :m] > 0).permute(0, 2, 3, 1).to(torch.uint8))  # (B, h_k, w_k, m)
        return zq, tokens, commit / len(self.cfg.scales)

    def forward(self, x: torch.Tensor, keep: int | None = None) -> tuple[torch.Tensor, list[torch.Tensor], torch.Tensor]:
        zq, tokens, commit = self.quantize(self.encoder(x), keep)
        return self.decoder(zq), tokens, commit


class Block(nn.Module):
    """Pre-norm transformer block; attention written out so it exports to plain ONNX ops."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        B, L, C = x.shape  # batch, tokens, width
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)  # 3 x (B, L, C)
        q, k, v = (t.view(B, L, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))  # (B, nh, L, hs)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(C // self.heads)) + bias  # (B, nh, L, L)
        y = (att.softmax(-1) @ v).transpose(1, 2).reshape(B, L, C)  # (B, L, C)
        x = x + self.proj(y)
        return x + self.mlp(self.ln2(x))


class NextScalePrior(nn.Module):
    """Block-causal next-scale transformer with d Bernoulli heads: logits of every bit of every cell.

    A cell of scale k attends to every cell of scales <= k; its inputs depend only on scales < k, so one
    teacher-forced pass gives p(bits of scale k | scales < k) for all k at once.
    """

    def __init__(self, cfg: CodecModelConfig) -> None:
        super().__init__()
        self.feat = nn.Linear(9 * cfg.d, cfg.prior_width)
        self.pos = nn.Linear(4 * cfg.n_freq, cfg.prior_width)
        self.scale = nn.Embedding(len(cfg.scales), cfg.prior_width)
        self.blocks = nn.ModuleList(Block(cfg.prior_width, cfg.prior_heads) for _ in range(cfg.prior_layers))
        self.ln = nn.LayerNorm(cfg.prior_width)
        self.head = nn.Linear(cfg.prior_width, cfg.d)

    def forward(self, feats: torch.Tensor, pos: torch.Tensor, sid: torch.Tensor) -> torch.Tensor:
        """feats (B, L, 9d), pos (B, L, 4F), sid (B, L) int64 -> logits (B, L, d) of p(bit = 1)."""
        x = self.feat(feats) + self.pos(pos) + self.scale(sid)  # (B, L, C)
        allowed = sid[:, None, :] <= sid[:, :, None]  # (B, L_query, L_key): keys of coarser or the same scale
        bias = torch.where(allowed, 0.0, -1e9)[:, None]  # (B, 1, L, L)
        for block in self.blocks:
            x = block(x, bias)
        return self.head(self.ln(x))


def bits_to_numpy(tokens: list[torch.Tensor], i: int) -> list[np.ndarray]:
    """Image ``i`` of a batch of tokens as the runtime's list of (h_k, w_k, m_k) uint8 arrays."""
    return [t[i].numpy() for t in tokens]
