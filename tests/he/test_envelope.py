"""Envelopes: round trip, and refusal of every mismatch and corruption with the field named."""

from __future__ import annotations

import struct

import pytest
from veil.he import EnvelopeError, HEError, open_envelope, seal_envelope
from veil.he.envelope import ENVELOPE_MAGIC
from veil.he.serialize import pack

FIELDS = {"kind": "inputs", "key_id": "a" * 64, "params_hash": "p" * 64, "plan_hash": "m" * 64}


def _blob(payload: bytes = b"\x00ciphertext\xff" * 50) -> bytes:
    return seal_envelope(payload, **FIELDS, meta={"shape": [1, 784], "request": "r1"})


def test_round_trip() -> None:
    env = open_envelope(_blob(), expect_kind="inputs", expect_key_id="a" * 64, expect_params_hash="p" * 64,
                        expect_plan_hash="m" * 64)
    assert env.payload == b"\x00ciphertext\xff" * 50
    assert (env.kind, env.key_id, env.params_hash, env.plan_hash) == tuple(FIELDS.values())
    assert env.meta == {"shape": [1, 784], "request": "r1"} and env.version == 1
    assert open_envelope(seal_envelope(b"", **FIELDS)).payload == b""


@pytest.mark.parametrize("field", ["kind", "key_id", "params_hash", "plan_hash"])
def test_each_mismatch_is_refused_naming_field_expected_received(field: str) -> None:
    with pytest.raises(EnvelopeError, match=rf"envelope\.{field}: expected 'other', received '{FIELDS[field]}'"):
        open_envelope(_blob(), **{f"expect_{field}": "other"})


@pytest.mark.parametrize("position", [20, 50, -1])
def test_any_flipped_byte_is_refused(position: int) -> None:
    data = bytearray(_blob())
    data[position] ^= 0x01
    with pytest.raises(EnvelopeError):
        open_envelope(bytes(data))


def test_corruption_cases_name_what_is_wrong() -> None:
    data = _blob()
    with pytest.raises(EnvelopeError, match="magic"):
        open_envelope(b"XXXXXXXX" + data[8:])
    with pytest.raises(EnvelopeError, match="version: expected one of \\[1\\], received 9"):
        open_envelope(data[:8] + struct.pack(">H", 9) + data[10:])
    with pytest.raises(EnvelopeError, match="sha256"):
        open_envelope(data[:-1])
    with pytest.raises(EnvelopeError, match="at least"):
        open_envelope(b"VEIL")
    with pytest.raises(EnvelopeError, match="header_length"):
        open_envelope(data[:10] + struct.pack(">I", 10**9) + data[14:])
    with pytest.raises(EnvelopeError, match="expected bytes"):
        open_envelope("text")  # type: ignore[arg-type]


def test_well_checksummed_but_inconsistent_headers_are_refused() -> None:
    with pytest.raises(EnvelopeError, match="payload_length"):
        open_envelope(pack(ENVELOPE_MAGIC, 1, {**FIELDS, "meta": {}, "payload_length": 5}, b"abc"))
    with pytest.raises(EnvelopeError, match="key_id: expected a string"):
        open_envelope(pack(ENVELOPE_MAGIC, 1, {**FIELDS, "key_id": 3, "meta": {}, "payload_length": 0}))
    with pytest.raises(EnvelopeError, match="meta"):
        open_envelope(pack(ENVELOPE_MAGIC, 1, {**FIELDS, "meta": [], "payload_length": 0}))


def test_seal_refuses_bad_fields() -> None:
    with pytest.raises(EnvelopeError, match="kind"):
        seal_envelope(b"x", **{**FIELDS, "kind": ""})
    with pytest.raises(EnvelopeError, match="meta"):
        seal_envelope(b"x", **FIELDS, meta={"bad": object()})
    with pytest.raises(EnvelopeError, match="payload"):
        seal_envelope("x", **FIELDS)  # type: ignore[arg-type]
    assert issubclass(EnvelopeError, HEError) and EnvelopeError.status_code == 400
