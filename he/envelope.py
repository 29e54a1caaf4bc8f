"""Versioned, checksummed envelopes that bind an HE payload to its key, parameters and plan.

Every ciphertext payload crossing the network travels in an envelope (after Encompute's design): the
header names the payload ``kind`` (e.g. ``"inputs"``, ``"outputs"``), the registered ``key_id``, the
parameter hash and the compiled plan hash, so a server never evaluates a ciphertext under the wrong keys,
parameters or model, and a client never decrypts a result meant for another request.

Layout: the container of :mod:`veil.he.serialize` with magic ``VEILENV\\0``: magic | version | header
length | SHA-256(header + payload) | JSON header | payload.

Example:
    >>> from veil.he.envelope import seal_envelope, open_envelope
    >>> blob = seal_envelope(b"ct", kind="inputs", key_id="k", params_hash="p", plan_hash="m")
    >>> open_envelope(blob, expect_kind="inputs", expect_key_id="k").payload
    b'ct'
"""

from __future__ import annotations

import dataclasses
from typing import Any

from veil.he.errors import EnvelopeError
from veil.he.serialize import pack, unpack

ENVELOPE_MAGIC = b"VEILENV\x00"
ENVELOPE_VERSION = 1
_FIELDS = ("kind", "key_id", "params_hash", "plan_hash")


@dataclasses.dataclass(frozen=True)
class Envelope:
    """An opened envelope.

    Args:
        kind (str): what the payload is (``"inputs"``, ``"outputs"``, ...).
        key_id (str): the key store id of the evaluation keys the payload is encrypted for.
        params_hash (str): :meth:`CkksParameters.hash` of the payload's parameters.
        plan_hash (str): hash of the compiled HE plan (model) the payload is meant for.
        meta (dict): free JSON metadata, never key material: ``batch``; for a model run in refresh rounds
            (:mod:`veil.he.segments`) a request's ``round``, ``plan_hash`` (the combined hash), ``key_ids``
            (round 0) or ``request_id`` (later rounds), and a result's ``round``, ``rounds``, ``final``,
            ``request_id``.
        payload (bytes): the ciphertext bytes.
        version (int): the envelope format version it was read with.
    """

    kind: str
    key_id: str
    params_hash: str
    plan_hash: str
    meta: dict[str, Any]
    payload: bytes
    version: int = ENVELOPE_VERSION


def seal_envelope(payload: bytes, *, kind: str, key_id: str, params_hash: str, plan_hash: str,
                  meta: dict[str, Any] | None = None) -> bytes:
    """Wrap ``payload`` in an envelope bound to kind, key, parameters and plan.

    Raises:
        EnvelopeError: a field is not a non-empty string, or meta is not a JSON object.
    """
    fields = {"kind": kind, "key_id": key_id, "params_hash": params_hash, "plan_hash": plan_hash}
    for name, value in fields.items():
        if not isinstance(value, str) or not value:
            raise EnvelopeError(f"envelope.{name}: expected a non-empty string, received {value!r}")
    if meta is not None and not isinstance(meta, dict):
        raise EnvelopeError(f"envelope.meta: expected a dict, received {type(meta).__name__}")
    if not isinstance(payload, (bytes, bytearray)):
        raise EnvelopeError(f"envelope.payload: expected bytes, received {type(payload).__name__}")
    header = {**fields, "meta": meta or {}, "payload_length": len(payload)}
    try:
        return pack(ENVELOPE_MAGIC, ENVELOPE_VERSION, header, bytes(payload))
    except TypeError as exc:
        raise EnvelopeError(f"envelope.meta: expected JSON-serializable values ({exc})") from None


def open_envelope(data: bytes, *, expect_kind: str | None = None, expect_key_id: str | None = None,
                  expect_params_hash: str | None = None, expect_plan_hash: str | None = None) -> Envelope:
    """Verify and open an envelope; every ``expect_*`` that is not None must match.

    Raises:
        EnvelopeError: bad magic, version, checksum or header, or a field that differs from its
            expectation (the message names the field, the expected and the received value).
    """
    version, header, payload = unpack(data, ENVELOPE_MAGIC, (ENVELOPE_VERSION,), EnvelopeError, "envelope")
    for name in _FIELDS:
        if not isinstance(header.get(name), str):
            raise EnvelopeError(f"envelope.{name}: expected a string, received {header.get(name)!r}")
    if header.get("payload_length") != len(payload):
        raise EnvelopeError(f"envelope.payload_length: expected {len(payload)}, "
                            f"received {header.get('payload_length')!r}")
    if not isinstance(header.get("meta"), dict):
        raise EnvelopeError(f"envelope.meta: expected a JSON object, received {header.get('meta')!r}")
    expected = {"kind": expect_kind, "key_id": expect_key_id, "params_hash": expect_params_hash,
                "plan_hash": expect_plan_hash}
    for name, want in expected.items():
        if want is not None and header[name] != want:
            raise EnvelopeError(f"envelope.{name}: expected {want!r}, received {header[name]!r}")
    return Envelope(kind=header["kind"], key_id=header["key_id"], params_hash=header["params_hash"],
                    plan_hash=header["plan_hash"], meta=header["meta"], payload=payload, version=version)
