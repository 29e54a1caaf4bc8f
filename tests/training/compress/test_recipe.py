"""Recipes: parsing, round trip, targets/ignore, and refusals naming the field."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn
from veil.training.compress.recipe import find_blocks, load_recipe, name_matches, parse_recipe, select_modules

from veil.config import ConfigError


def test_yaml_json_round_trip(tmp_path) -> None:
    path = tmp_path / "r.yaml"
    path.write_text("seed: 3\nstages:\n  - method: saes_svd\n    ratio: 0.4\n    ignore: lm_head\n"
                    "  - method: svd\n    targets: ['re:.*mlp.*']\n")
    recipe = load_recipe(path)
    assert recipe.seed == 3 and [s.stage.name for s in recipe.stages] == ["saes_svd", "svd"]
    assert recipe.stages[0].config.ratio == 0.4 and recipe.stages[0].config.ignore == ["lm_head"]
    again = tmp_path / "r.json"
    again.write_text(json.dumps(recipe.to_dict()))
    assert load_recipe(again).to_dict() == recipe.to_dict()


@pytest.mark.parametrize("data,field", [
    ({"stages": []}, "stages"),
    ({"stages": [{"ratio": 0.2}]}, r"stages\[0\].method"),
    ({"stages": [{"method": "nope"}]}, r"stages\[0\].*method"),
    ({"stages": [{"method": "svd", "ratoi": 0.2}]}, "ratoi"),
    ({"stages": [{"method": "svd", "ratio": 1.5}]}, "ratio"),
    ({"stages": [{"method": "saes_svd", "beta": 2.0}]}, "beta"),
    ({"seed": "x", "stages": [{"method": "svd"}]}, "seed"),
    ({"seeds": 1, "stages": [{"method": "svd"}]}, "seeds"),
])
def test_refusals_name_the_field(data, field) -> None:
    with pytest.raises(ConfigError, match=field):
        parse_recipe(data)


def test_missing_file_and_bad_yaml(tmp_path) -> None:
    with pytest.raises(ConfigError, match="--recipe"):
        load_recipe(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("stages: [\n")
    with pytest.raises(ConfigError, match="YAML"):
        load_recipe(bad)


def test_targets_ignore_and_blocks() -> None:
    model = nn.Module()
    model.layers = nn.ModuleList(nn.ModuleDict({"q_proj": nn.Linear(4, 4), "up": nn.Linear(4, 8)}) for _ in range(2))
    model.lm_head = nn.Linear(4, 10)
    assert name_matches("layers.0.q_proj", "q_proj") and not name_matches("layers.0.xq_proj", "q_proj")
    assert name_matches("layers.1.up", "re:layers\\.1\\..*")
    assert select_modules(model, [], ["lm_head"]) == ["layers.0.q_proj", "layers.0.up", "layers.1.q_proj", "layers.1.up"]
    assert select_modules(model, ["q_proj"], ["re:layers\\.1\\..*"]) == ["layers.0.q_proj"]
    assert find_blocks(model)[0] == "layers"
    with pytest.raises(ValueError, match="ModuleList"):
        find_blocks(nn.Linear(2, 2))
    assert torch.is_tensor(model.lm_head.weight)
