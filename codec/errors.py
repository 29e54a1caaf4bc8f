"""The codec's refusals: one class per kind, each naming the field, the expected and the received value."""

from __future__ import annotations


class CodecError(ValueError):
    """Base of every veil.codec refusal (the engine answers 4xx with its message)."""


class BitstreamError(CodecError):
    """A stream that is corrupt, truncated, of another format version or made by another model."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"bitstream {field}: {message}")
        self.field = field


class ImageError(CodecError):
    """An image in a format the codec does not read, or of an unsupported size."""


class ImageTooLarge(ImageError):
    """An image with more pixels (or a longer side) than the codec accepts."""


class BudgetExceeded(ImageTooLarge):
    """An image or stream whose coding would need more memory than the runtime's budget (``max_decode_mb``)."""
