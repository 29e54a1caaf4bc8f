"""``veil finetune``'s training settings and names, without torch: the command's parser is built from them, so
``veil finetune --help`` answers without importing torch (issue 24). The workload itself is ``finetune.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from veil.config import Config, ConfigError, field

BUNDLED_MINILM = "bundled:all-MiniLM-L6-v2"
PAIR_METHODS = ("lora", "e2lora")  # methods whose adapters are LoRA (A, B) pairs (for --optimizer adams / lracs)
# lr of each optimizer when --lr is not given: picked on validation accuracy by benchmarks/optim_lora.py
OPTIMIZER_LR = {"adamw": 2e-3, "adams": 3e-4, "lracs": 2.5e-4}
MINILM_HUB_ID = "sentence-transformers/all-MiniLM-L6-v2"  # what the bundled weights are; written to the checkpoint


@dataclass
class FinetuneConfig(Config):
    """Training settings of ``veil finetune`` (the adapter's own settings live in its method config)."""

    # adapter
    method: Literal["lora", "psoft", "mtlora", "e2lora", "loramixer", "vapt", "probe"] = field(
        "lora", "adapter method (every registered one); 'probe' trains the head only")
    r: int = field(8, "adapter rank")
    alpha: float = field(16.0, "scaling numerator (lora_alpha / psoft_alpha)")
    dropout: float = field(0.0, "adapter dropout")
    target_modules: list[str] = field(["query", "key", "value", "dense"], "module names to adapt, or all-linear "
                                      "(loramixer/mtlora/vapt: their own BERT/ViT defaults unless given)")
    # data
    task: Literal["sentiment", "number", "topic", "digits-5to9"] = field(
        "sentiment", "templated text task, or the tiny-ViT digits 0-4 -> 5-9 workload (see docs/adapters.md)")
    train_size: int = field(384, "training examples")
    val_size: int = field(120, "validation examples")
    test_size: int = field(240, "test examples")
    max_length: int = field(32, "tokens per example (truncated)")
    # optimisation
    epochs: int = field(2, "passes over the training set")
    batch_size: int = field(32, "examples per step")
    lr: float = field(2e-3, "learning rate (adapter and head); digits-5to9: 1e-2, 30 epochs, batch 64; "
                            "--optimizer adams / lracs: 3e-4 / 2.5e-4 unless given (benchmarks/optim_lora.py)")
    optimizer: Literal["adamw", "adams", "lracs"] = field(
        "adamw", "adamw, or a LoRA-pair optimizer (docs/optim.md): adams (Adam-Sylvester) or lracs; these need "
                 "LoRA (A, B) pairs (methods lora, e2lora) and train the head with AdamW")
    optimizer_args: dict[str, Any] = field({}, "extra keyword arguments of the optimizer, e.g. "
                                               "{\"bias_correction\": true} for lracs")
    pretrain_epochs: int = field(30, "digits-5to9: epochs of pre-training the tiny ViT on digits 0-4")
    weight_decay: float = field(0.0, "AdamW weight decay")
    seed: int = field(0, "seed of the data, the head and the adapter init")

    def validate(self) -> None:
        for name in ("r", "train_size", "val_size", "test_size", "max_length", "epochs", "batch_size",
                     "pretrain_epochs"):
            if getattr(self, name) < 1:
                raise ConfigError(f"FinetuneConfig.{name}: expected >= 1, received {getattr(self, name)}")
        if self.lr <= 0:
            raise ConfigError(f"FinetuneConfig.lr: expected > 0, received {self.lr}")
        if self.optimizer != "adamw" and self.method not in PAIR_METHODS:
            raise ConfigError(f"FinetuneConfig.optimizer: {self.optimizer} updates LoRA (A, B) pairs; expected "
                              f"--method in {list(PAIR_METHODS)} (or --optimizer adamw), received {self.method!r}")

    def adapter_config(self, num_labels: int):
        """The method config these settings describe (None for ``probe``); the head is in ``modules_to_save``."""
        from . import LoraConfig, PsoftConfig

        target: list[str] | str = "all-linear" if self.target_modules == ["all-linear"] else list(self.target_modules)
        common = {"r": self.r, "target_modules": target, "modules_to_save": ["classifier"],
                  "task_type": "SEQ_CLS", "base_model_name_or_path": MINILM_HUB_ID}
        if self.method == "lora":
            return LoraConfig(**common, lora_alpha=self.alpha, lora_dropout=self.dropout)
        if self.method == "psoft":
            return PsoftConfig(**common, psoft_alpha=self.alpha, psoft_dropout=self.dropout)
        return None
