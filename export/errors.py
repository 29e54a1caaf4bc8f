"""veil.export's refusals: every exporter raises :class:`ExportError` (or its validation subclass)."""

from __future__ import annotations


class ExportError(ValueError):
    """A model cannot be exported as asked; the message names the module or field and the fix."""


class ExportValidationError(ExportError):
    """The exported graph disagrees with PyTorch beyond the tolerance (message says where)."""
