"""What a client's keyring leaves on disk (issue 31 items 11, 14, 16): the KEYRING.json sidecar holding the bearer
key secrets is 0600, a keyring saved without a passphrase warns, a malformed keyring field is a KeyringError, and a
server that is not running is one line."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
from veil.he.client import HeSession, ServerError
from veil.he.errors import KeyringError
from veil.he.keys import FORMAT_VERSION, KEYRING_MAGIC, CleartextKeyringWarning, SecretKeyring
from veil.he.params import CkksParameters
from veil.he.serialize import pack, unpack

PARAMS = CkksParameters(8192, (60, 40, 60), 40)


@pytest.fixture(scope="module")
def ring() -> SecretKeyring:
    return SecretKeyring.generate(PARAMS, [1])


def test_sidecar_with_the_key_secret_is_0600(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 31 item 11: KEYRING.json holds the bearer key_secret in the clear and was written 0644."""
    from veil.he import client

    he = {"parameters": PARAMS.to_dict(), "params_hash": PARAMS.hash(), "galois_steps": [1], "plan_hash": "p",
          "plan": {}}
    monkeypatch.setattr(HeSession, "model_he", staticmethod(lambda url, model: he))
    monkeypatch.setattr(client, "_request", lambda url, body=None, headers=None: (
        json.dumps({"key_id": "k" * 64, "key_secret": "bearer-secret"}).encode(), {}))
    with pytest.warns(CleartextKeyringWarning):
        HeSession.create("http://127.0.0.1:1", "m", tmp_path / "KEYRING", progress=False)
    sidecar = tmp_path / "KEYRING.json"
    assert "bearer-secret" in sidecar.read_text()
    assert sidecar.stat().st_mode & 0o777 == 0o600 and (tmp_path / "KEYRING").stat().st_mode & 0o777 == 0o600


def test_saving_without_a_passphrase_warns(ring: SecretKeyring, tmp_path: Path) -> None:
    """Issue 31 item 11: a keyring saved without a passphrase (its secret key in the clear) gave no warning."""
    with pytest.warns(CleartextKeyringWarning, match="without a passphrase, so the secret key is on disk in the clear"):
        ring.save(tmp_path / "plain")
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ring.save(tmp_path / "sealed", passphrase="correct horse")  # no warning with one


@pytest.mark.parametrize("steps", ["x", [1, "2"], [0], {"a": 1}, [10**9]])
def test_malformed_galois_steps_in_a_keyring_are_keyring_errors(ring: SecretKeyring, tmp_path: Path, steps) -> None:
    """Issue 31 item 14: a keyring with galois_steps "x" raised ParameterError instead of KeyringError."""
    with pytest.warns(CleartextKeyringWarning):
        ring.save(tmp_path / "ring")
    _, header, secret = unpack((tmp_path / "ring").read_bytes(), KEYRING_MAGIC, (FORMAT_VERSION,), KeyringError,
                               "keyring")
    (tmp_path / "bad").write_bytes(pack(KEYRING_MAGIC, FORMAT_VERSION, {**header, "galois_steps": steps}, secret))
    with pytest.raises(KeyringError, match="galois_steps"):
        SecretKeyring.load(tmp_path / "bad")


def test_keygen_against_no_server_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 31 item 16: `veil he keygen` against a server that is not running printed 65 lines of urllib."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # nothing listens here once closed
    with pytest.raises(ServerError, match=rf"127\.0\.0\.1:{port}/v2/models/m: expected a veil server answering"):
        HeSession.model_he(f"http://127.0.0.1:{port}", "m")
    from veil.cli import main

    assert main(["he", "keygen", "--server", f"http://127.0.0.1:{port}", "--model", "m", "--keyring",
                 "/nonexistent/KEYRING"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err and "expected a veil server answering" in err
