"""The closed plugin registry (:class:`Registry`) behind the adapter methods, optimizers and compression stages.

Needs only the standard library; a refusal is a :class:`RegistryError` (a :class:`veil.config.ConfigError`).
"""

from __future__ import annotations

import enum
import importlib
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Generic, TypeVar

from veil.config import ConfigError

V = TypeVar("V")


class RegistryError(ConfigError, KeyError):
    """A registry refused a name: outside its closed set, registered twice, or not lower case."""

    __str__ = Exception.__str__  # the message, not KeyError's repr of it


class Registry(Mapping[str, V], Generic[V]):
    """A closed registry of named plugins, the PEFT way (``register_peft_method``).

    The set of names is fixed when the registry is made; each name registers once; a name outside the set, a
    second registration and a name that is not lower case are refused with the known names (and, for a new
    name, where to add it) in the message. ``modules`` maps a name to the module whose import registers it, so
    an entry loads on first lookup and listing the names (:attr:`names`, e.g. for argparse ``choices``) imports
    nothing. It is a read-only mapping: iteration yields every name (as given: Enum members stay members), lookup (by
name or member) loads and returns its entry.

    Args:
        what: what a name is, as messages say it (``"optimizer"``, ``"method"``).
        names: the closed set (strings, or a ``str`` Enum's members).
        modules: ``{name: module}`` importing which registers the name (optional).
        where: where a new name must be added, for the refusal's fix (``"AdapterMethod in training/..."``).

    Example:
        >>> CODECS = Registry("codec", ["png", "jpeg"])
        >>> CODECS.register("png", PngCodec)
        >>> CODECS["webp"]   # RegistryError: codec: expected one of ['jpeg', 'png'], received 'webp'
    """

    def __init__(self, what: str, names: Iterable[str], modules: Mapping[str, str] | None = None,
                 where: str = "") -> None:
        self.what, self.where = what, where
        self._keys = tuple(names)  # as given: iteration yields a ``str`` Enum's members
        self._names = tuple(_registry_key(n) for n in self._keys)
        self._modules = dict(modules or {})
        self._entries: dict[str, V] = {}
        unknown = sorted(set(self._modules) - set(self._names))
        if len(set(self._names)) != len(self._names) or unknown:
            raise RegistryError(f"{what} registry: expected distinct names with modules among them, received "
                                f"names {list(self._names)}, modules for {sorted(self._modules)}")

    @property
    def names(self) -> tuple[str, ...]:
        """Every name of the closed set, in the order given; imports nothing."""
        return self._names

    def register(self, name: str, entry: V) -> V:
        """Register ``entry`` under ``name`` (once); returns ``entry``."""
        key = _registry_key(name)
        if key != key.lower():
            raise RegistryError(f"{self.what}: name: expected lower case, received {key!r}")
        if key not in self._names:
            fix = f"; add it to {self.where}" if self.where else ""
            raise RegistryError(f"{self.what}: expected one of {sorted(self._names)}, received {key!r}{fix}")
        if key in self._entries:
            raise RegistryError(f"{self.what}: {key!r} is already registered ({self._entries[key]!r}); "
                                "each name registers once")
        self._entries[key] = entry
        return entry

    def __getitem__(self, name: str) -> V:
        key = _registry_key(name)
        if key not in self._names:
            raise RegistryError(f"{self.what}: expected one of {sorted(self._names)}, received {name!r}")
        if key not in self._entries and key in self._modules:
            importlib.import_module(self._modules[key])
        if key not in self._entries:
            where = f"importing {self._modules[key]} did not register it" if key in self._modules else "nothing registered it"
            raise RegistryError(f"{self.what}: {key!r} is known but not registered ({where})")
        return self._entries[key]

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and _registry_key(name) in self._names

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._names)

    def __repr__(self) -> str:
        return f"Registry({self.what!r}, {list(self._names)})"


def _registry_key(name: Any) -> str:
    """A registry key: a ``str`` Enum member counts as its value."""
    return name.value if isinstance(name, enum.Enum) else name
