"""Property-based fuzzing of the HE parsers an outsider reaches (issue 19, "Fuzzing in CI"): envelopes, key
bundles (and the key store's register), ciphertext containers, keyring files.

Each property feeds mutated, truncated, re-packed (checksum recomputed, so parsing goes past the checksum)
and random inputs, and asserts that only a ``veil.he.HEError`` subclass ever escapes: no bare
RuntimeError/TypeError/OverflowError, no hang. Inputs are bounded in size and the examples per property in
count (a few seconds each); no deadline (timing never decides a test on a shared machine).
The HTTP side (4xx, server keeps serving) is fuzzed in tests/engine/test_he_serving.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from veil.he.envelope import ENVELOPE_MAGIC, ENVELOPE_VERSION, open_envelope, seal_envelope
from veil.he.errors import HEError
from veil.he.keys import (
    EVALUATION_KEYS_MAGIC,
    EVALUATION_KEYS_VERSION,
    FORMAT_VERSION,
    KEYRING_MAGIC,
    EvaluationKeys,
    SecretKeyring,
)
from veil.he.keystore import KeyStore
from veil.he.params import CkksParameters
from veil.he.serialize import CIPHERTEXTS_MAGIC, CIPHERTEXTS_VERSION, ciphertexts_from_bytes, pack, unpack

PARAMS = CkksParameters(8192, (60, 40, 60), 40)
FUZZ = settings(max_examples=80, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

JSON = st.recursive(st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | st.text(max_size=20),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                    max_leaves=12)


@pytest.fixture(scope="module")
def ring() -> SecretKeyring:
    return SecretKeyring.generate(PARAMS, [1])


@pytest.fixture(scope="module")
def bundle(ring: SecretKeyring) -> bytes:
    return ring.evaluation_keys().to_bytes()


@pytest.fixture(scope="module")
def cts(ring: SecretKeyring) -> bytes:
    return ring.encrypt_to_bytes([np.arange(4.0), -np.arange(4.0)])


@st.composite
def mutated(draw: st.DrawFn, data: bytes) -> bytes:
    """``data`` with a few bytes flipped, then maybe truncated or extended."""
    out = bytearray(data)
    for _ in range(draw(st.integers(0, 4))):
        i = draw(st.integers(0, len(out) - 1))
        out[i] = draw(st.integers(0, 255))
    if draw(st.booleans()):
        out = out[:draw(st.integers(0, len(out)))]
    return bytes(out) + draw(st.binary(max_size=16))


def repacked(data: bytes, magic: bytes, version: int, header_edit: dict[str, Any] | None = None,
             drop: str | None = None, payload_flips: list[tuple[int, int]] = ()) -> bytes:
    """``data`` re-packed with a header edit and payload flips under a recomputed, valid checksum."""
    _, header, payload = unpack(data, magic, (version,), HEError, "fuzz")
    header = {**header, **(header_edit or {})}
    header.pop(drop, None)
    body = bytearray(payload)
    for i, b in payload_flips:
        if body:
            body[i % len(body)] = b
    return pack(magic, version, header, bytes(body))


def only_he_errors(parse, data: bytes) -> Any:
    """Run ``parse(data)``: it may succeed or raise an HEError; anything else fails the property."""
    try:
        return parse(data)
    except HEError:
        return None


FLIPS = st.lists(st.tuples(st.integers(0, 2**20), st.integers(0, 255)), max_size=4)


# -- envelopes ------------------------------------------------------------------------------------------------
ENVELOPE = seal_envelope(b"\x01ciphertext" * 20, kind="request", key_id="k" * 64, params_hash="p" * 64,
                         plan_hash="m" * 64, meta={"batch": 2})


@FUZZ
@given(data=mutated(ENVELOPE))
def test_mutated_envelopes(data: bytes) -> None:
    only_he_errors(lambda d: open_envelope(d, expect_kind="request"), data)


@FUZZ
@given(field=st.sampled_from(["kind", "key_id", "params_hash", "plan_hash", "meta", "payload_length", "extra"]),
       value=JSON, drop=st.none() | st.sampled_from(["kind", "meta", "payload_length"]), flips=FLIPS)
def test_repacked_envelopes(field: str, value: Any, drop: str | None, flips: list[tuple[int, int]]) -> None:
    data = repacked(ENVELOPE, ENVELOPE_MAGIC, ENVELOPE_VERSION, {field: value}, drop, flips)
    env = only_he_errors(lambda d: open_envelope(d, expect_kind="request", expect_key_id="k" * 64), data)
    if env is not None:  # whatever opens is well-formed
        assert isinstance(env.meta, dict) and isinstance(env.payload, bytes) and env.key_id == "k" * 64


@FUZZ
@given(body=st.binary(max_size=200), head_len=st.integers(0, 2**32 - 1))
def test_random_containers_with_the_right_magic(body: bytes, head_len: int) -> None:
    import hashlib
    import struct

    prefix = struct.pack(">8sHI32s", ENVELOPE_MAGIC, ENVELOPE_VERSION, head_len, hashlib.sha256(body).digest())
    only_he_errors(open_envelope, prefix + body)


def test_deeply_nested_and_huge_number_headers_are_envelope_errors() -> None:
    # json.loads raises RecursionError and ValueError (over 4300 digits) for these: they must stay HEErrors
    import hashlib
    import struct

    for head in (b"[" * 100_000, b"1" * 5000, b"\xff\xfe"):
        prefix = struct.pack(">8sHI32s", ENVELOPE_MAGIC, ENVELOPE_VERSION, len(head), hashlib.sha256(head).digest())
        with pytest.raises(HEError, match="header"):
            open_envelope(prefix + head)


# -- key bundles ----------------------------------------------------------------------------------------------
@FUZZ
@given(data=st.data())
def test_mutated_key_bundles(bundle: bytes, data: st.DataObject) -> None:
    only_he_errors(EvaluationKeys.from_bytes, data.draw(mutated(bundle)))


@FUZZ
@given(field=st.sampled_from(["params", "params_hash", "galois_steps", "galois_groups", "sections", "lengths",
                              "secret_key"]),
       value=JSON, drop=st.none() | st.sampled_from(["params", "lengths", "galois_steps"]), flips=FLIPS)
def test_repacked_key_bundles(bundle: bytes, field: str, value: Any, drop: str | None,
                              flips: list[tuple[int, int]]) -> None:
    data = repacked(bundle, EVALUATION_KEYS_MAGIC, EVALUATION_KEYS_VERSION, {field: value}, drop, flips)
    keys = only_he_errors(EvaluationKeys.from_bytes, data)
    if keys is not None:  # accepted: then it is exactly a valid bundle's content, nothing more
        assert field != "secret_key" and drop is None
        assert EvaluationKeys.from_bytes(keys.to_bytes()).key_id == keys.key_id


@FUZZ
@given(data=st.data())
def test_key_store_register_refuses_only_with_he_errors(bundle: bytes, tmp_path_factory: pytest.TempPathFactory,
                                                         data: st.DataObject) -> None:
    store = KeyStore(tmp_path_factory.mktemp("fuzz-keys"), quota_bytes=10**8, ttl_seconds=60)
    payload = data.draw(st.one_of(mutated(bundle), st.binary(max_size=300),
                                  st.builds(lambda tail: EVALUATION_KEYS_MAGIC + tail, st.binary(max_size=100))))
    reg = only_he_errors(store.register, payload)
    assert store.usage()["keys"] == (0 if reg is None else 1)


# -- ciphertext containers ------------------------------------------------------------------------------------
@FUZZ
@given(data=st.data())
def test_mutated_ciphertext_containers(cts: bytes, data: st.DataObject) -> None:
    only_he_errors(lambda d: ciphertexts_from_bytes(PARAMS, d, max_count=4, fresh=True), data.draw(mutated(cts)))


@FUZZ
@given(field=st.sampled_from(["count", "lengths", "extra"]), value=JSON, flips=FLIPS)
def test_repacked_ciphertext_containers(cts: bytes, field: str, value: Any, flips: list[tuple[int, int]]) -> None:
    data = repacked(cts, CIPHERTEXTS_MAGIC, CIPHERTEXTS_VERSION, {field: value}, None, flips)
    out = only_he_errors(lambda d: ciphertexts_from_bytes(PARAMS, d, max_count=4, fresh=True), data)
    if out is not None:
        assert len(out) <= 4 and all(ct.size() == 2 and ct.is_ntt_form() for ct in out)


@FUZZ
@given(flips=st.lists(st.tuples(st.integers(0, 2**20), st.integers(0, 255)), min_size=1, max_size=6))
def test_ciphertext_sections_corrupted_under_a_valid_checksum(cts: bytes, flips: list[tuple[int, int]]) -> None:
    # flips land in SEAL's own bytes (its header, parms id, compressed data): SEAL must refuse, never crash
    data = repacked(cts, CIPHERTEXTS_MAGIC, CIPHERTEXTS_VERSION, payload_flips=flips)
    only_he_errors(lambda d: ciphertexts_from_bytes(PARAMS, d, fresh=True), data)


# -- keyring files (the client's own file, still parsed defensively) ------------------------------------------
@FUZZ
@given(data=st.data())
def test_mutated_keyring_files(ring: SecretKeyring, tmp_path_factory: pytest.TempPathFactory,
                               data: st.DataObject) -> None:
    folder = tmp_path_factory.mktemp("fuzz-ring")
    path = folder / "k.keyring"
    ring.save(path)
    original = path.read_bytes()
    if data.draw(st.booleans()):
        blob = data.draw(mutated(original))
    else:
        field = data.draw(st.sampled_from(["params", "galois_steps", "protection", "salt", "scrypt"]))
        blob = repacked(original, KEYRING_MAGIC, FORMAT_VERSION, {field: data.draw(JSON)})
    Path(path).write_bytes(blob)
    only_he_errors(lambda p: SecretKeyring.load(p, passphrase=None), path)
