"""veil.registry.Registry, the one closed-registry helper of the adapter methods, optimizers and compression stages."""

from __future__ import annotations

import enum
import sys
import types

import pytest

from veil.registry import Registry, RegistryError


class Color(str, enum.Enum):
    RED = "red"
    BLUE = "blue"


def test_closed_set_refuses_unknown_duplicate_and_upper_case_names() -> None:
    colors: Registry[int] = Registry("color", Color, where="Color in tests/test_registry.py")
    assert colors.register("red", 1) == 1
    with pytest.raises(RegistryError, match=r"color: expected one of \['blue', 'red'\], received 'green'; "
                                            r"add it to Color in tests/test_registry.py"):
        colors.register("green", 2)
    with pytest.raises(RegistryError, match=r"'red' is already registered \(1\)"):
        colors.register("red", 3)
    with pytest.raises(RegistryError, match="expected lower case, received 'RED'"):
        colors.register("RED", 3)
    with pytest.raises(ValueError, match=r"expected one of \['blue', 'red'\], received 'green'"):
        colors["green"]  # a ValueError (and a KeyError, so Mapping.get works)
    with pytest.raises(RegistryError, match="'blue' is known but not registered"):
        colors["blue"]
    assert colors.get("green") is None and colors[Color.RED] == colors["red"] == 1
    assert list(colors) == [Color.RED, Color.BLUE] and "blue" in colors and len(colors) == 2


def test_names_import_nothing_and_lookup_loads_the_registering_module(monkeypatch: pytest.MonkeyPatch) -> None:
    stages: Registry[str] = Registry("stage", ["fold"], modules={"fold": "veil_test_fold_stage"})
    assert stages.names == ("fold",)  # listing imports nothing: the module does not even exist
    with pytest.raises(ModuleNotFoundError, match="veil_test_fold_stage"):
        stages["fold"]
    monkeypatch.setitem(sys.modules, "veil_test_fold_stage", types.ModuleType("veil_test_fold_stage"))
    with pytest.raises(RegistryError, match="importing veil_test_fold_stage did not register it"):
        stages["fold"]
    stages.register("fold", "folded")
    assert stages["fold"] == "folded"
    with pytest.raises(RegistryError, match="modules for"):
        Registry("stage", ["a"], modules={"b": "x"})


def test_the_three_registries_use_the_helper_and_list_known_names() -> None:
    from veil.training.adapters.registry import METHODS, get_method
    from veil.training.compress.registry import STAGES, get_stage
    from veil.training.optim import OPTIMIZERS, build_optimizer

    assert all(isinstance(r, Registry) for r in (METHODS, STAGES, OPTIMIZERS))
    with pytest.raises(ValueError, match=r"method: expected one of \[.*'lora'.*\], received 'dora'"):
        get_method("dora")
    with pytest.raises(ValueError, match=r"recipe stage method: expected one of \[.*'saes_svd'.*\], received 'x'"):
        get_stage("x")
    with pytest.raises(ValueError, match=r"optimizer: expected one of \['adams', 'adamw', .*\], received 'sgd'"):
        build_optimizer("sgd", [], lr=1e-3)
