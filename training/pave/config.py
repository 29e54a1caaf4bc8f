"""Settings of a PAVE specification: the shared base's head, the frozen random projection A, and the fit of B."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from veil.config import Config, ConfigError, field


@dataclass
class PaveConfig(Config):
    """How a PAVE vector is fitted (``other_seeds.md`` §2.1, §2.3).

    ``rank``, ``projection_seed``, ``scale``, ``layers``, ``targets``, ``num_outputs`` and ``head_seed`` belong to the
    spec's identity: vectors fitted with different values are never compared. The fit settings (``steps``, ``lr``,
    ``max_length``, ``seed``) only change how close B gets to the optimum.
    """

    rank: int = field(8, "rows r of the frozen projection A (r x n) of every adapted linear; the spec stores B (out x r)")
    projection_seed: int = field(3407, "seed of A; A ~ U(-sqrt(3s/n), sqrt(3s/n)) is redrawn from it, never stored")
    scale: float = field(1.0, "s in A's range: E[A A^T] = s I, so cos(B1 A, B2 A) ~ cos(B1, B2)")
    layers: int = field(1, "how many of the encoder's last transformer layers are adapted (the frozen layers below "
                           "are run once per probe set and cached)")
    targets: list[str] = field(["attention.self.query", "attention.self.value", "output.dense"],
                               "linear modules adapted in each of those layers (names inside a BERT layer)")
    num_outputs: int = field(4, "width K of the shared head g (labels 0..K-1; a model with fewer classes fills the first)")
    head_seed: int = field(0, "seed of the shared head g (a fixed random linear map on the mean-pooled embedding)")
    steps: int = field(12, "full-batch gradient steps on B from B = 0 (the paper's short fine-tune)")
    lr: float = field(0.5, "step size of the full-batch gradient descent on B")
    optimizer: Literal["sgd", "adam"] = field("sgd", "sgd: the NTK reading of the paper (tau = sum of gradients); adam")
    max_length: int = field(32, "tokens per example (truncated)")

    def validate(self) -> None:
        for name in ("rank", "layers", "num_outputs", "steps", "max_length"):
            if getattr(self, name) < 1:
                raise ConfigError(f"PaveConfig.{name}: expected >= 1, received {getattr(self, name)}")
        if self.num_outputs < 2:
            raise ConfigError(f"PaveConfig.num_outputs: expected >= 2, received {self.num_outputs}")
        if self.scale <= 0 or self.lr <= 0:
            raise ConfigError(f"PaveConfig.scale / lr: expected > 0, received {self.scale} / {self.lr}")
        if self.projection_seed < 0 or self.head_seed < 0:
            raise ConfigError(f"PaveConfig.projection_seed / head_seed: expected >= 0, received "
                              f"{self.projection_seed} / {self.head_seed}")
        if not self.targets:
            raise ConfigError("PaveConfig.targets: expected at least one module name, received []")
