"""``AdapterConfig``: the targeting vocabulary every adapter method shares (PEFT's names and semantics).

Method configs (``lora/config.py``, ``psoft/config.py``) inherit it and add their own fields. Every config
round-trips JSON and ignores unknown keys with a warning (``veil.config.Config``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from veil.config import Config, ConfigError, field

ALL_LINEAR = "all-linear"


@dataclass
class AdapterConfig(Config):
    """Which modules get an adapter, and how large it is. Field names and matching rules follow PEFT.

    Args:
        target_modules (list[str] | str | None): a list matches a module whose name equals an entry or ends
            with ``.<entry>``; a string is a regex matched against the whole module name; ``"all-linear"``
            targets every ``nn.Linear`` except the output head.
        exclude_modules (list[str] | str | None): same rules; matching modules are never targeted.
        layers_to_transform (list[int] | int | None): only modules of these layer indices (PEFT's rule: the first
            ``<name>.<index>.`` in the module path, or ``<layers_pattern>.<index>.``); needs a list of target names.
        layers_pattern (list[str] | str | None): the name(s) of the layer stack, e.g. ``"layers"`` or ``"h"``,
            whose index ``layers_to_transform`` selects (None: the first numbered segment).
        fan_in_fan_out (bool): the targets store their weight as (in, out) (GPT-2's ``Conv1D``). Informative, as
            in PEFT: veil reads the layout from each layer's type and sets this when a target is a ``Conv1D``.
        modules_to_save (list[str] | None): modules (e.g. a classifier head) trained fully and saved.
        r (int): adapter rank.
        rank_pattern (dict[str, int]): per-module rank overrides keyed by name or regex.
        alpha_pattern (dict[str, float]): per-module scaling-numerator overrides keyed by name or regex.
        bias (str): only ``"none"`` (biases stay frozen).
        task_type (str | None): PEFT's task type, e.g. ``"SEQ_CLS"``; informative only.
        base_model_name_or_path (str | None): where the base model came from; written to the checkpoint.
    """

    method: ClassVar[str] = ""
    peft_type: ClassVar[str] = ""

    target_modules: list[str] | str | None = field(None, "module names (exact or '.name' suffix), a regex, or 'all-linear'")
    exclude_modules: list[str] | str | None = field(None, "module names or a regex never to target")
    modules_to_save: list[str] | None = field(None, "modules trained fully and saved with the adapter (e.g. a head)")
    layers_to_transform: list[int] | int | None = field(None, "only these layer indices (PEFT semantics)")
    layers_pattern: list[str] | str | None = field(None, "the layer stack's name, e.g. 'layers' or 'h'")
    fan_in_fan_out: bool = field(False, "targets store weights as (in, out), GPT-2 Conv1D (set automatically)")
    r: int = field(8, "adapter rank")
    rank_pattern: dict[str, int] = field({}, "per-module rank overrides: {name or regex: rank}")
    alpha_pattern: dict[str, float] = field({}, "per-module alpha overrides: {name or regex: alpha}")
    bias: Literal["none"] = field("none", "which biases train: only 'none' is supported")
    task_type: str | None = field(None, "PEFT task type, e.g. SEQ_CLS (informative)")
    base_model_name_or_path: str | None = field(None, "the base model this adapter was trained on")

    def validate(self) -> None:
        name = type(self).__name__
        if self.r < 1:
            raise ConfigError(f"{name}.r: expected >= 1, received {self.r}")
        for fname in ("target_modules", "exclude_modules"):
            value = getattr(self, fname)
            if isinstance(value, str):
                try:
                    re.compile(value)
                except re.error as exc:
                    raise ConfigError(f"{name}.{fname}: expected a valid regex, received {value!r} ({exc})") from None
            elif value is not None and not all(isinstance(v, str) for v in value):
                raise ConfigError(f"{name}.{fname}: expected a list of strings, a regex or None, received {value!r}")
        for key, rank in self.rank_pattern.items():
            if not isinstance(rank, int) or rank < 1:
                raise ConfigError(f"{name}.rank_pattern[{key!r}]: expected an int >= 1, received {rank!r}")
        if self.target_modules is None:
            raise ConfigError(f"{name}.target_modules: expected a list of names, a regex or 'all-linear', received None")
        layers = self.layers_to_transform
        if layers is not None:
            if not (isinstance(layers, int) or (isinstance(layers, list) and all(isinstance(i, int) for i in layers))):
                raise ConfigError(f"{name}.layers_to_transform: expected an int or a list of ints, received {layers!r}")
            if isinstance(self.target_modules, str) and self.target_modules != ALL_LINEAR:
                raise ConfigError(f"{name}.layers_to_transform: expected a list of target_modules names (PEFT's "
                                  f"rule), received the regex {self.target_modules!r}; put the layers in the regex")
        if self.layers_pattern is not None and layers is None:
            raise ConfigError(f"{name}.layers_pattern: only used with layers_to_transform, which is None; "
                              f"set layers_to_transform=[...] too, or drop layers_pattern={self.layers_pattern!r}")

    def in_selected_layer(self, module_name: str) -> bool:
        """``module_name`` lies in a layer ``layers_to_transform`` selects (always True without it), PEFT's rule
        (``huggingface/peft:src/peft/tuners/tuners_utils.py``, ``check_target_module_exists``)."""
        layers = self.layers_to_transform
        if layers is None or layers == []:
            return True
        patterns = [self.layers_pattern] if isinstance(self.layers_pattern, str) else self.layers_pattern
        match = None
        if not patterns:
            match = re.match(r".*?\.[^.]*\.(?P<idx>\d+)\.", module_name)  # the first numbered segment
        else:
            for pattern in patterns:
                match = re.match(rf"(?:^|.*?\.){pattern}\.(?P<idx>\d+)\.", module_name)
                if match is not None:
                    break
        if match is None:
            return False
        index = int(match.group("idx"))
        return index == layers if isinstance(layers, int) else index in layers

    def rank_for(self, module_name: str) -> int:
        """The rank of ``module_name``: a matching ``rank_pattern`` key, else ``r``."""
        key = pattern_key(self.rank_pattern, module_name)
        return self.rank_pattern[key] if key is not None else self.r

    def to_peft_dict(self) -> dict[str, Any]:
        """The ``adapter_config.json`` content PEFT writes for this config (method classes fill it)."""
        raise NotImplementedError


def pattern_key(patterns: dict[str, Any], module_name: str) -> str | None:
    """The first key of ``patterns`` that matches the end of ``module_name`` (PEFT's ``get_pattern_key``)."""
    for key in patterns:
        if re.match(rf"(.*\.)?({key})$", module_name):
            return key
    return None
