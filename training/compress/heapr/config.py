"""Configs of the ``heapr`` and ``expert_prune`` recipe stages.

Ratio convention (spec §2.5, both stages): ``ratio`` is the fraction of the **routed experts' parameters**
removed. For HEAPr that is the fraction of atomic experts (intermediate neurons of routed experts) removed,
``round(ratio * N)`` of the N atomic experts of all MoE layers (so ``keep = 1 - ratio``, the HEAPr repository's
``compress_radio``); for expert pruning it is ``round(ratio * E_total)`` whole experts, which removes the same
fraction of routed-expert parameters when every expert has the same width. Shared experts, routers, attention,
embeddings and dense MLP layers are never touched and are not in the denominator.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from veil.config import Config, ConfigError, field


def _check_ratio(cls_name: str, ratio: float) -> None:
    if not 0.0 <= ratio < 1.0:
        raise ConfigError(f"{cls_name}.ratio: expected a fraction in [0, 1), received {ratio}")


@dataclass
class HEAPrConfig(Config):
    """HEAPr (Li et al., "HEAPr: Hessian-based Efficient Atomic Expert Pruning in Output Space", ICLR 2026,
    arXiv 2509.22299; spec §2): atomic-expert scores s_k = ½ e_kᵀ Ḡ_i e_k from one backward and two forward
    passes over calibration data, then removal of the lowest-scored atomic experts by real slicing.

    The paper's exact equations are not public (spec §7); the two open choices are the options ``fisher`` and
    ``weighting``. The defaults are the spec's reading of the paper (§2.3).
    """

    ratio: float = field(0.25, "fraction of the routed experts' atomic experts (intermediate neurons) removed")
    ranking: Literal["global", "per_layer"] = field(
        "global", "global: one ranking over all MoE layers and experts (HEAPr-G); per_layer: remove round(ratio * "
                  "N_layer) in every MoE layer (HEAPr-L)")
    fisher: Literal["expert_mean", "per_token"] = field(
        "expert_mean", "expert_mean: Ḡ_i = mean over the expert's tokens of g gᵀ, then s_k = ½ mean e_kᵀ Ḡ_i e_k "
                       "(spec §2.3, two forward passes + one backward); per_token: s_k = ½ mean (e_kᵀ g)², the "
                       "per-token Fisher (one forward + one backward)")
    weighting: Literal["per_expert", "by_frequency"] = field(
        "per_expert", "per_expert: average over the tokens routed to the expert (spec formula); by_frequency: "
                      "divide by all calibration tokens instead, so a rarely routed expert's score shrinks with "
                      "its routing frequency (the expected loss increase per token)")
    first_order: bool = field(
        False, "add the first-order term -mean g_{E_i}ᵀ e_k to the score (the paper drops it, as OBS does at a "
               "converged model); scores become signed and the most negative go first")
    tokens: Literal["routed", "all"] = field(
        "routed", "routed: statistics of expert i over the tokens routed to it, gated by its top-k weight; all: "
                  "every token contributes to every expert, gated by the router's softmax probability (model "
                  "outputs stay the routed ones)")
    unrouted: Literal["keep", "prune"] = field(
        "keep", "experts that no calibration token reaches (scores undefined): keep their atomic experts, or "
                "score them 0 so they are removed first")

    def validate(self) -> None:
        _check_ratio("HEAPrConfig", self.ratio)


@dataclass
class ExpertPruneConfig(Config):
    """Baseline: drop whole routed experts (and the router rows that select them) at the same parameter removal.

    ``criterion="reap"`` ranks experts by the REAP saliency S_j = mean over routed tokens of g_j(x) ||E_j(x)||
    (llm-compressor ``REAPPruningModifier``, spec §2.7); ``frequency`` by how many calibration tokens pick them.
    Removals are spread as evenly as possible over the MoE layers (REAP is per layer); each layer keeps at least
    ``top_k`` experts.
    """

    ratio: float = field(0.25, "fraction of the routed experts removed (= fraction of routed-expert parameters)")
    criterion: Literal["reap", "frequency"] = field("reap", "expert saliency: reap (g·||f||) or frequency")

    def validate(self) -> None:
        _check_ratio("ExpertPruneConfig", self.ratio)
