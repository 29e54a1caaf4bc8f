"""Rule-based rewards: ``reward(prompt_ids, completion_ids) -> float`` and a small name registry.

A completion is the token list before its EOS. Register your own rule with ``register_reward``:

    >>> @register_reward("starts_with_seven")
    ... def starts_with_seven(prompt_ids, completion_ids):
    ...     return float(completion_ids[:1] == [7])
"""

from __future__ import annotations

from collections.abc import Callable

RewardFn = Callable[[list[int], list[int]], float]
REWARDS: dict[str, RewardFn] = {}


def register_reward(name: str) -> Callable[[RewardFn], RewardFn]:
    """Decorator adding a reward rule under ``name``; a name already taken is refused."""
    def add(fn: RewardFn) -> RewardFn:
        if name in REWARDS:
            raise ValueError(f"reward {name!r} is already registered ({REWARDS[name].__qualname__})")
        REWARDS[name] = fn
        return fn
    return add


def get_reward(name: str) -> RewardFn:
    """The rule registered as ``name``; an unknown name is an error listing the known ones."""
    if name not in REWARDS:
        raise KeyError(f"reward: expected one of {sorted(REWARDS)}, received {name!r}")
    return REWARDS[name]


def positional_match(completion: list[int], target: list[int]) -> float:
    """Share of positions where ``completion`` equals ``target``; extra or missing tokens count as wrong."""
    width = max(len(completion), len(target))
    return sum(a == b for a, b in zip(completion, target, strict=False)) / width if width else 1.0


def exact_match(completion: list[int], target: list[int]) -> float:
    return float(completion == target)
