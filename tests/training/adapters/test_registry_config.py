"""The closed registry and the shared config: refusals name the fix, configs round-trip JSON."""

from __future__ import annotations

import pytest
from veil.training.adapters import METHODS, AdapterMethod, LoraConfig, register_method
from veil.training.adapters.lora import LoraModel

from veil.config import ConfigError


def test_every_enum_member_is_registered() -> None:
    assert set(METHODS) == set(AdapterMethod)


@pytest.mark.parametrize(("name", "message"), [
    ("LoRA", "expected lower case"),
    ("dora", "add it to AdapterMethod in training/adapters/registry.py"),
    ("lora", "already registered"),
])
def test_register_method_refusals(name: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        register_method(name=name, config_cls=LoraConfig, model_cls=LoraModel)


def test_config_json_round_trip_and_unknown_keys_warn() -> None:
    cfg = LoraConfig(r=4, lora_alpha=16, target_modules=["query"], rank_pattern={"value": 2}, modules_to_save=["head"])
    assert LoraConfig.from_json(cfg.to_json()) == cfg
    with pytest.warns(UserWarning, match=r"ignoring unknown keys \['surprise'\]"):
        assert LoraConfig.from_dict({**cfg.to_dict(), "surprise": 1}) == cfg


@pytest.mark.parametrize(("kw", "message"), [
    ({"r": 0}, "LoraConfig.r: expected >= 1, received 0"),
    ({"lora_dropout": 1.5}, "LoraConfig.lora_dropout: expected 0 <= p < 1, received 1.5"),
    ({"target_modules": "(("}, "LoraConfig.target_modules: expected a valid regex"),
    ({"target_modules": None}, "LoraConfig.target_modules: expected a list of names"),
    ({"bias": "all"}, r"LoraConfig.bias: expected one of \['none'\], received 'all'"),
    ({"rank_pattern": {"q": 0}}, r"LoraConfig.rank_pattern\['q'\]: expected an int >= 1, received 0"),
])
def test_config_errors_name_field_expected_received(kw: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        LoraConfig(**{"target_modules": ["query"], **kw})


def test_targeting_errors(bert_factory) -> None:
    from veil.training.adapters import inject

    with pytest.raises(ValueError, match="target_modules: expected names of"):
        inject(bert_factory(), LoraConfig(target_modules=["nope"]))
    with pytest.raises(ValueError, match=r"'bert\.encoder\.layer\.0\.attention\.output' is a BertSelfOutput"):
        inject(bert_factory(), LoraConfig(target_modules=["output"]))
    with pytest.raises(ValueError, match="modules_to_save: expected module names in the model, received 'head'"):
        inject(bert_factory(), LoraConfig(target_modules=["query"], modules_to_save=["head"]))
