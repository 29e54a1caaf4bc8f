"""Client keys: encrypt/decrypt precision, evaluation keys that work and hold no secret, keyring files,
ciphertext serialization."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import numpy as np
import pytest
import tenseal.sealapi as sa
from veil.he import (
    EvaluationKeys,
    KeyringError,
    MalformedCiphertext,
    MalformedKeys,
    MismatchError,
    ParameterError,
    SecretKeyring,
    ciphertexts_from_bytes,
    ciphertexts_to_bytes,
)
from veil.he.keys import KEYRING_MAGIC
from veil.he.params import CkksParameters
from veil.he.serialize import seal_to_bytes

PARAMS = CkksParameters(8192, (60, 40, 40, 60), 40)
OTHER = CkksParameters(8192, (60, 40, 60), 40)


@pytest.fixture(scope="module")
def ring() -> SecretKeyring:
    return SecretKeyring.generate(PARAMS, [1, 2, -1])


def test_encrypt_decrypt_round_trip_precision(ring: SecretKeyring) -> None:
    rng = np.random.default_rng(0)
    short, full = rng.uniform(-8, 8, 100), rng.uniform(-1, 1, PARAMS.slots)
    out_short, out_full = ring.decrypt(ring.encrypt([short, full]))
    assert out_short.shape == (PARAMS.slots,)
    assert np.max(np.abs(out_short[:100] - short)) < 1e-6 * np.max(np.abs(short))
    assert np.max(np.abs(out_short[100:])) < 1e-6  # zero-padded
    assert np.max(np.abs(out_full - full)) < 1e-6


def test_encrypt_refuses_bad_vectors(ring: SecretKeyring) -> None:
    with pytest.raises(ParameterError, match=r"vectors\[0\].*4096"):
        ring.encrypt([np.zeros(PARAMS.slots + 1)])
    with pytest.raises(ParameterError, match=r"vectors\[1\].*1-D"):
        ring.encrypt([np.zeros(3), np.zeros((2, 2))])
    with pytest.raises(ParameterError, match="finite"):
        ring.encrypt([np.array([1.0, np.nan])])


def test_evaluation_keys_round_trip_and_hold_no_secret_key(ring: SecretKeyring) -> None:
    keys = ring.evaluation_keys()
    data = keys.to_bytes()
    secret = seal_to_bytes(ring._secret_key)
    assert secret not in data and secret[-4096:] not in data
    loaded = EvaluationKeys.from_bytes(data)
    assert loaded.params == PARAMS and loaded.galois_steps == (-1, 1, 2)
    assert loaded.key_id == keys.key_id and loaded.size_bytes == len(data)
    assert not hasattr(loaded, "_secret_key")


def test_round_tripped_evaluation_keys_rotate_and_square(ring: SecretKeyring) -> None:
    keys = EvaluationKeys.from_bytes(ring.evaluation_keys().to_bytes())
    x = np.linspace(-1, 1, PARAMS.slots)
    [ct] = ciphertexts_from_bytes(PARAMS, ring.encrypt_to_bytes([x]))
    ev, rotated = sa.Evaluator(PARAMS.seal_context()), sa.Ciphertext()
    ev.rotate_vector(ct, 1, keys.galois.key_for(1), rotated)
    ev.square_inplace(rotated)
    ev.relinearize_inplace(rotated, keys.relin)
    ev.rescale_to_next_inplace(rotated)
    [out] = ring.decrypt([rotated])
    assert np.max(np.abs(out - np.roll(x, -1) ** 2)) < 1e-5


def test_evaluation_keys_refuse_garbage_swaps_and_secret_keys(ring: SecretKeyring) -> None:
    data = ring.evaluation_keys().to_bytes()
    with pytest.raises(MalformedKeys, match="magic"):
        EvaluationKeys.from_bytes(b"not keys" * 20)
    with pytest.raises(MalformedKeys, match="sha256"):
        EvaluationKeys.from_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    keys = ring.evaluation_keys()
    with pytest.raises(MalformedKeys, match="relin"):  # a secret key in place of the relin keys
        EvaluationKeys(PARAMS, seal_to_bytes(ring._secret_key), [], [])
    [(steps, galois)] = keys._galois_parts
    with pytest.raises(MalformedKeys, match="relin"):  # galois keys in place of relin keys
        EvaluationKeys(PARAMS, galois, [], [])
    with pytest.raises(MalformedKeys, match="galois"):  # relin keys where 3 galois keys belong
        EvaluationKeys(PARAMS, keys._relin_bytes, [((1, 2, -1), keys._relin_bytes)], [1, 2, -1])
    with pytest.raises(MalformedKeys, match=r"missing steps \[3\]"):
        EvaluationKeys(PARAMS, keys._relin_bytes, [((1, 3, -1), galois)], [1, 3, -1])
    with pytest.raises(MalformedKeys, match="galois_groups"):  # groups that do not cover the stated steps
        EvaluationKeys(PARAMS, keys._relin_bytes, [(steps, galois)], [*steps, 3])
    with pytest.raises(MalformedKeys, match="relin"):  # keys of other parameters
        EvaluationKeys(OTHER, keys._relin_bytes, [], [])


def test_keyring_without_galois_steps_ships_relin_keys_only() -> None:
    keys = SecretKeyring.generate(OTHER, []).evaluation_keys()
    assert keys.galois is None and EvaluationKeys.from_bytes(keys.to_bytes()).galois_steps == ()
    with pytest.raises(ParameterError, match="galois_steps"):
        SecretKeyring.generate(OTHER, [0])


def test_keyring_file_plain_is_0600_and_round_trips(ring: SecretKeyring, tmp_path: Path) -> None:
    path = tmp_path / "client.veilkey"
    ring.save(path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert path.read_bytes().startswith(KEYRING_MAGIC)
    loaded = SecretKeyring.load(path)
    assert loaded.params == PARAMS and loaded.galois_steps == ring.galois_steps
    assert np.allclose(loaded.decrypt(ring.encrypt([np.ones(4)]))[0][:4], 1.0, atol=1e-6)


def test_keyring_file_with_passphrase(ring: SecretKeyring, tmp_path: Path) -> None:
    pytest.importorskip("cryptography")
    path = tmp_path / "client.veilkey"
    ring.save(path, passphrase="correct horse")
    assert seal_to_bytes(ring._secret_key)[-2048:] not in path.read_bytes()
    loaded = SecretKeyring.load(path, passphrase="correct horse")
    assert np.allclose(loaded.decrypt(ring.encrypt([np.ones(4)]))[0][:4], 1.0, atol=1e-6)
    with pytest.raises(KeyringError, match="wrong passphrase"):
        SecretKeyring.load(path, passphrase="battery staple")
    with pytest.raises(KeyringError, match="expected a passphrase"):
        SecretKeyring.load(path)


def test_ciphertexts_round_trip_and_seeded_ones_are_smaller(ring: SecretKeyring) -> None:
    x = np.arange(10.0)
    seeded = ring.encrypt_to_bytes([x, -x])
    plain = ciphertexts_to_bytes(ring.encrypt([x, -x]))
    assert len(seeded) < 0.6 * len(plain)
    for data in (seeded, plain):
        a, b = ring.decrypt(ciphertexts_from_bytes(PARAMS, data))
        assert np.allclose(a[:10], x, atol=1e-6) and np.allclose(b[:10], -x, atol=1e-6)
    assert ciphertexts_from_bytes(PARAMS, ciphertexts_to_bytes([])) == []


def test_ciphertexts_from_bytes_refuses_garbage_and_other_params(ring: SecretKeyring) -> None:
    data = ring.encrypt_to_bytes([np.ones(3)])
    with pytest.raises(MalformedCiphertext, match="magic"):
        ciphertexts_from_bytes(PARAMS, b"\x00" * 100)
    with pytest.raises(MalformedCiphertext, match="sha256"):
        ciphertexts_from_bytes(PARAMS, data[:-10])
    with pytest.raises(MalformedCiphertext, match=r"ciphertexts\[0\]: not a ciphertext for parameters"):
        ciphertexts_from_bytes(OTHER, data)
    other = SecretKeyring.generate(OTHER, [])
    with pytest.raises(MismatchError, match="cts"):
        ring.decrypt(other.encrypt([np.ones(3)]))


def test_ciphertexts_from_bytes_refuses_unrelinearized(ring: SecretKeyring) -> None:
    [ct] = ring.encrypt([np.ones(3)])
    sa.Evaluator(PARAMS.seal_context()).square_inplace(ct)  # 3 polynomials
    with pytest.raises(MalformedCiphertext, match="size: expected 2"):
        ciphertexts_from_bytes(PARAMS, ciphertexts_to_bytes([ct]))


@pytest.mark.parametrize("steps", [[1], [2, 5], [-3], [1, 2, -1], [-1, 4095]])
def test_galois_keys_rotate_by_every_requested_step(steps: list[int]) -> None:
    # Regression: sealapi's list[int] overloads take all-non-negative steps as Galois *elements*,
    # so [1] produced the identity key. Keys are now generated from elements.
    ring = SecretKeyring.generate(OTHER, steps)
    keys = EvaluationKeys.from_bytes(ring.evaluation_keys().to_bytes())
    x = np.arange(float(OTHER.slots))
    [ct] = ring.encrypt([x])
    ev = sa.Evaluator(OTHER.seal_context())
    for step in steps:
        out = sa.Ciphertext()
        ev.rotate_vector(ct, step, keys.galois.key_for(step), out)
        assert np.max(np.abs(ring.decrypt([out])[0] - np.roll(x, -step))) < 1e-5


# -- issue 19.5: the secret key never passes through a named file; scrypt bounded; no empty passphrase ----------
def test_keyring_save_and_load_never_create_a_named_scratch_file(ring: SecretKeyring, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    # before: the secret key was written to a file in /dev/shm (a kill there left a loadable secret key)
    import types

    from veil.he import sealbytes

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a named scratch file was created for a SEAL object")

    monkeypatch.setattr(sealbytes, "tempfile", types.SimpleNamespace(mkstemp=refuse, mkdtemp=refuse))
    monkeypatch.setattr(sealbytes, "_tmp_dir", None)
    path = tmp_path / "client.veilkey"
    ring.save(path)
    loaded = SecretKeyring.load(path)
    assert np.allclose(loaded.decrypt(ring.encrypt([np.ones(4)]))[0][:4], 1.0, atol=1e-6)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["client.veilkey"]


def test_keyring_file_is_created_0600_not_chmodded_after(ring: SecretKeyring, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    # before: written with the umask's mode, then chmod 0600: readable by others in between
    monkeypatch.setattr(os, "chmod", lambda *a, **k: (_ for _ in ()).throw(AssertionError("chmod after writing")))
    old = os.umask(0o022)
    try:
        ring.save(tmp_path / "client.veilkey")
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "client.veilkey").st_mode) == 0o600


def test_seal_from_bytes_refuses_trailing_bytes(ring: SecretKeyring) -> None:
    # SEAL ignores bytes after the length its header states; a section must carry nothing unparsed
    from veil.he.serialize import seal_from_bytes

    relin = ring.evaluation_keys()._relin_bytes
    with pytest.raises(ValueError, match="SEAL header"):
        seal_from_bytes(sa.RelinKeys(), PARAMS.seal_context(), relin + seal_to_bytes(ring._secret_key))
    with pytest.raises(MalformedKeys, match="relin"):
        EvaluationKeys(PARAMS, relin + b"\x00" * 64, [], [])


def _keyring_with(path: Path, **header_changes: object) -> None:
    from veil.he.keys import FORMAT_VERSION
    from veil.he.serialize import pack, unpack

    _, header, payload = unpack(path.read_bytes(), KEYRING_MAGIC, (FORMAT_VERSION,), KeyringError, "keyring")
    path.write_bytes(pack(KEYRING_MAGIC, FORMAT_VERSION, {**header, **header_changes}, payload))


@pytest.mark.parametrize(("scrypt", "match"), [
    ({"n": 2**70, "r": 8, "p": 1}, r"scrypt\.n expected an int in 1\.\.1048576"),
    ({"n": 2**20, "r": 16, "p": 1}, r"128·n·r <= 1073741824"),
    ({"n": 3000, "r": 8, "p": 1}, "power of two"),
    ({"n": 2**14, "r": 8, "p": 10**6}, r"scrypt\.p expected an int in 1\.\.16"),
    ({"n": 2**14, "r": 8}, "scrypt expected the fields"),
    ({"n": "16384", "r": 8, "p": 1}, r"scrypt\.n expected an int"),
], ids=["n-2e70", "memory-2GiB", "n-not-a-power-of-two", "p-1e6", "p-missing", "n-a-string"])
def test_keyring_load_bounds_scrypt_settings(ring: SecretKeyring, tmp_path: Path, scrypt: dict, match: str) -> None:
    # before: n = 2^70 raised a bare OverflowError, and n = 2^24 would take 16 GiB
    path = tmp_path / "client.veilkey"
    ring.save(path, passphrase="pw")
    _keyring_with(path, scrypt=scrypt)
    with pytest.raises(KeyringError, match=match):
        SecretKeyring.load(path, passphrase="pw")


def test_keyring_scrypt_default_and_empty_passphrase(ring: SecretKeyring, tmp_path: Path) -> None:
    from veil.he.keys import FORMAT_VERSION
    from veil.he.serialize import unpack

    path = tmp_path / "client.veilkey"
    with pytest.raises(KeyringError, match="non-empty"):
        ring.save(path, passphrase="")
    assert not path.exists()
    ring.save(path, passphrase="pw")
    _, header, _ = unpack(path.read_bytes(), KEYRING_MAGIC, (FORMAT_VERSION,), KeyringError, "keyring")
    assert header["scrypt"] == {"n": 2**17, "r": 8, "p": 1}
    with pytest.raises(KeyringError, match="non-empty"):
        SecretKeyring.load(path, passphrase="")


# -- issue 19.5: a key bundle carries only what veil parses ----------------------------------------------------
def test_evaluation_keys_refuse_unknown_header_fields(ring: SecretKeyring) -> None:
    from veil.he.keys import EVALUATION_KEYS_MAGIC, EVALUATION_KEYS_VERSION
    from veil.he.serialize import pack, unpack

    _, header, payload = unpack(ring.evaluation_keys().to_bytes(), EVALUATION_KEYS_MAGIC, (EVALUATION_KEYS_VERSION,),
                                MalformedKeys, "evaluation_keys")
    pasted = {**header, "secret_key": seal_to_bytes(ring._secret_key).hex()}
    with pytest.raises(MalformedKeys, match=r"unknown fields \['secret_key'\]"):
        EvaluationKeys.from_bytes(pack(EVALUATION_KEYS_MAGIC, EVALUATION_KEYS_VERSION, pasted, payload))
    del header["params_hash"]
    with pytest.raises(MalformedKeys, match=r"missing fields \['params_hash'\]"):
        EvaluationKeys.from_bytes(pack(EVALUATION_KEYS_MAGIC, EVALUATION_KEYS_VERSION, header, payload))
    for params in (5, {"poly_modulus_degree": 8192, "coeff_mod_bit_sizes": 7, "scale_bits": 40}):
        with pytest.raises(MalformedKeys, match="params"):  # before: a bare TypeError (500)
            EvaluationKeys.from_bytes(pack(EVALUATION_KEYS_MAGIC, EVALUATION_KEYS_VERSION, {**header, "params": params,
                                                                                   "params_hash": ""}, payload))


def test_max_bundle_bytes_bounds_real_bundles() -> None:
    # issue 19.1: the key-upload cap is computed from N, the chain and the step count
    from veil.he.galois import max_bundle_bytes

    for params, steps in ((PARAMS, [1, 2, -1]), (OTHER, []), (OTHER, [1, 2, 4, 8, 16, 32, 64])):
        actual = SecretKeyring.generate(params, steps).evaluation_keys().size_bytes
        limit = max_bundle_bytes(params, steps)
        assert actual <= limit < 1.6 * actual + 64 * 1024, (params, steps, actual, limit)


# -- issue 35.4: Galois keys in groups, one SEAL object each, never near SEAL's 2 GiB limit -------------------
def test_galois_groups_bound_each_object_and_keep_shared_elements_together() -> None:
    from veil.he.galois import GALOIS_GROUP_BYTES, galois_groups, switch_key_bytes

    per_key = switch_key_bytes(PARAMS)
    steps = [1, 2, 3, 4, 5, -1, PARAMS.slots - 1]  # -1 and slots - 1 are one Galois element
    groups = galois_groups(PARAMS, steps, group_bytes=2 * per_key)
    assert sorted(s for g in groups for s in g) == sorted(steps)
    assert all(len({s % PARAMS.slots for s in g}) <= 2 for g in groups)  # at most 2 distinct keys a group
    assert any({-1, PARAMS.slots - 1} <= set(g) for g in groups)
    assert galois_groups(PARAMS, steps) == [tuple(sorted(steps))]  # the default bound holds them in one
    # the deep model that broke (issue 35): ~38 keys at N = 32768 fit 256 MiB objects, each far below 2 GiB
    big = CkksParameters(32768, (60, *[40] * 18, 60), 40)
    sizes = [len({s % big.slots for s in g}) * switch_key_bytes(big) for g in galois_groups(big, list(range(1, 39)))]
    assert len(sizes) > 1 and max(sizes) <= GALOIS_GROUP_BYTES < 2**31 - 4096


def test_grouped_galois_keys_round_trip_rotate_and_report_progress(monkeypatch: pytest.MonkeyPatch) -> None:
    from veil.he import galois

    monkeypatch.setattr(galois, "GALOIS_GROUP_BYTES", 2 * galois.switch_key_bytes(PARAMS))
    calls: list[tuple[int, int]] = []
    ring = SecretKeyring.generate(PARAMS, [1, 2, 3, -1])
    keys = EvaluationKeys.from_bytes(ring.evaluation_keys(progress=lambda d, t: calls.append((d, t))).to_bytes())
    assert calls == [(1, 3), (2, 3), (3, 3)] and len(keys.galois.groups) == 2 and keys.galois.size() == 4
    x = np.arange(16, dtype=float)
    [ct] = ring.encrypt([x])
    ev = sa.Evaluator(PARAMS.seal_context())
    for step in (1, 2, 3, -1):
        out = sa.Ciphertext()
        ev.rotate_vector(ct, step, keys.galois.key_for(step), out)
        assert np.allclose(ring.decrypt([out])[0][:8], np.roll(np.pad(x, (0, PARAMS.slots - 16)), -step)[:8], atol=1e-3)
    with pytest.raises(MismatchError, match="rotation step 5"):
        keys.galois.key_for(5)


def test_version_1_bundles_with_one_galois_section_still_load(ring: SecretKeyring) -> None:
    from veil.he.keys import EVALUATION_KEYS_MAGIC, EVALUATION_KEYS_VERSION
    from veil.he.serialize import pack, unpack

    keys = ring.evaluation_keys()
    _, header, payload = unpack(keys.to_bytes(), EVALUATION_KEYS_MAGIC, (EVALUATION_KEYS_VERSION,), MalformedKeys,
                                "evaluation_keys")
    v1 = {k: v for k, v in header.items() if k != "galois_groups"}
    loaded = EvaluationKeys.from_bytes(pack(EVALUATION_KEYS_MAGIC, 1, v1, payload))
    assert loaded.galois_steps == keys.galois_steps and loaded.galois.size() == keys.galois.size()
    with pytest.raises(MalformedKeys, match="galois_groups"):  # groups that do not match the sections
        EvaluationKeys.from_bytes(pack(EVALUATION_KEYS_MAGIC, EVALUATION_KEYS_VERSION,
                                       {**header, "galois_groups": []}, payload))
