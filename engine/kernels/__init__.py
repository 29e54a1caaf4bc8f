"""veil.engine.kernels: Triton kernels for the GPU path, each with a PyTorch reference (engine.md §3).

- ``lora``: gathered multi-adapter LoRA shrink/expand — every row carries its adapter index (-1: none), rows are
  grouped by adapter with index offsets (no pointer tables, so the interpreter can run them);
- ``lowrank``: fused ``x·U·V (+bias) (→ polynomial)`` that keeps ``x·U`` on chip (never rebuilds dense W);
- ``poly``: a linear layer with a PolyAct (Horner) epilogue, and PolyNorm (ULD-Net) as one row-wise kernel;
- ``ops``: the same computations as torch custom ops (``torch.ops.veil.*``) with fake implementations: Triton on
  CUDA, the PyTorch reference elsewhere; ``modules``: drop-in ``nn.Module`` layers built on the ops.

Kernels run on CPU under ``TRITON_INTERPRET=1`` (set before triton is imported), which is how CI tests them.
"""

from __future__ import annotations

import importlib.util
import os


def triton_available() -> bool:
    """Triton is installed (the ``gpu`` or ``dev`` extra)."""
    return importlib.util.find_spec("triton") is not None


def interpreting() -> bool:
    """Kernels run in Triton's numpy interpreter (CPU tensors allowed), not compiled for a GPU."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
