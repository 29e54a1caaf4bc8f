"""One exception per refusal of ``veil.he``; each docstring names the HTTP status it maps to.

Every class derives from :class:`HEError` (a ``ValueError``) and carries that status as ``status_code`` (as the engine's errors do),
so the engine registers one handler for the base class and returns the OIP body ``{"error": str(exc)}``.
Messages name the field, the expected value and the received value; they never contain key material.
"""

from __future__ import annotations


class HEError(ValueError):
    """Base of every ``veil.he`` refusal. HTTP 400 unless a subclass says otherwise."""

    status_code = 400


class SecurityError(HEError):
    """Parameters below 128-bit security (HE-standard table or SEAL's own check). HTTP 400."""


class ParameterError(HEError):
    """Ill-formed CKKS parameters (chain shape, prime sizes) or an infeasible request. HTTP 400."""


class MalformedCiphertext(HEError):
    """Ciphertext bytes that do not parse, or do not belong to the expected parameters. HTTP 400."""


class EnvelopeError(HEError):
    """An envelope with a wrong magic, version, checksum, kind, key id, parameter or plan hash. HTTP 400."""


class MismatchError(HEError):
    """Parameters, level or scale of an object differ from what the operation expects. HTTP 400."""


class MalformedKeys(HEError):
    """Evaluation-key bytes that do not parse or are not valid for their parameters. HTTP 400."""


class SecretKeyRefused(HEError):
    """A payload sent to the server holds a secret key; it is refused and never stored. HTTP 403."""

    status_code = 403


class KeyAccessDenied(HEError):
    """The key secret given for a key id is missing or wrong (each key set has an owner). HTTP 403."""

    status_code = 403


class UnknownKey(HEError):
    """No evaluation keys are registered under this key id. HTTP 404."""

    status_code = 404


class ExpiredKey(HEError):
    """The evaluation keys under this key id outlived the store's TTL and were deleted. HTTP 410."""

    status_code = 410


class QuotaExceeded(HEError):
    """Storing these evaluation keys would exceed the key store's byte quota. HTTP 413."""

    status_code = 413


class TooManyCiphertexts(HEError):
    """A request carries more ciphertexts than the model's layout takes in one evaluation. HTTP 413."""

    status_code = 413


class CompileError(HEError):
    """An ONNX graph the HE compiler cannot lower (a non-polynomial op, an unsupported layout). HTTP 400.

    Raised by the compiler (:mod:`veil.he.compiler`) and the lowerings it calls (:mod:`veil.he.latency`,
    :mod:`veil.he.attention`); it lives here so they need not import the compiler back.
    """


class EvaluationFailed(HEError):
    """SEAL refused to evaluate ciphertexts that passed every check (the client's ciphertexts). HTTP 400."""


class InputContractError(HEError):
    """An input array that breaks the model's declared input contract (shape, dtype, finite values, value range),
    refused on the client before it is encrypted (:mod:`veil.he.contract`). HTTP 400."""


class KeyringError(HEError):
    """A secret keyring file that is malformed, or a missing or wrong passphrase (client side). HTTP 400."""
