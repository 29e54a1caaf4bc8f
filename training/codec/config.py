"""Configs of `veil train codec`: the tokenizer and prior shapes, and how the two stages are trained."""

from __future__ import annotations

from dataclasses import dataclass

from veil.config import Config, ConfigError, field


@dataclass
class CodecModelConfig(Config):
    """Tiny ARPC: conv encoder/decoder, a bitwise multi-scale residual quantizer, a next-scale prior."""

    d: int = field(12, "latent channels = bits per token before the group mask")
    scales: list[int] = field([1, 2, 3, 4, 6, 8, 12, 16, 24, 32],
                              "scale side lengths for a 512x512 image (the last is the latent grid; other sizes scale)")
    bits: list[int] = field([6, 6, 6, 6, 9, 9, 9, 12, 12, 12],
                            "active bits per scale (group mask: d/2, 3d/4, d as ARPC's 3 groups)")
    channels: list[int] = field([32, 64, 96, 128], "encoder widths of the 4 stride-2 stages (decoder mirrors them)")
    prior_width: int = field(96, "prior transformer width")
    prior_layers: int = field(2, "prior transformer blocks")
    prior_heads: int = field(4, "prior attention heads")
    n_freq: int = field(4, "sinusoidal frequencies per axis of the prior's position features")
    quant: float = field(64.0, "the prior's input features are rounded to a 1/quant grid (determinism)")

    @property
    def stride(self) -> int:
        return 2 ** len(self.channels)

    def validate(self) -> None:
        if len(self.bits) != len(self.scales):
            raise ConfigError(f"CodecModelConfig.bits: expected one entry per scale ({len(self.scales)}), "
                              f"received {len(self.bits)}")
        if any(not 1 <= b <= self.d for b in self.bits):
            raise ConfigError(f"CodecModelConfig.bits: expected values in [1, d={self.d}], received {self.bits}")
        if sorted(self.scales) != self.scales or self.scales[0] < 1:
            raise ConfigError(f"CodecModelConfig.scales: expected increasing sides >= 1, received {self.scales}")
        if self.prior_width % self.prior_heads:
            raise ConfigError(f"CodecModelConfig.prior_width: expected a multiple of prior_heads={self.prior_heads}, "
                              f"received {self.prior_width}")


@dataclass
class CodecTrainConfig(Config):
    """Two stages as the paper: the tokenizer first, then the prior on its frozen tokens."""

    tokenizer_steps: int = field(1200, "stage 1 optimisation steps")
    prior_steps: int = field(400, "stage 2 optimisation steps")
    crop: int = field(96, "tokenizer training crop side (pixels)")
    prior_crop: int = field(256, "prior training crop side (pixels)")
    batch_size: int = field(8, "crops per step (both stages)")
    lr: float = field(2e-3, "peak AdamW learning rate (cosine decay)")
    commit: float = field(0.25, "commitment loss weight")
    ssim_weight: float = field(0.2, "weight of 1 - SSIM in the reconstruction loss")
    srd: float = field(0.2, "scale random dropout: probability of cutting the sum at a random scale >= 4")
    prior_crops: int = field(384, "crops tokenized once for stage 2")
    seed: int = field(0, "seed of crops, initialisation and dropout")
    threads: int = field(1, "torch CPU threads (1 leaves the other cores free)")
    checkpoint_every: int = field(0, "write a usable checkpoint every N steps of either stage (0: only at the end)")

    def validate(self) -> None:
        if self.checkpoint_every < 0:
            raise ConfigError(f"CodecTrainConfig.checkpoint_every: expected >= 0, received {self.checkpoint_every}")
        for name in ("tokenizer_steps", "prior_steps", "crop", "prior_crop", "batch_size", "prior_crops", "threads"):
            if getattr(self, name) < 1:
                raise ConfigError(f"CodecTrainConfig.{name}: expected >= 1, received {getattr(self, name)}")
        if not 0.0 <= self.srd < 1.0:
            raise ConfigError(f"CodecTrainConfig.srd: expected a probability in [0, 1), received {self.srd}")


# `veil train codec --quick`: a narrow model and a short schedule (under a minute on one idle CPU thread) that
# reconstructs its input (held-out 128x128 astronaut and coffee crops: 16.0 and 15.2 dB; the collapsed model of
# the old quick flags decoded one image for both, 10.9 dB; the default recipe is far better). Flags given
# beside --quick override these values.
QUICK_MODEL = {"channels": [16, 32, 32, 48], "prior_width": 32, "prior_layers": 1, "prior_heads": 2}
QUICK_TRAIN = {"tokenizer_steps": 300, "prior_steps": 60, "crop": 64, "prior_crop": 128, "batch_size": 8,
               "prior_crops": 32}
