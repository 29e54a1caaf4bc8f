"""The kernels as torch custom ops (``torch.ops.veil.*``), with fake implementations for torch.compile / export.

Each op runs its Triton kernel when the tensors are on CUDA (or when Triton's interpreter is on and the caller
asks for it with ``force_triton``), and its PyTorch reference otherwise — so a model built on these ops runs
unchanged on a CPU-only machine and picks the fused kernels up on a GPU automatically.
"""

from __future__ import annotations

import torch

from . import interpreting, reference, triton_available

_force = False


def use_triton(x: torch.Tensor) -> bool:
    """Triton for CUDA tensors (when installed), or everywhere while :func:`force_triton` is on."""
    return triton_available() and (x.is_cuda or (_force and interpreting()))


class force_triton:
    """Context manager: route the ops to the Triton kernels even on CPU (needs ``TRITON_INTERPRET=1``)."""

    def __enter__(self) -> None:
        global _force
        if not interpreting():
            raise RuntimeError("force_triton: expected TRITON_INTERPRET=1 (set before triton is imported) on CPU")
        _force = True

    def __exit__(self, *exc: object) -> None:
        global _force
        _force = False


@torch.library.custom_op("veil::lora_apply", mutates_args=())
def lora_apply(x: torch.Tensor, y: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor, scales: torch.Tensor,
               index: torch.Tensor) -> torch.Tensor:
    """``y + s_a (x A_a) B_a`` per row with ``a = index[row]`` (-1: unchanged). x (M, K), y (M, N), A (L, K, R),
    B (L, R, N), scales (L,), index (M,) int32."""
    if use_triton(x):
        from .lora import lora_apply as kernel

        return kernel(x.contiguous(), y, lora_a, lora_b, scales, index.to(torch.int32))
    return reference.lora_reference(x, y, lora_a, lora_b, scales, index)


@lora_apply.register_fake
def _(x, y, lora_a, lora_b, scales, index):
    return torch.empty_like(y)


@torch.library.custom_op("veil::lowrank_linear", mutates_args=())
def lowrank_linear(x: torch.Tensor, u: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None = None,
                   coeffs: torch.Tensor | None = None) -> torch.Tensor:
    """``poly((x U) V + bias)``: x (M, K), U (K, R), V (R, N); coeffs (N, D+1), (D+1,) or None."""
    if use_triton(x):
        from .lowrank import lowrank_linear as kernel

        return kernel(x.contiguous(), u, v, bias, coeffs)
    return reference.lowrank_reference(x, u, v, bias, coeffs)


@lowrank_linear.register_fake
def _(x, u, v, bias=None, coeffs=None):
    return x.new_empty((x.shape[0], v.shape[1]))


@torch.library.custom_op("veil::linear_polyact", mutates_args=())
def linear_polyact(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                   coeffs: torch.Tensor) -> torch.Tensor:
    """``poly(x Wᵀ + b)``: an ``nn.Linear`` (weight (N, K)) followed by a PolyAct (coeffs (N, D+1) or (D+1,))."""
    if use_triton(x):
        from .poly import linear_polyact as kernel

        return kernel(x.contiguous(), weight, bias, coeffs)
    return reference.linear_poly_reference(x, weight, bias, coeffs)


@linear_polyact.register_fake
def _(x, weight, bias, coeffs):
    return x.new_empty((x.shape[0], weight.shape[0]))


@torch.library.custom_op("veil::polynorm", mutates_args=())
def polynorm(x: torch.Tensor, running_var: float, qa: float, qb: float, qc: float, mu: float,
             weight: torch.Tensor | None = None, bias: torch.Tensor | None = None) -> torch.Tensor:
    """PolyNorm (eval) over the last dim with ``g(z) = qa (z − qb)² + qc``."""
    if use_triton(x):
        from .poly import polynorm as kernel

        return kernel(x, running_var, (qa, qb, qc), mu, weight, bias)
    return reference.polynorm_reference(x, running_var, (qa, qb, qc), mu, weight, bias)


@polynorm.register_fake
def _(x, running_var, qa, qb, qc, mu, weight=None, bias=None):
    return torch.empty_like(x)
