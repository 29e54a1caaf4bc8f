"""The toy sort task's settings, tokens and reward, without torch (``veil train rl --help`` builds its flags from
``ToySortConfig``; issue 24). The policy, the warm start and the sampler are in ``toy.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

from veil.config import Config, ConfigError, field

from .rewards import positional_match, register_reward

PAD, BOS, SEP, EOS = 0, 1, 2, 3
FIRST_SYMBOL = 4


@dataclass
class ToySortConfig(Config):
    """The sort task and its tiny policy: vocabulary, lengths, model size and the noisy warm start."""

    num_symbols: int = field(8, "distinct symbols (vocabulary = 4 special tokens + symbols)")
    length: int = field(6, "symbols per prompt (and rewarded completion length before EOS)")
    hidden_size: int = field(64, "Llama hidden size")
    layers: int = field(2, "Llama decoder layers")
    noise: float = field(0.5, "warm start: probability that a target symbol is replaced by a random one")
    warm_steps: int = field(300, "warm start: supervised steps (batch warm_batch) on the noisy targets")
    warm_batch: int = field(64, "warm start: sequences per step")
    warm_lr: float = field(3e-3, "warm start: Adam learning rate")

    def validate(self) -> None:
        for name, ok, expected in [("num_symbols", self.num_symbols >= 2, ">= 2"), ("length", self.length >= 1, ">= 1"),
                                   ("noise", 0 <= self.noise <= 1, "in [0, 1]"),
                                   ("warm_steps", self.warm_steps >= 0, ">= 0")]:
            if not ok:
                raise ConfigError(f"ToySortConfig.{name}: expected {expected}, received {getattr(self, name)!r}")

    @property
    def vocab_size(self) -> int:
        return FIRST_SYMBOL + self.num_symbols


def prompt_symbols(prompt_ids: list[int]) -> list[int]:
    """The symbols between BOS and SEP."""
    start = prompt_ids.index(BOS) + 1 if BOS in prompt_ids else 0
    stop = prompt_ids.index(SEP) if SEP in prompt_ids else len(prompt_ids)
    return prompt_ids[start:stop]


@register_reward("sort")
def sort_reward(prompt_ids: list[int], completion_ids: list[int]) -> float:
    """Share of positions where the completion equals the prompt's symbols sorted ascending."""
    return positional_match(completion_ids, sorted(prompt_symbols(prompt_ids)))
