"""Range coding of bits with constriction: one stream per scale, probabilities quantised first.

``p(bit = 1)`` from the prior is quantised to an integer ``P`` in ``[1, 2^16 - 1]`` (so the float model output
only matters through that integer) and the coder sees ``P / 2^16``, clamped to ``[2^-16, 1 - 2^-16]``: a
rare bit costs at most 16 bits and never breaks the coder. Encoder and decoder quantise the same way.

constriction's range coder emits 32-bit words; a stream is stored as their big-endian bytes with trailing
bytes dropped as long as the decoder (which reads missing bytes as zeros) still returns the same bits, so a
short scale does not pay a whole word of termination.
"""

from __future__ import annotations

import math

import numpy as np
from constriction import stream

from .errors import BitstreamError

PRECISION = 16
ONE = 1 << PRECISION
_BERNOULLI = stream.model.Bernoulli(perfect=False)
# The cheapest a coded bit can be: -log2(1 - 2^-16) bits (the likelier value at the clamp), so a chunk of n bytes
# can carry at most (8 n + SLACK_BITS) / MIN_BIT_COST bits; what a stream's length can claim is bounded by it.
MIN_BIT_COST = -math.log2(1.0 - 1.0 / ONE)
# Slack of the information check: the range coder's output is at least the information it codes, less the
# trailing bytes :func:`encode_bits` drops while the zero-padded stream still decodes (each extra one only with
# probability ~2^-8), and constriction re-quantises the probabilities (relative differences ~1e-5).
SLACK_BITS = 64
SLACK_RATIO = 1.01


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


def decode_bits(data: bytes, q: np.ndarray, field: str = "chunk") -> np.ndarray:
    """Inverse of :func:`encode_bits`: uint8 bits of ``q``'s shape.

    Raises:
        BitstreamError: ``data`` is not a stream of these probabilities (the range decoder's own refusal, or more
            information decoded than ``data`` can carry): a corrupt chunk, or one read at the wrong image size.
    """
    probs = _model_probs(q)
    if probs.size == 0:
        return np.zeros(q.shape, np.uint8)
    try:
        bits = np.asarray(stream.queue.RangeDecoder(_words(data)).decode(_BERNOULLI, probs), np.uint8).reshape(q.shape)
    except (AssertionError, ValueError, RuntimeError) as exc:  # constriction's refusal of invalid data
        raise BitstreamError(field, f"expected range-coded data of this model, the decoder refused it ({exc}); "
                                    "the stream is corrupt") from None
    information = cross_entropy_bits(bits, q)
    if information > SLACK_RATIO * 8 * len(data) + SLACK_BITS:
        raise BitstreamError(field, f"decodes to {information:.0f} bits of information, more than its {len(data)} "
                                    "bytes can carry: the stream is corrupt, or its height/width are not those it "
                                    "was coded at")
    return bits


def max_coded_bits(nbytes: int) -> int:
    """The most bits a chunk of ``nbytes`` bytes can code, each at its cheapest (:data:`MIN_BIT_COST`)."""
    return int((SLACK_RATIO * 8 * nbytes + SLACK_BITS) / MIN_BIT_COST)


def cross_entropy_bits(bits: np.ndarray, q: np.ndarray) -> float:
    """The model's cost of ``bits`` in bits, ``sum -log2 p`` under the quantised probabilities the coder uses."""
    p1 = _model_probs(q)
    b = np.asarray(bits).reshape(-1)
    return float(-np.log2(np.where(b == 1, p1, 1.0 - p1)).sum())
