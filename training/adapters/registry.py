"""The closed registry of adapter methods: ``AdapterMethod`` lists every method, ``METHODS`` maps it to classes.

Each method's ``__init__.py`` calls :func:`register_method` once. Names outside the enum, names that are not
lower case and second registrations are refused with the fix in the message (the PEFT pattern,
``huggingface/peft:src/peft/utils/peft_types.py``; the helper is :class:`veil.registry.Registry`, shared with the
optimizers and the compression stages). A lookup imports the method's package if nothing imported it yet.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING

from veil.lazy import import_object
from veil.registry import Registry

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
    """What a registered method provides: its config class and its model (injector) class.

    The model class may be given as ``"module:Class"``: a method package then registers without importing its
    torch layers, so parsers built from the configs (``veil finetune --help``) stay torch-free (issue 24).
    """

    method: AdapterMethod
    config_cls: type[AdapterConfig]
    model: type[AdapterModel] | str

    @property
    def model_cls(self) -> type[AdapterModel]:
        return import_object(self.model) if isinstance(self.model, str) else self.model


METHODS: Registry[MethodEntry] = Registry(
    "method", AdapterMethod, modules={m.value: f"veil.training.adapters.{m.value}" for m in AdapterMethod},
    where="AdapterMethod in training/adapters/registry.py")


def register_method(*, name: str, config_cls: type[AdapterConfig], model_cls: type[AdapterModel] | str) -> None:
    """Register one adapter method (called from the method package's ``__init__``); ``model_cls`` is the class or
    its ``"module:Class"`` path (imported on first use).

    Raises:
        veil.registry.RegistryError: ``name`` is not lower case, not an ``AdapterMethod`` member, or already
            registered (a ``ValueError``).
    """
    METHODS.register(name, MethodEntry(AdapterMethod(name) if name in METHODS else name, config_cls, model_cls))


def get_method(name: str | AdapterMethod) -> MethodEntry:
    """The registry entry of ``name`` (its package imported on first use); an unknown name is an error listing
    the known ones."""
    return METHODS[name]
