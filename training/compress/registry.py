"""Recipe stage names -> the module implementing them, imported only when a recipe uses the stage.

Every stage module exposes ``STAGES: dict[str, Stage]``. A stage's ``apply(model, config, calibration, log)``
changes ``model`` in place (real factorised layers, really sliced experts, updated weights) and returns a summary
dict for the report; ``log(module, seconds=..., error=..., params_before=..., params_after=..., **extra)`` records
one line per compressed module.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from veil.config import Config

MODULES = {
    "saes_svd": "veil.training.compress.lowrank",
    "svd": "veil.training.compress.lowrank",
    "svd_llm": "veil.training.compress.lowrank",
    "heapr": "veil.training.compress.heapr",
    "expert_prune": "veil.training.compress.heapr",
    "realign": "veil.training.compress.safety",
}


@dataclass(frozen=True)
class Stage:
    """One recipe stage: its dataclass config and the function that applies it."""

    name: str
    config_cls: type[Config]
    apply: Callable[..., dict[str, Any]]  # apply(model, config, calibration, log) -> summary


def get_stage(name: str) -> Stage:
    """The stage registered as ``name``; a clear error naming the known ones otherwise."""
    if name not in MODULES:
        raise ValueError(f"recipe stage method: expected one of {sorted(MODULES)}, received {name!r}")
    return importlib.import_module(MODULES[name]).STAGES[name]
