"""veil.he: CKKS parameters, keys, envelopes, key store, compiler and evaluation (TenSEAL). Never needs torch.

Model side: :func:`compile` (polynomial ONNX graph -> :class:`Plan`), :class:`PlanEvaluator` (runs it).
Client side: :func:`select_parameters` → :class:`SecretKeyring` (encrypt, decrypt, evaluation keys).
Server side: :class:`KeyStore` (register evaluation keys, get them by key id). Both sides wrap payloads
in envelopes (:func:`seal_envelope`, :func:`open_envelope`). Refusals are :class:`HEError` subclasses.
See docs/he.md.
"""

from veil.he.compile import CompileError, compile
from veil.he.envelope import Envelope, open_envelope, seal_envelope
from veil.he.errors import (
    EnvelopeError,
    ExpiredKey,
    HEError,
    KeyringError,
    MalformedCiphertext,
    MalformedKeys,
    MismatchError,
    ParameterError,
    QuotaExceeded,
    SecretKeyRefused,
    SecurityError,
    UnknownKey,
)
from veil.he.evaluate import PlanEvaluator
from veil.he.keys import EvaluationKeys, SecretKeyring
from veil.he.keystore import KeyStore
from veil.he.params import CkksParameters, describe, select_parameters
from veil.he.plan import Plan
from veil.he.serialize import ciphertexts_from_bytes, ciphertexts_to_bytes

__all__ = [
    "CkksParameters",
    "CompileError",
    "Envelope",
    "EnvelopeError",
    "EvaluationKeys",
    "ExpiredKey",
    "HEError",
    "KeyStore",
    "KeyringError",
    "MalformedCiphertext",
    "MalformedKeys",
    "MismatchError",
    "ParameterError",
    "Plan",
    "PlanEvaluator",
    "QuotaExceeded",
    "SecretKeyRefused",
    "SecretKeyring",
    "SecurityError",
    "UnknownKey",
    "ciphertexts_from_bytes",
    "ciphertexts_to_bytes",
    "compile",
    "describe",
    "open_envelope",
    "seal_envelope",
    "select_parameters",
]
