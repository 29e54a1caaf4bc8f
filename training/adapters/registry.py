"""The closed registry of adapter methods: ``AdapterMethod`` lists every method, ``METHODS`` maps it to classes.

Each method's ``__init__.py`` calls :func:`register_method` once. Names outside the enum, names that are not
lower case and second registrations are refused with the fix in the message (the PEFT pattern,
``huggingface/peft:src/peft/utils/peft_types.py``).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .config import AdapterConfig
    from .model import AdapterModel


class AdapterMethod(str, enum.Enum):
    """Every adapter method veil knows. Add a member here before registering a new method."""

    LORA = "lora"
    PSOFT = "psoft"
    MTLORA = "mtlora"
    E2LORA = "e2lora"
    LORAMIXER = "loramixer"
    VAPT = "vapt"


@dataclass(frozen=True)
class MethodEntry:
    """What a registered method provides: its config class and its model (injector) class."""

    method: AdapterMethod
    config_cls: type[AdapterConfig]
    model_cls: type[AdapterModel]


METHODS: dict[AdapterMethod, MethodEntry] = {}


def register_method(*, name: str, config_cls: type[AdapterConfig], model_cls: type[AdapterModel]) -> None:
    """Register one adapter method (called from the method package's ``__init__``).

    Raises:
        ValueError: ``name`` is not lower case, not an ``AdapterMethod`` member, or already registered.
    """
    if name != name.lower():
        raise ValueError(f"register_method: name: expected lower case, received {name!r}")
    try:
        method = AdapterMethod(name)
    except ValueError:
        raise ValueError(f"register_method: name: expected one of {[m.value for m in AdapterMethod]}, "
                         f"received {name!r}; add it to AdapterMethod in training/adapters/registry.py") from None
    if method in METHODS:
        raise ValueError(f"register_method: name: {name!r} is already registered "
                         f"(by {METHODS[method].config_cls.__name__}); each method registers once")
    METHODS[method] = MethodEntry(method, config_cls, model_cls)


def get_method(name: str | AdapterMethod) -> MethodEntry:
    """The registry entry of ``name``; an unknown or unregistered name is an error listing the known ones."""
    try:
        method = AdapterMethod(name)
    except ValueError:
        raise ValueError(f"method: expected one of {[m.value for m in AdapterMethod]}, received {name!r}") from None
    if method not in METHODS:
        raise ValueError(f"method: {method.value!r} is in AdapterMethod but not registered; "
                         f"import veil.training.adapters.{method.value} (its __init__ registers it)")
    return METHODS[method]
