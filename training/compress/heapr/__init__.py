"""HEAPr atomic-expert pruning for MoE models, and whole-expert pruning as its baseline (docs/compress_heapr.md).

Stages registered for ``veil compress`` recipes: ``heapr`` (:class:`HEAPrConfig`) and ``expert_prune``
(:class:`ExpertPruneConfig`). Both work on transformers MoE models (Qwen2-MoE, Mixtral and the like, fused v5
expert tensors or per-expert modules) and really slice the experts (:class:`RaggedExperts`).
"""

from veil.training.compress.registry import Stage, register_stages

from .config import ExpertPruneConfig, HEAPrConfig
from .experts import RaggedExperts, convert_to_ragged, layout, moe_blocks, routed_expert_params
from .importance import expert_saliency, heapr_scores
from .prune import (
    apply_expert_prune,
    apply_heapr,
    apply_layout,
    count_params,
    load_pruned,
    removal_mask,
    save_pruned,
)

STAGES = {
    "heapr": Stage("heapr", HEAPrConfig, apply_heapr),
    "expert_prune": Stage("expert_prune", ExpertPruneConfig, apply_expert_prune),
}
register_stages(STAGES)

__all__ = [
    "STAGES", "ExpertPruneConfig", "HEAPrConfig", "RaggedExperts", "apply_expert_prune", "apply_heapr", "apply_layout",
    "convert_to_ragged", "count_params", "expert_saliency", "heapr_scores", "layout", "load_pruned", "moe_blocks",
    "removal_mask", "routed_expert_params", "save_pruned",
]
