"""Range coding of bits with constriction: one stream per scale, probabilities quantised first.

``p(bit = 1)`` from the prior is quantised to an integer ``P`` in ``[1, 2^16 - 1]`` (so the float model output
only matters through that integer) and the coder sees ``P / 2^16``, clamped to ``[2^-16, 1 - 2^-16]``: a
rare bit costs at most 16 bits and never breaks the coder. Encoder and decoder quantise the same way.

constriction's range coder emits 32-bit words; a stream is stored as their big-endian bytes with trailing
bytes dropped as long as the decoder (which reads missing bytes as zeros) still returns the same bits, so a
short scale does not pay a whole word of termination.
"""

from __future__ import annotations

import numpy as np
from constriction import stream

PRECISION = 16
ONE = 1 << PRECISION
_BERNOULLI = stream.model.Bernoulli(perfect=False)


def quantize_probs(p1: np.ndarray) -> np.ndarray:
    """float p(bit = 1) -> int64 numerators over 2^16 in [1, 2^16 - 1] (round half to even, deterministic)."""
    p1 = np.asarray(p1, np.float64)
    if not np.all(np.isfinite(p1)):
        raise ValueError("probabilities: expected finite values, received NaN or inf")
    return np.clip(np.rint(p1 * ONE), 1, ONE - 1).astype(np.int64)


def _model_probs(q: np.ndarray) -> np.ndarray:
    return (q.astype(np.float64) / ONE).reshape(-1)


def _words(data: bytes) -> np.ndarray:
    padded = data + b"\0" * (-len(data) % 4)
    return np.frombuffer(padded, dtype=">u4").astype(np.uint32)


def encode_bits(bits: np.ndarray, q: np.ndarray) -> bytes:
    """Range-code ``bits`` (0/1, any shape) under quantised probabilities ``q`` (same shape) into one stream."""
    bits = np.asarray(bits, np.int32).reshape(-1)
    probs = _model_probs(q)
    if bits.shape != probs.shape:
        raise ValueError(f"bits and probabilities: expected the same length, received {bits.size} and {probs.size}")
    encoder = stream.queue.RangeEncoder()
    if bits.size:
        encoder.encode(bits, _BERNOULLI, probs)
    data = encoder.get_compressed().astype(">u4").tobytes()
    # drop trailing bytes while the stream still decodes to the same bits (the decoder pads with zeros)
    while data and _decodes_to(data[:-1], bits, probs):
        data = data[:-1]
    return data


def _decodes_to(data: bytes, bits: np.ndarray, probs: np.ndarray) -> bool:
    try:
        return bool(np.array_equal(stream.queue.RangeDecoder(_words(data)).decode(_BERNOULLI, probs), bits))
    except (ValueError, RuntimeError, AssertionError):
        return False


def decode_bits(data: bytes, q: np.ndarray) -> np.ndarray:
    """Inverse of :func:`encode_bits`: uint8 bits of ``q``'s shape."""
    probs = _model_probs(q)
    if probs.size == 0:
        return np.zeros(q.shape, np.uint8)
    bits = stream.queue.RangeDecoder(_words(data)).decode(_BERNOULLI, probs)
    return np.asarray(bits, np.uint8).reshape(q.shape)


def cross_entropy_bits(bits: np.ndarray, q: np.ndarray) -> float:
    """The model's cost of ``bits`` in bits, ``sum -log2 p`` under the quantised probabilities the coder uses."""
    p1 = _model_probs(q)
    b = np.asarray(bits).reshape(-1)
    return float(-np.log2(np.where(b == 1, p1, 1.0 - p1)).sum())
