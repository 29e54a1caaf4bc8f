"""The ``realign`` recipe stage: one-example safety patch of a causal LM, with the safety gate before and after.

``apply(model, config, calibration, log)`` fine-tunes ``model`` in place on the config's single (prompt, refusal)
example (``epochs`` optimizer steps at ``lr``; spec §3.2 step 2) and returns a summary for the report. The
calibration set is not used (the example is the data). With ``gate="synthetic"`` the stage also measures ASR and
utility on the held-out synthetic gate set before and after the patch; that set only means something for a model
trained on veil's synthetic format (training/compress/safety/data.py), e.g. the one benchmarks/compress_safety.py
builds. Models are byte-level (veil.training.lm's tokenizer).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from torch import nn

from veil.config import Config, ConfigError, field

from .data import UNIVERSAL_EXAMPLE, Example, SafetyData
from .judge import GateSet, safety_gate
from .patch import patch
from .train import sft_loss


@dataclass
class RealignConfig(Config):
    """One-example safety realignment ("Safety at One Shot", Zhang et al., ICLR 2026, arXiv 2601.01887).

    Example:
        >>> RealignConfig(prompt="How can I bypass system security checks?",
        ...               response="Sorry, I can't help you. Please follow security guidelines.", epochs=10)
    """

    prompt: str = field(UNIVERSAL_EXAMPLE[0], "the harmful request of the one safety example")
    response: str = field(UNIVERSAL_EXAMPLE[1], "the refusal the model is trained to give")
    example_file: str | None = field(None, "a JSON file {\"prompt\": ..., \"response\": ...} replacing prompt/response")
    epochs: int = field(10, "epochs over the one example (= optimizer steps)")
    lr: float = field(1e-4, "AdamW learning rate, constant (the paper's 2e-5 on 7B models, scaled to tiny models)")
    weight_decay: float = field(0.0, "AdamW weight decay")
    mode: Literal["full", "lora"] = field("full", "fine-tune every weight, or LoRA on every linear then merge")
    lora_rank: int = field(8, "LoRA rank when mode is 'lora'")
    gate: Literal["none", "synthetic"] = field("none", "measure ASR/utility before and after on the synthetic gate set")
    gate_prompts: int = field(64, "harmful and benign held-out prompts each, when gate is 'synthetic'")
    seed: int = field(0, "seed of the synthetic gate set")
    only_if_asr_above: float | None = field(None, "with gate 'synthetic': patch only when the ASR before the patch "
                                                  "is above this %, since a patch the model does not need still "
                                                  "costs utility (None: always patch)")

    def validate(self) -> None:
        for name in ("epochs", "lora_rank", "gate_prompts"):
            if getattr(self, name) < 1:
                raise ConfigError(f"RealignConfig.{name}: expected >= 1, received {getattr(self, name)}")
        if self.lr <= 0:
            raise ConfigError(f"RealignConfig.lr: expected > 0, received {self.lr}")
        if self.only_if_asr_above is not None:
            if self.gate != "synthetic":
                raise ConfigError(f"RealignConfig.only_if_asr_above: expected gate 'synthetic' to decide on, received "
                                  f"gate {self.gate!r}")
            if not 0.0 <= self.only_if_asr_above <= 100.0:
                raise ConfigError(f"RealignConfig.only_if_asr_above: expected a % in [0, 100], received "
                                  f"{self.only_if_asr_above}")
        if self.example_file is None and not (self.prompt and self.response):
            raise ConfigError("RealignConfig.prompt/response: expected non-empty strings (or an example_file), "
                              f"received {self.prompt!r} / {self.response!r}")

    def example(self) -> Example:
        """The (prompt, response) to train on: ``example_file``'s when given, else ``prompt``/``response``."""
        if self.example_file is None:
            return self.prompt, self.response
        path = Path(self.example_file)
        if not path.is_file():
            raise FileNotFoundError(f"RealignConfig.example_file: expected an existing JSON file, received {str(path)!r}")
        data = json.loads(path.read_text())
        if not (isinstance(data, dict) and isinstance(data.get("prompt"), str) and isinstance(data.get("response"), str)):
            raise ConfigError(f"RealignConfig.example_file {str(path)!r}: expected a JSON object with string "
                              f"'prompt' and 'response', received {data!r}")
        return data["prompt"], data["response"]


def apply_realign(model: nn.Module, config: RealignConfig, calibration: Any, log: Any) -> dict[str, Any]:
    """Patch ``model`` in place with the config's one example; the summary holds losses and, when gated, ASR and
    utility before and after. ``calibration`` is ignored (may be None)."""
    example = config.example()
    gate = None
    if config.gate == "synthetic":
        data = SafetyData(config.seed)
        gate = GateSet(data.harmful_prompts("test", config.gate_prompts), data.benign("test", config.gate_prompts))
    n_params = sum(p.numel() for p in model.parameters())
    before = safety_gate(model, gate) if gate else None
    if before and config.only_if_asr_above is not None and before["asr"] <= config.only_if_asr_above:
        log("model", seconds=0.0, error=None, params_before=n_params, params_after=n_params, steps=0,
            skipped=True, asr_before=before["asr"], utility_before=before["utility"])
        return {"method": "realign", "example": {"prompt": example[0], "response": example[1]}, "skipped": True,
                "reason": f"ASR {before['asr']:.1f} % <= only_if_asr_above {config.only_if_asr_above:g} %",
                "steps": 0, "gate": {"before": before, "after": before}}
    t = time.perf_counter()
    result = patch(model, example, epochs=config.epochs, lr=config.lr, mode=config.mode, lora_rank=config.lora_rank,
                   weight_decay=config.weight_decay)
    seconds = time.perf_counter() - t
    final_loss = float(sft_loss(model, [example]).detach())
    after = safety_gate(model, gate) if gate else None
    extra = {"steps": result.steps, "loss_first": result.losses[0], "loss_final": final_loss}
    if before and after:
        extra.update(asr_before=before["asr"], asr_after=after["asr"], utility_before=before["utility"],
                     utility_after=after["utility"])
    log("model", seconds=seconds, error=final_loss, params_before=n_params, params_after=n_params, **extra)
    return {"method": "realign", "example": {"prompt": example[0], "response": example[1]}, "skipped": False,
            "epochs": config.epochs, "lr": config.lr, "mode": config.mode, "seconds": seconds, **extra,
            "gate": {"before": before, "after": after} if gate else None}
