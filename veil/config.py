"""Dataclass configs shared by every room: JSON round trip, validation helpers, argparse generation.

Every veil config is a ``@dataclass`` that inherits :class:`Config`. Fields carry their help text in
``metadata={"help": ...}`` so that ``--help`` on the command line is written once, here. Closed choices
are ``Literal[...]`` and are checked on construction with an error that names the field, the expected
values and the received value. This module needs neither torch nor numpy. The other helpers every room uses
live beside it: :mod:`veil.registry` (the closed plugin registry), :mod:`veil.atomic` (atomic writes) and
:mod:`veil.lazy` (imports deferred to first use).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import types
import typing
import warnings
from typing import Any, Literal, TypeVar, get_args, get_origin

C = TypeVar("C", bound="Config")
_UNION_TYPES = (typing.Union, types.UnionType)


class ConfigError(ValueError):
    """A config field holds a value outside what the field accepts."""


def field(default: Any, help: str, **kwargs: Any) -> Any:
    """A dataclass field with its help text; lists and dicts get a factory."""
    if isinstance(default, (list, dict)):
        return dataclasses.field(default_factory=lambda: type(default)(default), metadata={"help": help}, **kwargs)
    return dataclasses.field(default=default, metadata={"help": help}, **kwargs)


def _check_type(cls_name: str, name: str, hint: Any, value: Any) -> Any:
    """Check (and gently coerce) one value against its type hint; raise ConfigError otherwise."""
    origin, args = get_origin(hint), get_args(hint)
    if origin is Literal:
        if value not in args:
            raise ConfigError(f"{cls_name}.{name}: expected one of {list(args)}, received {value!r}")
        return value
    if origin in _UNION_TYPES:
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _check_type(cls_name, name, inner[0], value) if len(inner) == 1 else value
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{cls_name}.{name}: expected a bool, received {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{cls_name}.{name}: expected an int, received {value!r}")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{cls_name}.{name}: expected a number, received {value!r}")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise ConfigError(f"{cls_name}.{name}: expected a string, received {value!r}")
        return value
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{cls_name}.{name}: expected a list, received {value!r}")
        item = args[0] if args else Any
        items = [_check_type(cls_name, f"{name}[{i}]", item, v) for i, v in enumerate(value)] if item is not Any else list(value)
        return tuple(items) if origin is tuple else items
    if isinstance(hint, type) and issubclass(hint, Config):
        if isinstance(value, hint):
            return value
        if isinstance(value, dict):
            return hint.from_dict(value)
        raise ConfigError(f"{cls_name}.{name}: expected a {hint.__name__} or a dict, received {value!r}")
    return value


@dataclasses.dataclass
class Config:
    """Base of every veil config: typed, validated, JSON round-trippable."""

    def __post_init__(self) -> None:
        hints = typing.get_type_hints(type(self))
        for f in dataclasses.fields(self):
            setattr(self, f.name, _check_type(type(self).__name__, f.name, hints[f.name], getattr(self, f.name)))
        self.validate()

    def validate(self) -> None:
        """Cross-field checks; subclasses raise ConfigError naming the field(s)."""

    # -- JSON -----------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            out[f.name] = value.to_dict() if isinstance(value, Config) else (list(value) if isinstance(value, tuple) else value)
        return out

    @classmethod
    def from_dict(cls: type[C], data: dict[str, Any]) -> C:
        """Build from a dict; unknown keys are ignored with a warning that names them."""
        if not isinstance(data, dict):
            raise ConfigError(f"{cls.__name__}: expected a JSON object, received {type(data).__name__}")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            warnings.warn(f"{cls.__name__}: ignoring unknown keys {unknown}", UserWarning, stacklevel=2)
        return cls(**{k: v for k, v in data.items() if k in names})

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls: type[C], text: str) -> C:
        return cls.from_dict(json.loads(text))

    def replace(self: C, **changes: Any) -> C:
        return dataclasses.replace(self, **changes)

    # -- argparse -------------------------------------------------------------------------------
    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser, prefix: str = "", skip: tuple[str, ...] = ()) -> None:
        """Add one ``--<prefix><field>`` flag per scalar field; help and choices come from the field metadata."""
        hints = typing.get_type_hints(cls)
        group = parser.add_argument_group(f"{cls.__name__} ({cls.__doc__.splitlines()[0] if cls.__doc__ else ''})")
        for f in dataclasses.fields(cls):
            hint = hints[f.name]
            if f.name in skip or (isinstance(hint, type) and issubclass(hint, Config)):
                continue
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
            text = f.metadata.get("help", "")
            if default != "" and "default:" not in text:  # an empty default says nothing; a stated one once
                text = f"{text} (default: {default})"
            kwargs: dict[str, Any] = {"default": None, "dest": flag_dest(prefix, f.name), "help": text}
            origin, args = get_origin(hint), get_args(hint)
            if origin in _UNION_TYPES:
                hint = next(a for a in args if a is not type(None))
                origin, args = get_origin(hint), get_args(hint)
            if hint is bool:
                kwargs["action"] = argparse.BooleanOptionalAction
            elif origin is Literal:
                kwargs["choices"] = list(args)
            elif origin in (list, tuple):
                kwargs.update(nargs="+", type=args[0] if args else str)
            elif origin is dict:
                kwargs.update(type=json_object, metavar="JSON")
            else:
                kwargs["type"] = hint if hint in (int, float, str) else str
            group.add_argument("--" + flag_dest(prefix, f.name).replace("_", "-"), **kwargs)

    @classmethod
    def from_args(cls: type[C], args: argparse.Namespace, prefix: str = "", base: dict[str, Any] | None = None,
                  **overrides: Any) -> C:
        """Start from ``base`` (a dict, or the defaults) and apply every ``--<prefix>`` flag the user gave."""
        values = dict(base or {})
        for f in dataclasses.fields(cls):
            given = getattr(args, flag_dest(prefix, f.name), None)
            if given is not None:
                values[f.name] = given
        values.update(overrides)
        return cls.from_dict(values)


def json_object(text: str) -> dict[str, Any]:
    """argparse type of a dict field: a JSON object given inline."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"expected a JSON object, received {text!r} ({exc.msg})") from exc
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, received {text!r}")
    return value


def flag_dest(prefix: str, name: str) -> str:
    """argparse dest of field ``name`` under ``prefix``; a field already named by it is not prefixed twice
    (PsoftConfig.psoft_mag_a -> ``--psoft-mag-a``, not ``--psoft-psoft-mag-a``)."""
    stem = prefix.replace("-", "_")
    return name if stem and name.startswith(stem) else stem + name
