"""PSOFT's layer: a rotation (Cayley) with scaling vectors inside the top-r SVD subspace of the frozen weight.

Wu, Hu, Min, Wang, "Efficient Orthogonal Fine-Tuning with Principal Subspace Adaptation", ICLR 2026
(arXiv 2505.11235). Parameter names and formulas follow PEFT's ``tuners/psoft``. veil's bases carry canonical
signs, PEFT's the raw LAPACK signs; the saved rotation is converted between the two (:func:`peft_signs`,
:func:`conjugate`; see ``model.py``), which is what makes a checkpoint mean the same function in both.
"""

from __future__ import annotations

import torch
from torch import nn

from ..layer import AdapterLayer, linear_weight
from .config import PsoftConfig


def canonical_svd(weight: torch.Tensor, r: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Top-r SVD of ``weight`` (out, in) in float64 with canonical signs: U (out, r), S (r,), Vh (r, in).

    Singular vectors are defined up to sign, and LAPACK / cuSOLVER / MKL may return either; each pair (u_k, v_k)
    is flipped so that the largest-|.| entry of u_k is positive (ties: the first). A checkpoint, which stores only
    the rotation, then means the same function on every device (spec §4.4).
    """
    u, s, vh = torch.linalg.svd(weight.detach().to(torch.float64), full_matrices=False)
    u, vh = canonical_signs(u[:, :r], vh[:r, :])
    return u, s[:r], vh


def canonical_signs(u: torch.Tensor, vh: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Flip each pair (u_k (out,), v_k (in,)) so that the largest-|.| entry of u_k is positive."""
    idx = u.abs().argmax(dim=0)  # (r,) row of the largest |entry| per column
    signs = torch.sign(u[idx, torch.arange(u.shape[1], device=u.device)])
    signs[signs == 0] = 1.0
    return u * signs, vh * signs[:, None]


SIGN_AGREEMENT = 0.99  # |<PEFT's v_k, veil's v_k>| below this: not a sign flip (near-equal singular values)


def peft_signs(weight: torch.Tensor, vh: torch.Tensor) -> tuple[torch.Tensor, float]:
    """Per pair k, the sign d_k with PEFT's ``v_k = d_k`` veil's canonical ``v_k``; and the worst |cos| of the pairs.

    PEFT (``PsoftLayer._build_psoft_ab_cache_buffers``, ``psoft_svd="full"``) runs ``torch.linalg.svd`` on the
    float32 weight on the device that holds it and keeps LAPACK's / cuSOLVER's signs, so this runs the same call
    there. A worst |cos| below :data:`SIGN_AGREEMENT` means PEFT's basis is not a sign flip of veil's (repeated
    singular values) and no sign vector relates the two.

    Args:
        weight: the frozen weight (out, in).
        vh: veil's canonical top-r right singular vectors (r, in).
    """
    _, _, peft_vh = torch.linalg.svd(weight.detach().to(torch.float32), full_matrices=False)
    cos = (peft_vh[:vh.shape[0]].double() * vh.detach().to(peft_vh.device).double()).sum(dim=1)  # (r,)
    signs = torch.where(cos < 0, -1.0, 1.0).to(torch.float64)
    return signs.cpu(), float(cos.abs().min()) if cos.numel() else 1.0


def conjugate(weight: torch.Tensor, signs: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """The rotation parameters under bases flipped by D = diag(signs): Q -> D Q D, i.e. q_ij d_i d_j.

    With A' = D A and B' = B D, ``B' (C' − I) A' = B (D C' D − I) A``; D commutes with diag(α), diag(β), and
    D R(Q) D = R(D Q D) for the Cayley map and for its Neumann series, so only the r(r−1)/2 values of Q change.
    D is its own inverse: the same call converts both ways.
    """
    d = signs.to(device=weight.device, dtype=weight.dtype)
    return weight * d[rows.to(weight.device)] * d[cols.to(weight.device)]


class OrthRotation(nn.Module):
    """C = diag(β) R diag(α) with R = (I + Q)(I − Q)⁻¹, Q skew-symmetric from ``weight`` (r(r−1)/2 values).

    The paper writes R = (I − Q)(I + Q)⁻¹, the same family under Q → −Q; PEFT's form is used so weights interchange (with the sign conversion of ``model.py``).
    At init Q = 0 and α = β = 1, so C = I.
    """

    def __init__(self, size: int, config: PsoftConfig, device: torch.device | None = None,
                 dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.size, self.config = size, config
        kw = {"device": device, "dtype": dtype}
        self.weight = nn.Parameter(torch.zeros(size * (size - 1) // 2, **kw))
        rows, cols = torch.triu_indices(size, size, 1, device=device)
        self.register_buffer("rows", rows, persistent=False)
        self.register_buffer("cols", cols, persistent=False)
        self.vector_b = nn.Parameter(torch.ones(size, **kw)) if config.psoft_mag_b else None
        self.vector_a = nn.Parameter(torch.ones(size, **kw)) if config.psoft_mag_a else None

    def skew(self) -> torch.Tensor:
        q = self.weight.new_zeros(self.size, self.size).index_put((self.rows, self.cols), self.weight)
        return q - q.T  # (r, r), Q = -Qᵀ

    def rotation(self) -> torch.Tensor:
        """R (r, r): the exact Cayley transform, or PEFT's truncated Neumann series of it."""
        q = self.skew()
        eye = torch.eye(self.size, device=q.device, dtype=q.dtype)
        if not self.config.use_cayley_neumann:
            return torch.linalg.solve(eye - q, eye + q, left=False)  # X (I − Q) = I + Q
        # PEFT's series, term for term (so checkpoints trained with it interchange): t = 1: I; t = 2: I + 2Q;
        # t >= 3: I + 2Q + 2Q² + 2Q³ + … (powers 1 .. max(2, t − 2)) + Q^(max(2, t − 2) + 1).
        t = self.config.num_cayley_neumann_terms
        r = eye.clone()
        if t > 1:
            r = r + 2.0 * q
        if t > 2:
            power = q @ q
            r = r + 2.0 * power
            for _ in range(3, t - 1):
                power = power @ q
                r = r + 2.0 * power
            r = r + power @ q
        return r

    def matrix(self) -> torch.Tensor:
        """C (r, r) = diag(β) R diag(α)."""
        c = self.rotation()
        if self.vector_b is not None:
            c = self.vector_b[:, None] * c
        if self.vector_a is not None:
            c = c * self.vector_a[None, :]
        return c


class PsoftLinear(AdapterLayer):
    """PSOFT on one linear (Wu et al., "Efficient Orthogonal Fine-Tuning with Principal Subspace Adaptation",
    ICLR 2026): ``y = W x + s · B (C − I) A x`` with A, B from the canonical top-r SVD of W (buffers, not saved).

    Args:
        base_layer: the frozen linear, weight (out, in).
        r: rank of the principal subspace.
        config: the PSOFT config (scaling, dropout, magnitude vectors, Cayley form).
        name: module path (for ``rank_pattern``).
    """

    def __init__(self, base_layer: nn.Linear, r: int, config: PsoftConfig) -> None:
        super().__init__(base_layer)
        w = linear_weight(base_layer)  # (out, in), also for GPT-2's transposed Conv1D
        if r > min(w.shape):
            raise ValueError(f"PsoftConfig.r: expected <= min(out, in) = {min(w.shape)}, received {r}")
        self.r, self.scaling, self.config = r, config.psoft_alpha / r, config
        self.psoft_dropout = nn.Dropout(config.psoft_dropout) if config.psoft_dropout > 0 else nn.Identity()
        self.psoft_R = OrthRotation(r, config, device=w.device, dtype=w.dtype)
        u, s, vh = canonical_svd(w, r)
        self.register_buffer("psoft_A", vh.to(w.dtype), persistent=False)  # (r, in), orthonormal rows
        self.register_buffer("psoft_B", (u * (s / self.scaling)).to(w.dtype), persistent=False)  # (out, r)

    def delta_forward(self, x: torch.Tensor) -> torch.Tensor:
        xa = self.psoft_dropout(x) @ self.psoft_A.T  # (..., r)
        xr = xa @ self.psoft_R.matrix().T  # (..., r)
        return (xr - xa) @ self.psoft_B.T * self.scaling  # (..., out)

    def lora_factors(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Exact rank-r LoRA factors with the same scaling: lora_A = (C − I) A (r, in), lora_B = B (out, r)."""
        eye = torch.eye(self.r, device=self.psoft_A.device, dtype=self.psoft_A.dtype)
        return (self.psoft_R.matrix() - eye) @ self.psoft_A, self.psoft_B

    def delta_weight(self) -> torch.Tensor:
        lora_a, lora_b = self.lora_factors()
        return lora_b @ lora_a * self.scaling  # (out, in)

    def aux_loss(self) -> torch.Tensor:
        """λ·‖CᵀC − I‖²_F, the paper's optional orthogonality constraint as a penalty (λ = orth_penalty)."""
        if self.config.orth_penalty == 0.0:
            return super().aux_loss()
        c = self.psoft_R.matrix()
        return self.config.orth_penalty * (c.T @ c - torch.eye(self.r, device=c.device, dtype=c.dtype)).pow(2).sum()

    def extra_repr(self) -> str:
        return f"r={self.r}, scaling={self.scaling:g}"
