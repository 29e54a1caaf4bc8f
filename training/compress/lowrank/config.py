"""Configs of the three low-rank stages (recipe options): plain SVD, SVD-LLM and SAES-SVD."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from veil.config import Config, ConfigError, field


@dataclass
class SVDConfig(Config):
    """Plain truncated SVD of every targeted Linear (no calibration data used)."""

    ratio: float = field(0.2, "compression ratio = fraction of each factorised matrix's weights REMOVED (0.2 keeps "
                              "80 %); rank k = floor(m n (1 - ratio) / (m + n)) (SVD-LLM / SAES-SVD convention)")
    targets: list[str] = field([], "modules to factorise (names, dotted suffixes or 're:<regex>'); empty: every "
                                   "nn.Linear inside the repeated blocks")
    ignore: list[str] = field(["lm_head"], "modules never factorised (same pattern syntax)")

    def validate(self) -> None:
        if not 0.0 <= self.ratio < 1.0:
            raise ConfigError(f"{type(self).__name__}.ratio: expected a removal fraction in [0, 1), "
                              f"received {self.ratio}")


@dataclass
class SVDLLMConfig(SVDConfig):
    """SVD-LLM: truncation-aware whitening by the Cholesky factor of the uncompressed model's input Gram."""

    ridge: float = field(1e-5, "Cholesky damping λ relative to mean(diag H), raised x10 until Cholesky succeeds "
                               "(the paper's value is not published; 1e-5 follows the SAES-SVD reproduction)")

    def validate(self) -> None:
        super().validate()
        if self.ridge < 0:
            raise ConfigError(f"{type(self).__name__}.ridge: expected >= 0, received {self.ridge}")


@dataclass
class SAESConfig(SVDLLMConfig):
    """SAES-SVD: CEALC closed form on the compressed model's input statistics with the cumulative-error cross
    term, β per layer by ACES (or fixed)."""

    beta: float | None = field(None, "fixed β in [0, 1] (0: local reconstruction on compressed inputs, 1: full "
                                     "anchoring to the uncompressed outputs); None: chosen per layer by ACES")
    aces: Literal["closed_form", "exact"] = field("closed_form", "how ACES picks β: the spec's fixed-subspace "
                                                                "closed form, or an exact grid + golden-section "
                                                                "search of the retained-energy ratio")
    aces_check: bool = field(False, "also run the exact search and log its β and ρ next to the chosen ones")
    beta_min: float = field(0.0, "lower clip of the ACES β (paper value not published)")
    beta_max: float = field(1.0, "upper clip (cap) of the ACES β (paper value not published)")
    beta_shrink: float = field(1.0, "multiply the ACES β by this factor (reproduction's shrink; 1: off)")

    def validate(self) -> None:
        super().validate()
        if self.beta is not None and not 0.0 <= self.beta <= 1.0:
            raise ConfigError(f"SAESConfig.beta: expected None or a value in [0, 1], received {self.beta}")
        if not 0.0 <= self.beta_min <= self.beta_max <= 1.0:
            raise ConfigError(f"SAESConfig.beta_min/beta_max: expected 0 <= beta_min <= beta_max <= 1, received "
                              f"{self.beta_min}, {self.beta_max}")
        if not 0.0 <= self.beta_shrink <= 1.0:
            raise ConfigError(f"SAESConfig.beta_shrink: expected a value in [0, 1], received {self.beta_shrink}")
