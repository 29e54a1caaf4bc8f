"""Recipe stage names -> the module implementing them, imported only when a recipe uses the stage.

The closed set is :data:`MODULES`; :data:`STAGES` is its :class:`veil.registry.Registry` (the helper the adapter
methods and the optimizers use too). Every stage module exposes ``STAGES: dict[str, Stage]`` and registers
them with :func:`register_stages` on import. A stage's ``apply(model, config, calibration, log)``
changes ``model`` in place (real factorised layers, really sliced experts, updated weights) and returns a summary
dict for the report; ``log(module, seconds=..., error=..., params_before=..., params_after=..., **extra)`` records
one line per compressed module.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from veil.config import Config
from veil.registry import Registry

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


STAGES: Registry[Stage] = Registry("recipe stage method", MODULES, modules=MODULES,
                                   where="MODULES in training/compress/registry.py")


def register_stages(stages: Mapping[str, Stage]) -> None:
    """Register a stage module's ``STAGES`` (each name once)."""
    for name, stage in stages.items():
        STAGES.register(name, stage)


def get_stage(name: str) -> Stage:
    """The stage registered as ``name`` (its module imported on first use); an error naming the known ones
    otherwise."""
    return STAGES[name]
