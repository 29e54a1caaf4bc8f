"""Server key store: register/get, LRU, TTL expiry, quota, and refusal of anything holding a secret key."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
import tenseal as ts
from veil.he import (
    ExpiredKey,
    KeyStore,
    MalformedKeys,
    QuotaExceeded,
    SecretKeyRefused,
    SecretKeyring,
    SecurityError,
    UnknownKey,
)
from veil.he.keys import EVALUATION_KEYS_MAGIC, EvaluationKeys
from veil.he.params import CkksParameters
from veil.he.serialize import pack

PARAMS = CkksParameters(8192, (60, 40, 60), 40)


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def rings() -> list[SecretKeyring]:
    return [SecretKeyring.generate(PARAMS, steps) for steps in ([1], [2], [])]


@pytest.fixture(scope="module")
def key_bytes(rings: list[SecretKeyring]) -> list[bytes]:
    return [r.evaluation_keys().to_bytes() for r in rings]


def _store(tmp_path: Path, clock: Clock | None = None, **kwargs: float) -> KeyStore:
    settings = {"quota_bytes": 10**8, "ttl_seconds": 3600.0, "memory_items": 2, **kwargs}
    return KeyStore(tmp_path / "keys", clock=clock or Clock(), **settings)  # type: ignore[arg-type]


def test_register_and_get(tmp_path: Path, rings: list[SecretKeyring], key_bytes: list[bytes],
                          caplog: pytest.LogCaptureFixture) -> None:
    store = _store(tmp_path)
    with caplog.at_level(logging.INFO, logger="veil.he.keystore"):
        key_id = store.register(key_bytes[0])
    assert key_id == rings[0].evaluation_keys().key_id
    assert store.register(key_bytes[0]) == key_id  # idempotent
    keys = store.get(key_id)
    assert isinstance(keys, EvaluationKeys) and keys.galois_steps == (1,)
    assert store.usage()["keys"] == 1 and store.usage()["bytes"] == len(key_bytes[0])
    assert all(len(r.message) < 200 for r in caplog.records)  # ids and sizes, never key material
    fresh = _store(tmp_path)  # a restarted server reads the keys back from disk
    assert fresh.get(key_id).galois_steps == (1,)


def test_lru_keeps_memory_items_and_reloads_from_disk(tmp_path: Path, key_bytes: list[bytes]) -> None:
    store = _store(tmp_path, memory_items=2)
    ids = [store.register(b) for b in key_bytes]
    assert store.usage()["in_memory"] == 2 and store.usage()["keys"] == 3
    first = store.get(ids[0])  # evicted earlier: parsed again from disk
    assert first.galois_steps == (1,) and store.get(ids[0]) is first
    assert store.usage()["in_memory"] == 2


def test_unknown_and_deleted_keys(tmp_path: Path, key_bytes: list[bytes]) -> None:
    store = _store(tmp_path)
    with pytest.raises(UnknownKey, match="no evaluation keys"):
        store.get("0" * 64)
    with pytest.raises(UnknownKey, match="64 lowercase hex"):
        store.get("../../etc/passwd")
    key_id = store.register(key_bytes[0])
    store.delete(key_id)
    with pytest.raises(UnknownKey):
        store.get(key_id)
    with pytest.raises(UnknownKey):
        store.delete(key_id)
    assert UnknownKey.http_status == 404


def test_ttl_expiry_deletes_files_and_reregistration_renews(tmp_path: Path, key_bytes: list[bytes]) -> None:
    clock = Clock()
    store = _store(tmp_path, clock, ttl_seconds=60.0)
    old, renewed = store.register(key_bytes[0]), store.register(key_bytes[1])
    clock.now += 50
    store.register(key_bytes[1])  # restarts its TTL
    clock.now += 20
    with pytest.raises(ExpiredKey, match=r"expired after 60\.0 s"):
        store.get(old)
    assert not (tmp_path / "keys" / f"{old}.evk").exists()
    assert store.get(renewed).galois_steps == (2,)
    clock.now += 100
    assert store.usage()["keys"] == 0  # purged
    assert ExpiredKey.http_status == 410


def test_quota(tmp_path: Path, key_bytes: list[bytes]) -> None:
    store = _store(tmp_path, quota_bytes=len(key_bytes[0]) + len(key_bytes[2]) + 10)
    store.register(key_bytes[0])
    with pytest.raises(QuotaExceeded, match="more bytes"):
        store.register(key_bytes[1])
    store.register(key_bytes[2])
    with pytest.raises(QuotaExceeded, match="at most"):
        _store(tmp_path / "small", quota_bytes=1000).register(key_bytes[0])
    assert QuotaExceeded.http_status == 413 and store.usage()["keys"] == 2


def test_refuses_a_tenseal_context_with_a_secret_key(tmp_path: Path) -> None:
    ctx = ts.context(ts.SCHEME_TYPE.CKKS, 8192, coeff_mod_bit_sizes=[60, 40, 40, 60])
    store = _store(tmp_path)
    with pytest.raises(SecretKeyRefused, match="secret key"):
        store.register(ctx.serialize(save_secret_key=True))
    with pytest.raises(MalformedKeys, match="public TenSEAL context"):
        store.register(ctx.serialize(save_secret_key=False))
    assert store.usage()["keys"] == 0 and not list((tmp_path / "keys").iterdir())
    assert SecretKeyRefused.http_status == 403


def test_refuses_a_veil_keyring(tmp_path: Path, rings: list[SecretKeyring]) -> None:
    path = tmp_path / "client.veilkey"
    rings[0].save(path)
    with pytest.raises(SecretKeyRefused, match="secret keyring"):
        _store(tmp_path).register(path.read_bytes())


def test_refuses_malformed_and_insecure_payloads(tmp_path: Path, key_bytes: list[bytes]) -> None:
    store = _store(tmp_path)
    with pytest.raises(MalformedKeys, match="expected veil evaluation keys"):
        store.register(b"\x00garbage" * 100)
    with pytest.raises(MalformedKeys, match="sha256"):
        store.register(key_bytes[0][:-5])
    insecure = {"params": {"poly_modulus_degree": 8192, "coeff_mod_bit_sizes": [60, 40, 40, 40, 60],
                           "scale_bits": 40},
                "params_hash": "", "galois_steps": [], "sections": ["relin"], "lengths": [0]}
    with pytest.raises(SecurityError, match="log2 Q <= 218"):
        store.register(pack(EVALUATION_KEYS_MAGIC, 1, insecure))
    with pytest.raises(MalformedKeys, match="expected bytes"):
        store.register("text")  # type: ignore[arg-type]


def test_stored_keys_evaluate(tmp_path: Path, rings: list[SecretKeyring], key_bytes: list[bytes]) -> None:
    import tenseal.sealapi as sa

    store = _store(tmp_path)
    keys = store.get(store.register(key_bytes[0]))
    [ct] = rings[0].encrypt([np.arange(4.0)])
    out = sa.Ciphertext()
    sa.Evaluator(PARAMS.seal_context()).rotate_vector(ct, 1, keys.galois, out)
    assert np.allclose(rings[0].decrypt([out])[0][:3], [1.0, 2.0, 3.0], atol=1e-6)
