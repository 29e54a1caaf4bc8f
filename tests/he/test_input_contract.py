"""The input contract at the encrypted client (issue 30.5): HeSession.encrypt and `veil he encrypt` refuse an
array of the wrong shape, dtype, non-finite values or values outside the declared range (raw 0-16 digits for
a model trained on pixel / 16), naming the field, the expected and the received value; a correctly scaled
array is encrypted."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest
from veil.he.client import HeSession
from veil.he.contract import check_input, declared_range
from veil.he.envelope import open_envelope
from veil.he.errors import HEError, InputContractError
from veil.he.keys import SecretKeyring
from veil.he.params import CkksParameters

PARAMS = CkksParameters(8192, (60, 40, 60), 40)
# what `veil export he` writes for a digits checkpoint (training/uldnet/data.py load_digits_preset)
DIGITS = {"name": "x", "dtype": "float32", "shape": [1, 8, 8], "scale": "pixel / 16 (sklearn digits 0..16 -> [0, 1])",
          "normalization": "none", "range": [0.0, 1.0]}


def _raw_digits(n: int = 3) -> np.ndarray:
    from sklearn.datasets import load_digits

    return load_digits().images[:n, None].astype(np.float64)  # (n, 1, 8, 8), values 0..16


def test_raw_digits_are_refused_naming_the_field_and_the_range() -> None:
    with pytest.raises(InputContractError) as exc:
        check_input(_raw_digits(), DIGITS)
    message = str(exc.value)
    assert "input 'x'" in message and "values expected in [0, 1]" in message and "pixel / 16" in message
    assert "received values in [0, 16]" in message
    assert isinstance(exc.value, HEError) and exc.value.status_code == 400


def test_a_correctly_scaled_array_is_accepted_as_float64() -> None:
    x = (_raw_digits() / 16.0).astype(np.float32)
    out = check_input(x, DIGITS)
    assert out.dtype == np.float64 and out.shape == (3, 1, 8, 8) and np.array_equal(out, x)
    check_input(np.ones((1, 1, 8, 8), np.float32) + 1e-8, DIGITS)  # float32 rounding at the edge is no refusal
    check_input(np.zeros((2, 1, 8, 8), np.int64), DIGITS)  # ints and bools convert to float


@pytest.mark.parametrize(("x", "message"), [
    (np.zeros((1, 64)), r"shape expected \(B, 1, 8, 8\), received \(1, 64\)"),
    (np.zeros((1, 8, 8)), r"shape expected \(B, 1, 8, 8\), received \(1, 8, 8\) \(one sample: add the batch axis"),
    (np.zeros((0, 1, 8, 8)), r"batch expected >= 1 sample"),
    (np.full((1, 1, 8, 8), "a"), r"dtype expected a real number type convertible to float .*received <U1"),
    (np.zeros((1, 1, 8, 8), complex), r"dtype expected a real number type .*received complex128"),
    (np.array([[[[np.nan] * 8] * 8]]), r"values expected finite, received 64 non-finite \(first nan at index"),
    (-np.ones((1, 1, 8, 8)) / 4, r"values expected in \[0, 1\].*received values in \[-0.25, -0.25\] \(64 of 64 outside\)"),
])
def test_each_broken_rule_is_named(x: np.ndarray, message: str) -> None:
    with pytest.raises(InputContractError, match=message):
        check_input(x, DIGITS)


def test_declared_range_from_the_field_or_from_older_contracts_text() -> None:
    assert declared_range(DIGITS) == (0.0, 1.0)
    older = {k: v for k, v in DIGITS.items() if k != "range"}  # checkpoints exported before "range" existed
    assert declared_range(older) == (0.0, 1.0)
    assert declared_range({"scale": "pixel / 255 (values in [0, 1])", "normalization": "none"}) == (0.0, 1.0)
    photos = {"scale": "pixel / 255 (values in [0, 1]) before normalisation", "normalization": "per-sample"}
    assert declared_range(photos) is None  # standardised crops are not in [0, 1]
    assert declared_range({"scale": "as given", "normalization": "none"}) is None and declared_range(None) is None
    check_input(np.full((2, 6), 40.0), {"name": "x", "shape": [6], "scale": "as given", "normalization": "none"})


def _session_files(tmp_path: Path) -> tuple[Path, dict]:
    """A keyring and its KEYRING.json for a throughput layout of (1, 8, 8) digits (no server involved)."""
    ring = SecretKeyring.generate(PARAMS, [1])
    plan = {"mode": "throughput", "parameters": PARAMS.to_dict(), "batch_capacity": PARAMS.poly_modulus_degree // 2,
            "inputs": [{"name": "x", "shape": [1, 8, 8], "features": 64}], "outputs": [{"name": "y", "features": 10}]}
    he = {"parameters": PARAMS.to_dict(), "params_hash": PARAMS.hash(), "plan_hash": "p", "galois_steps": [1],
          "plan": plan, "input": DIGITS}
    path = tmp_path / "k.keyring"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a cleartext test keyring
        ring.save(path)
    (path.parent / "k.keyring.json").write_text(json.dumps(
        {"url": "http://127.0.0.1:1", "model": "digits-he", "key_id": "k" * 64, "key_secret": "s", "he": he}))
    return path, he


def test_session_and_cli_refuse_raw_digits_and_encrypt_scaled_ones(tmp_path: Path, capsys) -> None:
    from veil.cli import main

    keyring, _ = _session_files(tmp_path)
    session = HeSession.load(keyring)
    assert session.input_contract == DIGITS
    with pytest.raises(InputContractError, match=r"values expected in \[0, 1\]"):
        session.encrypt(_raw_digits())
    envelope = session.encrypt(_raw_digits() / 16.0)
    assert open_envelope(envelope, expect_kind="request").meta["batch"] == 3

    np.save(tmp_path / "raw.npy", _raw_digits().astype(np.float32))
    assert main(["he", "encrypt", "--keyring", str(keyring), "--input", str(tmp_path / "raw.npy"),
                 "--out", str(tmp_path / "request.bin")]) == 2
    err = capsys.readouterr().err
    assert "input 'x': values expected in [0, 1]" in err and "received values in [0, 16]" in err
    assert not (tmp_path / "request.bin").exists()  # nothing encrypted, nothing written
    np.save(tmp_path / "x.npy", (_raw_digits() / 16.0).astype(np.float32))
    assert main(["he", "encrypt", "--keyring", str(keyring), "--input", str(tmp_path / "x.npy"),
                 "--out", str(tmp_path / "request.bin")]) == 0
    assert json.loads(capsys.readouterr().out)["batch"] == 3 and (tmp_path / "request.bin").stat().st_size > 0


def test_model_he_carries_the_contract_from_the_metadata(monkeypatch) -> None:
    from veil.he import client

    metadata = {"parameters": {"he": {"mode": "latency"}, "veil": {"input": DIGITS}}}
    monkeypatch.setattr(client, "_request", lambda url, body=None, headers=None: (json.dumps(metadata).encode(), {}))
    assert HeSession.model_he("http://h", "m") == {"mode": "latency", "input": DIGITS}
    metadata["parameters"].pop("veil")  # a server that does not send the contract: nothing is invented
    assert HeSession.model_he("http://h", "m") == {"mode": "latency"}
