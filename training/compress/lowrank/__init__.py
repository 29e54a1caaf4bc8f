"""Low-rank factorisation stages: ``saes_svd`` (SAES-SVD: CEALC + ACES), ``svd_llm`` (SVD-LLM whitening) and
``svd`` (plain truncated SVD). Each replaces targeted Linears by real two-layer FactorizedLinear modules.

References: SAES-SVD, Hu et al., ICLR 2026 (arXiv 2602.03051); SVD-LLM, Wang et al., ICLR 2025
(arXiv 2403.07378). Equations and the options for unpublished constants: docs/compress.md.
"""

from __future__ import annotations

from functools import partial

from ..registry import Stage, register_stages
from .config import SAESConfig, SVDConfig, SVDLLMConfig
from .layer import FactorizedLinear
from .sequential import compress_lowrank

STAGES = {
    "svd": Stage("svd", SVDConfig, partial(compress_lowrank, "svd")),
    "svd_llm": Stage("svd_llm", SVDLLMConfig, partial(compress_lowrank, "svd_llm")),
    "saes_svd": Stage("saes_svd", SAESConfig, partial(compress_lowrank, "saes_svd")),
}
register_stages(STAGES)

__all__ = ["STAGES", "FactorizedLinear", "SAESConfig", "SVDConfig", "SVDLLMConfig", "compress_lowrank"]
