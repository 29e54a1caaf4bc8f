"""veil.he: CKKS parameters, keys, envelopes, key store, compiler and evaluation (TenSEAL). Never needs torch.

Model side: :func:`compile` (polynomial ONNX graph -> :class:`Plan`), :class:`PlanEvaluator` (runs it).
Client side: :func:`select_parameters` → :class:`SecretKeyring` (encrypt, decrypt, evaluation keys).
Server side: :class:`KeyStore` (register evaluation keys, get them by key id). Both sides wrap payloads
in envelopes (:func:`seal_envelope`, :func:`open_envelope`). Refusals are :class:`HEError` subclasses.
See docs/he.md.

The client path imports only numpy, tenseal and cryptography (``pip install 'veil[client]'``): the model-side
names below (the compiler needs onnx, plans on disk need safetensors) load on first use (PEP 562).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from veil.he.envelope import Envelope, open_envelope, seal_envelope
from veil.he.errors import (
    CompileError,
    EnvelopeError,
    EvaluationFailed,
    ExpiredKey,
    HEError,
    InputContractError,
    KeyAccessDenied,
    KeyringError,
    MalformedCiphertext,
    MalformedKeys,
    MismatchError,
    ParameterError,
    QuotaExceeded,
    SecretKeyRefused,
    SecurityError,
    TooManyCiphertexts,
    UnknownKey,
)
from veil.he.keys import EvaluationKeys, SecretKeyring
from veil.he.keystore import KeyStore
from veil.he.params import CkksParameters, describe, select_parameters
from veil.he.serialize import ciphertexts_from_bytes, ciphertexts_to_bytes

if TYPE_CHECKING:
    from veil.he.compiler import compile
    from veil.he.evaluate import PlanEvaluator
    from veil.he.plan import Plan
    from veil.he.rounds import RoundError
    from veil.he.segments import SegmentedPlan, compile_segmented

# model-side names -> the module that holds them, imported when first asked for
_LAZY = {"compile": "veil.he.compiler", "PlanEvaluator": "veil.he.evaluate", "Plan": "veil.he.plan",
         "RoundError": "veil.he.rounds", "SegmentedPlan": "veil.he.segments", "compile_segmented": "veil.he.segments"}

__all__ = [
    "CkksParameters",
    "CompileError",
    "Envelope",
    "EnvelopeError",
    "EvaluationFailed",
    "EvaluationKeys",
    "ExpiredKey",
    "HEError",
    "InputContractError",
    "KeyAccessDenied",
    "KeyStore",
    "KeyringError",
    "MalformedCiphertext",
    "MalformedKeys",
    "MismatchError",
    "ParameterError",
    "Plan",
    "PlanEvaluator",
    "QuotaExceeded",
    "RoundError",
    "SecretKeyRefused",
    "SecretKeyring",
    "SecurityError",
    "SegmentedPlan",
    "TooManyCiphertexts",
    "UnknownKey",
    "ciphertexts_from_bytes",
    "ciphertexts_to_bytes",
    "compile",
    "compile_segmented",
    "describe",
    "open_envelope",
    "seal_envelope",
    "select_parameters",
]


def __getattr__(name: str) -> Any:
    """Load a model-side name (:data:`_LAZY`) on first use, so the client path never imports onnx."""
    if name not in _LAZY:
        raise AttributeError(f"module 'veil.he' has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))

