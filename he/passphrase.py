"""A keyring file's passphrase protection: Fernet keyed by scrypt(passphrase), with bounded scrypt settings.

:class:`~veil.he.keys.SecretKeyring` saves its secret key under it; the settings a file states are bounded so that
a crafted keyring cannot exhaust time or memory on load.
"""

from __future__ import annotations

import base64
import os
from typing import Any

from veil.he.errors import KeyringError

SCRYPT = {"n": 2**17, "r": 8, "p": 1}  # 128 MiB, ~0.5 s per derivation (current guidance: n >= 2^17)
# What a keyring file may ask scrypt for: n a power of two up to 2^20, 128·n·r bytes of memory up to 1 GiB.
SCRYPT_MAX = {"n": 2**20, "r": 32, "p": 16}
SCRYPT_MAX_MEMORY = 2**30


def check_passphrase(passphrase: str | None, verb: str) -> None:
    if passphrase is not None and (not isinstance(passphrase, str) or not passphrase):
        raise KeyringError(f"keyring {verb}: passphrase expected a non-empty string (or None to keep the secret key "
                           f"in the clear), received {'an empty string' if passphrase == '' else type(passphrase).__name__}")


def scrypt_settings(scrypt: Any, path: str | os.PathLike[str]) -> dict[str, int]:
    """scrypt settings read from a keyring file, bounded so a crafted file cannot exhaust time or memory."""
    if not isinstance(scrypt, dict) or set(scrypt) != set(SCRYPT):
        raise KeyringError(f"keyring {path}: scrypt expected the fields {sorted(SCRYPT)}, received {str(scrypt)[:80]}")
    for name, most in SCRYPT_MAX.items():
        value = scrypt[name]
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= most:
            raise KeyringError(f"keyring {path}: scrypt.{name} expected an int in 1..{most}, received {str(value)[:40]}")
    n, r = scrypt["n"], scrypt["r"]
    if n < 2 or n & (n - 1):
        raise KeyringError(f"keyring {path}: scrypt.n expected a power of two >= 2, received {n}")
    if 128 * n * r > SCRYPT_MAX_MEMORY:
        raise KeyringError(f"keyring {path}: scrypt expected 128·n·r <= {SCRYPT_MAX_MEMORY} bytes of memory, "
                           f"received n={n}, r={r} ({128 * n * r} bytes)")
    return dict(scrypt)


def fernet(passphrase: str, salt: bytes, scrypt: dict[str, int]) -> Any:
    """Fernet keyed by scrypt(passphrase); needs the ``cryptography`` package."""
    try:
        from cryptography.fernet import Fernet
        from cryptography.hazmat.primitives.kdf.scrypt import Scrypt
    except ImportError:
        raise KeyringError("passphrase protection needs the `cryptography` package: pip install cryptography") from None
    key = Scrypt(salt=salt, length=32, n=scrypt["n"], r=scrypt["r"], p=scrypt["p"]).derive(passphrase.encode())
    return Fernet(base64.urlsafe_b64encode(key))
