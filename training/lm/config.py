"""Configs of `veil train lm`: the Llama-style model, how it is trained, and the size presets."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from veil.config import Config, ConfigError, field


def full_model_optimizers() -> list[str]:
    """The registered optimizers (veil.training.optim) that can train every weight of a model; the LoRA-only ones
    (``lora_only``: they update (A, B) pairs, which a from-scratch LM has none of) are refused."""
    from veil.training.optim import OPTIMIZERS

    return sorted(name for name, entry in OPTIMIZERS.items() if not entry.lora_only)


@dataclass
class LMModelConfig(Config):
    """A Llama-style decoder (transformers ``LlamaConfig``) over the 256 byte values, randomly initialised."""

    hidden_size: int = field(128, "model width (embedding size)")
    num_layers: int = field(4, "decoder blocks")
    num_heads: int = field(4, "attention heads (hidden_size must be a multiple)")
    intermediate_size: int = field(384, "SwiGLU MLP width (about 8/3 of hidden_size, as in Llama)")
    max_positions: int = field(256, "longest sequence the model accepts (RoPE positions); >= the training block")
    tie_embeddings: bool = field(False, "share the input embedding with the output head")

    def validate(self) -> None:
        for name in ("hidden_size", "num_layers", "num_heads", "intermediate_size", "max_positions"):
            if getattr(self, name) < 1:
                raise ConfigError(f"LMModelConfig.{name}: expected >= 1, received {getattr(self, name)}")
        if self.hidden_size % (2 * self.num_heads):
            raise ConfigError(f"LMModelConfig.hidden_size: expected a multiple of 2*num_heads={2 * self.num_heads} "
                              f"(even RoPE head size), received {self.hidden_size}")


@dataclass
class LMTrainConfig(Config):
    """How the LM is trained and evaluated: optimizer, schedule, batches, held-out evaluation."""

    optimizer: str = field("adamw", "a full-model optimizer of veil.training.optim (adamw, racs, alice, ...)")
    steps: int = field(1000, "optimizer steps")
    batch_size: int = field(16, "windows per step")
    block_size: int = field(128, "bytes per window (context length during training)")
    lr: float | None = field(None, "peak learning rate (default: the optimizer's entry in LM_LR, picked by the "
                                   "sweep of benchmarks/optim_lm.py)")
    optimizer_args: dict[str, Any] = field({}, "extra keyword arguments of the optimizer, e.g. {\"rank\": 16} "
                                               "for alice (default for alice: rank hidden_size/4, leading 0.3 rank)")
    weight_decay: float = field(0.0, "weight decay passed to the optimizer")
    warmup: float = field(0.1, "fraction of the steps with a linear learning-rate warm-up")
    min_lr_ratio: float = field(0.1, "the cosine decays the learning rate to this fraction of the peak")
    grad_clip: float = field(1.0, "clip the gradient norm to this value (0 disables)")
    eval_every: int = field(100, "evaluate on the held-out text every this many steps (and after the last)")
    eval_blocks: int = field(64, "held-out windows per evaluation, evenly spaced (0: all of them)")
    held_out: float = field(0.1, "fraction of the text's bytes held out, as whole documents (fixed split)")
    seed: int = field(0, "seed of initialisation and batch sampling")
    threads: int = field(0, "torch CPU threads (0 keeps torch's default)")

    @property
    def peak_lr(self) -> float:
        """The learning rate the run uses: ``lr``, or the optimizer's LM default."""
        return LM_LR[self.optimizer] if self.lr is None else self.lr

    def validate(self) -> None:
        allowed = full_model_optimizers()
        if self.optimizer not in allowed:
            from veil.training.optim import OPTIMIZERS

            lora_only = self.optimizer in OPTIMIZERS and OPTIMIZERS[self.optimizer].lora_only
            why = " (it updates LoRA (A, B) pairs only)" if lora_only else ""
            raise ConfigError(f"LMTrainConfig.optimizer: expected one of {allowed}, received {self.optimizer!r}{why}")
        for name in ("steps", "batch_size", "block_size", "eval_every"):
            if getattr(self, name) < 1:
                raise ConfigError(f"LMTrainConfig.{name}: expected >= 1, received {getattr(self, name)}")
        if not isinstance(self.optimizer_args, dict):
            raise ConfigError(f"LMTrainConfig.optimizer_args: expected a JSON object, received {self.optimizer_args!r}")
        if self.lr is None and self.optimizer not in LM_LR:
            raise ConfigError(f"LMTrainConfig.lr: expected a number (optimizer {self.optimizer!r} has no entry in "
                              f"LM_LR {sorted(LM_LR)}), received None")
        if self.lr is not None and self.lr <= 0:
            raise ConfigError(f"LMTrainConfig.lr: expected > 0, received {self.lr}")
        for name in ("weight_decay", "grad_clip", "eval_blocks", "threads"):
            if getattr(self, name) < 0:
                raise ConfigError(f"LMTrainConfig.{name}: expected >= 0, received {getattr(self, name)}")
        if not 0.0 <= self.warmup < 1.0:
            raise ConfigError(f"LMTrainConfig.warmup: expected a fraction in [0, 1), received {self.warmup}")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ConfigError(f"LMTrainConfig.min_lr_ratio: expected in [0, 1], received {self.min_lr_ratio}")
        if not 0.0 < self.held_out < 1.0:
            raise ConfigError(f"LMTrainConfig.held_out: expected a fraction in (0, 1), received {self.held_out}")


# Peak learning rate per optimizer on this LM when --lr is not given: the best of the sweep in
# benchmarks/optim_lm.py (tiny preset, lowest final training loss; docs/results.md shows the sweep).
LM_LR: dict[str, float] = {"adamw": 1e-3, "racs": 0.05, "alice": 0.02}

# Size presets: LMModelConfig fields over the defaults (parameters counted with the byte vocabulary).
PRESETS: dict[str, dict[str, int]] = {
    # 0.14 M parameters, ~0.01 s per step of 16 x 128 bytes on one core: tests and smoke runs.
    "micro": {"hidden_size": 64, "num_layers": 2, "num_heads": 4, "intermediate_size": 192},
    # 0.92 M parameters, ~0.16 s per step on one core: the default; 1000 steps take about three minutes.
    "tiny": {"hidden_size": 128, "num_layers": 4, "num_heads": 4, "intermediate_size": 384},
    # 6.5 M parameters, ~1 s per step on one core: for a longer run.
    "small": {"hidden_size": 256, "num_layers": 8, "num_heads": 8, "intermediate_size": 688},
}
