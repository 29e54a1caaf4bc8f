"""Imports deferred to first use: :func:`import_object` (a ``"module:name"`` string to the object) and
:func:`lazy_exports` (PEP 562 ``__getattr__`` / ``__dir__`` for a room's ``__init__``), so that a CLI's
``--help`` and the HE client never import torch or onnx. Needs only the standard library.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Mapping
from typing import Any


def import_object(target: str, default: str | None = None) -> Any:
    """The object ``"module:name"`` names (``"module"`` alone: its ``default`` attribute), imported on call: how a
    verb table or a registry names code it must not import before it runs."""
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name or default or "")


def lazy_exports(package: str, exports: Mapping[str, str]) -> tuple[Any, Any]:
    """PEP 562 ``__getattr__`` and ``__dir__`` for a package whose public names load on first use.

    A room's ``__init__`` that imported every submodule made each CLI's ``--help`` import torch (issue 24:
    1.4-2.4 s); with this, ``import veil.training.uldnet.config`` stays as light as that module. ``exports`` maps
    a public name to the submodule defining it (``{"train_uldnet": ".trainer"}``; a name that is the submodule
    itself, ``{"lora": ".lora"}``, gives the module).

    Example:
        >>> __getattr__, __dir__ = lazy_exports(__name__, {"PolyNorm": ".polynorm"})
    """
    module = sys.modules[package]

    def __getattr__(name: str) -> Any:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        loaded = importlib.import_module(exports[name], package)
        value = loaded if exports[name].rpartition(".")[2] == name else getattr(loaded, name)
        setattr(module, name, value)  # later lookups skip __getattr__
        return value

    def __dir__() -> list[str]:
        return sorted(set(module.__dict__) | set(exports))

    return __getattr__, __dir__
