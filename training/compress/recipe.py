"""Recipes: a YAML or JSON list of compression stages, and what a stage addresses (targets, ignore, blocks).

A recipe::

    seed: 0
    stages:
      - method: saes_svd          # a name of veil.training.compress.registry.MODULES
        targets: ["re:.*mlp.*"]   # optional: which modules (default: every module the stage can compress)
        ignore: [lm_head]         # optional: never these
        ratio: 0.4                # the stage's own options (its config dataclass fields)

Target and ignore patterns (PEFT / llm-compressor style): ``re:<regex>`` full-matches the dotted module name;
any other string matches the name itself or its last dotted components (``q_proj`` matches
``model.layers.0.self_attn.q_proj``; ``self_attn.q_proj`` too). Unknown keys and options are refused, never
ignored: a typo in a recipe must not silently compress something else.
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from veil.config import Config, ConfigError

from .registry import Stage, get_stage

RECIPE_KEYS = {"seed", "stages"}
STAGE_KEYS = {"method", "targets", "ignore"}


def name_matches(name: str, pattern: str) -> bool:
    """Whether dotted module ``name`` is addressed by ``pattern`` (``re:`` regex full match, or a dotted suffix)."""
    if pattern.startswith("re:"):
        return re.fullmatch(pattern[3:], name) is not None
    return name == pattern or name.endswith("." + pattern)


def select_modules(model: nn.Module, targets: list[str], ignore: list[str],
                   types: tuple[type[nn.Module], ...] = (nn.Linear,), within: str | None = None) -> list[str]:
    """Names of modules of ``types`` matching ``targets`` (all when empty) and no ``ignore`` pattern, in model
    order; ``within`` restricts to names under that prefix. Children of an already factorised layer are skipped."""
    from .lowrank.layer import FactorizedLinear

    skip = tuple(n + "." for n, m in model.named_modules() if isinstance(m, FactorizedLinear))
    names = []
    for name, module in model.named_modules():
        if not isinstance(module, types) or (skip and name.startswith(skip)):
            continue
        if within is not None and not name.startswith(within + "."):
            continue
        if targets and not any(name_matches(name, p) for p in targets):
            continue
        if any(name_matches(name, p) for p in ignore):
            continue
        names.append(name)
    return names


def find_blocks(model: nn.Module) -> tuple[str, nn.ModuleList]:
    """The model's repeated blocks: the ModuleList of same-class children holding the most parameters
    (``model.layers`` of a Llama, ``encoder.layer`` of a BERT)."""
    best: tuple[int, str, nn.ModuleList] | None = None
    for name, module in model.named_modules():
        if isinstance(module, nn.ModuleList) and len(module) and len({type(c) for c in module}) == 1:
            size = sum(p.numel() for p in module.parameters())
            if best is None or size > best[0]:
                best = (size, name, module)
    if best is None:
        raise ValueError(f"model {type(model).__name__}: expected a ModuleList of repeated blocks, found none")
    return best[1], best[2]


@dataclass
class RecipeStage:
    """One parsed stage: the registered stage and its validated config, plus the raw entry for round trips."""

    stage: Stage
    config: Config

    def to_dict(self) -> dict[str, Any]:
        return {"method": self.stage.name, **self.config.to_dict()}


@dataclass
class Recipe:
    """A parsed recipe: a seed and the stages in order."""

    seed: int
    stages: list[RecipeStage]

    def to_dict(self) -> dict[str, Any]:
        return {"seed": self.seed, "stages": [s.to_dict() for s in self.stages]}


def parse_stage(entry: Any, index: int) -> RecipeStage:
    """One ``stages[i]`` entry -> (Stage, config); errors name ``stages[i].<field>``."""
    where = f"recipe stages[{index}]"
    if not isinstance(entry, dict):
        raise ConfigError(f"{where}: expected a mapping with 'method', received {entry!r}")
    if "method" not in entry:
        raise ConfigError(f"{where}.method: expected a stage name, received nothing")
    try:
        stage = get_stage(entry["method"])
    except ValueError as exc:
        raise ConfigError(f"{where}.{exc}") from None
    fields = {f.name for f in dataclasses.fields(stage.config_cls)}
    options = {k: v for k, v in entry.items() if k != "method"}
    for key in ("targets", "ignore"):
        if key in options:
            if isinstance(options[key], str):
                options[key] = [options[key]]
            if key not in fields:
                raise ConfigError(f"{where}.{key}: stage {stage.name!r} does not take {key}")
    unknown = sorted(set(options) - fields)
    if unknown:
        raise ConfigError(f"{where}: unknown options {unknown} for stage {stage.name!r}; expected some of "
                          f"{sorted(fields)}")
    try:
        config = stage.config_cls(**options)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    return RecipeStage(stage, config)


def parse_recipe(data: Any) -> Recipe:
    """A recipe dict (or a bare list of stages) -> :class:`Recipe`; refuses unknown keys and empty stage lists."""
    if isinstance(data, list):
        data = {"stages": data}
    if not isinstance(data, dict):
        raise ConfigError(f"recipe: expected a mapping with 'stages', received {type(data).__name__}")
    unknown = sorted(set(data) - RECIPE_KEYS)
    if unknown:
        raise ConfigError(f"recipe: unknown keys {unknown}; expected some of {sorted(RECIPE_KEYS)}")
    seed = data.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ConfigError(f"recipe seed: expected an int, received {seed!r}")
    stages = data.get("stages")
    if not isinstance(stages, list) or not stages:
        raise ConfigError(f"recipe stages: expected a non-empty list, received {stages!r}")
    return Recipe(seed, [parse_stage(entry, i) for i, entry in enumerate(stages)])


def load_recipe(source: str | Path | dict[str, Any] | list[Any] | Recipe) -> Recipe:
    """A recipe from a YAML/JSON file path, a dict/list, or an already parsed Recipe."""
    if isinstance(source, Recipe):
        return source
    if isinstance(source, (dict, list)):
        return parse_recipe(source)
    path = Path(source)
    if not path.is_file():
        raise ConfigError(f"--recipe: expected an existing YAML or JSON file, received {str(path)!r}")
    text = path.read_text()
    if path.suffix == ".json":
        data = json.loads(text)
    else:
        import yaml

        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ConfigError(f"--recipe {str(path)!r}: not valid YAML ({exc})") from None
    return parse_recipe(data)
