"""Client keys: a secret keyring that encrypts and decrypts, and the public evaluation keys it ships.

The secret key never leaves :class:`SecretKeyring`. The server gets :class:`EvaluationKeys`
(relinearization keys plus Galois keys for exactly the rotation steps the compiled model uses), in a
container whose only sections are those two. Both are generated and shipped *seeded* (SEAL
``Serializable``), which halves their bytes; the client encrypts with the secret key (symmetric CKKS), so
no public key is needed and :meth:`SecretKeyring.encrypt_to_bytes` ships seeded ciphertexts (½ size).

Never send decrypted values back to the server (Li–Micciancio, EUROCRYPT '21: CKKS key recovery).

Example:
    >>> import numpy as np
    >>> from veil.he import SecretKeyring, select_parameters
    >>> ring = SecretKeyring.generate(select_parameters(levels=2), galois_steps=[1])
    >>> server_keys = ring.evaluation_keys().to_bytes()           # send once; holds no secret key
    >>> [ct] = ring.encrypt([np.array([1.0, 2.0, 3.0])])
    >>> round(float(ring.decrypt([ct])[0][1]), 4)
    2.0
"""

from __future__ import annotations

import hashlib
import os
import warnings
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import tenseal.sealapi as sa
from veil.he.errors import HEError, KeyringError, MalformedKeys, MismatchError, ParameterError
from veil.he.galois import GaloisSet, galois_element, galois_groups, normalize_steps
from veil.he.params import CkksParameters
from veil.he.passphrase import SCRYPT, check_passphrase, fernet, scrypt_settings
from veil.he.serialize import (
    Buffer,
    check_fields,
    ciphertexts_to_bytes,
    pack,
    pack_parts,
    seal_from_bytes,
    seal_to_bytes,
    split_sections,
    unpack,
)

from veil.atomic import write_atomic

EVALUATION_KEYS_MAGIC = b"VEILEVK\x00"
KEYRING_MAGIC = b"VEILSK\x00\x00"
FORMAT_VERSION = 1  # the keyring file
# evaluation keys: 1 = one Galois section; 2 = Galois keys in groups (one SEAL object each), ``galois_groups``
EVALUATION_KEYS_VERSION = 2
EVALUATION_KEYS_VERSIONS = (1, EVALUATION_KEYS_VERSION)
_EVK_FIELDS = ("galois_steps", "lengths", "params", "params_hash", "sections")
_EVK_FIELDS_V2 = (*_EVK_FIELDS, "galois_groups")


class EvaluationKeys:
    """Public evaluation keys: relinearization keys and Galois keys for ``galois_steps``. No secret key.

    Attributes:
        params: the parameter set the keys belong to.
        relin: ``sa.RelinKeys``.
        galois: a :class:`GaloisSet` for ``galois_steps`` (one SEAL object per group of
            :func:`galois_groups`), or None when no rotation is needed.
        galois_steps: the rotation steps the Galois keys cover (sorted).
    """

    def __init__(self, params: CkksParameters, relin_bytes: Buffer,
                 galois_parts: Sequence[tuple[Sequence[int], Buffer]], galois_steps: Sequence[int]) -> None:
        self.params = params
        self.galois_steps = normalize_steps(params, galois_steps)
        self._relin_bytes: Buffer | None = relin_bytes
        self._galois_parts: list[tuple[list[int], Buffer | None]] = [
            (normalize_steps(params, steps), blob) for steps, blob in galois_parts]
        self._source: Path | None = None  # the file the bytes are read back from once released
        self._key_id: str | None = None
        self._size: int | None = None
        ctx = params.seal_context()
        self.relin = self._load(sa.RelinKeys(), ctx, relin_bytes, "relin")
        if self.relin.size() != 1 or not self.relin.has_key(2):
            raise MalformedKeys(f"evaluation_keys.relin: expected one relinearization key, received {self.relin.size()}")
        covered = [s for steps, _ in self._galois_parts for s in steps]
        if sorted(covered) != list(self.galois_steps):
            raise MalformedKeys(f"evaluation_keys.galois_groups: expected groups covering steps "
                                f"{list(self.galois_steps)} once each, received {covered[:64]}")
        self.galois: GaloisSet | None = None
        if self._galois_parts:
            groups = []
            for index, (steps, blob) in enumerate(self._galois_parts):
                keys = self._load(sa.GaloisKeys(), ctx, blob, f"galois[{index}]")
                missing = [s for s in steps if not keys.has_key(galois_element(params, s))]
                distinct = len({galois_element(params, s) for s in steps})  # -1 and slots-1 coincide
                if missing or keys.size() != distinct:
                    raise MalformedKeys(f"evaluation_keys.galois[{index}]: expected keys for steps {list(steps)}, "
                                        f"received {keys.size()} keys (missing steps {missing})")
                groups.append((steps, keys))
            self.galois = GaloisSet(params, groups)
        elif self.galois_steps:
            raise MalformedKeys(f"evaluation_keys.galois: expected keys for steps {list(self.galois_steps)}, received none")

    @staticmethod
    def _load(obj: Any, ctx: sa.SEALContext, data: bytes, name: str) -> Any:
        try:
            seal_from_bytes(obj, ctx, data)
        except Exception as exc:  # SEAL raises RuntimeError/ValueError subclasses for bad input
            raise MalformedKeys(f"evaluation_keys.{name}: not valid keys for these parameters "
                                f"({type(exc).__name__}: {exc})") from None
        if not sa.is_valid_for(obj, ctx):
            raise MalformedKeys(f"evaluation_keys.{name}: SEAL finds the keys invalid for these parameters")
        return obj

    def to_bytes(self) -> bytes:
        """The versioned container: magic, version 2, params JSON, steps, their groups, SHA-256, seeded SEAL
        sections (relin, then one per Galois group)."""
        return b"".join(self.to_parts())

    def to_parts(self) -> list[Buffer]:
        """:meth:`to_bytes` in pieces, none copied (hash or write a key set of hundreds of MiB without joining it).
        Keys whose bytes were released (:meth:`release_bytes`) read them back from their file.

        Raises:
            MalformedKeys: the released keys' file is gone or no longer holds these keys.
        """
        if self._source is not None:
            try:
                data = self._source.read_bytes()
            except OSError as exc:
                raise MalformedKeys(f"evaluation_keys: the file {self._source.name} these keys were read from is "
                                    f"gone ({type(exc).__name__})") from None
            if hashlib.sha256(data).hexdigest() != self.key_id:
                raise MalformedKeys(f"evaluation_keys: the file {self._source.name} no longer holds the keys "
                                    f"{self.key_id}")
            return [data]
        sections = [self._relin_bytes] + [blob for _, blob in self._galois_parts]
        header = {"params": self.params.to_dict(), "params_hash": self.params.hash(),
                  "galois_steps": list(self.galois_steps), "sections": ["relin"] + ["galois"] * len(self._galois_parts),
                  "galois_groups": [list(steps) for steps, _ in self._galois_parts],
                  "lengths": [len(s) for s in sections]}
        return pack_parts(EVALUATION_KEYS_MAGIC, EVALUATION_KEYS_VERSION, header, sections)

    def release_bytes(self, source: Path) -> None:
        """Drop the seeded bytes kept beside the parsed SEAL keys (half their size again); :meth:`to_bytes` reads
        them back from ``source``, a file holding exactly :meth:`to_bytes` (the key store's copy)."""
        if self._source is None:
            self._key_id, self._size = self.key_id, self.size_bytes  # computed while the bytes are here
            self._source = Path(source)
            self._relin_bytes = None
            self._galois_parts = [(steps, None) for steps, _ in self._galois_parts]
            _HELD[self._key_id] = self

    @staticmethod
    def held(key_id: str) -> EvaluationKeys | None:
        """This process's parsed keys of that id whose bytes stay in a file (:meth:`release_bytes`): a worker forked
        after they were parsed finds its parent's here, shared copy-on-write, instead of parsing their file again."""
        return _HELD.get(key_id)

    @property
    def source(self) -> Path | None:
        """The file the released bytes are read back from (None while they are held in memory)."""
        return self._source

    @classmethod
    def from_file(cls, path: Path, key_id: str | None = None) -> EvaluationKeys:
        """:meth:`from_bytes` of a file, holding only the parsed keys (their bytes stay in the file); with ``key_id``,
        a file whose SHA-256 differs (changed since it was registered) raises :class:`MalformedKeys`."""
        data = Path(path).read_bytes()
        if key_id is not None and hashlib.sha256(data).hexdigest() != key_id:
            raise MalformedKeys(f"evaluation_keys: the file {Path(path).name} no longer holds the keys {key_id}")
        keys = cls.from_bytes(data)
        keys.release_bytes(path)
        return keys

    @classmethod
    def from_bytes(cls, data: bytes) -> EvaluationKeys:
        """Parse and check :meth:`to_bytes` output (version 2, or version 1: one Galois section).

        Raises:
            MalformedKeys: bad container, unknown sections, keys not valid for the stated parameters.
            SecurityError, ParameterError: the stated parameters are refused.
        """
        version, header, payload = unpack(data, EVALUATION_KEYS_MAGIC, EVALUATION_KEYS_VERSIONS, MalformedKeys,
                                          "evaluation_keys", as_view=True)  # sections stay views into ``data``
        # nothing unparsed is ever stored
        check_fields(header, _EVK_FIELDS if version == 1 else _EVK_FIELDS_V2, MalformedKeys, "evaluation_keys")
        sections = header["sections"]
        if not isinstance(sections, list) or sections[:1] != ["relin"] or any(s != "galois" for s in sections[1:]) \
                or (version == 1 and len(sections) > 2):
            raise MalformedKeys(f"evaluation_keys.sections: expected ['relin'] then one 'galois' per group "
                                f"(version 1: at most one), received {str(sections)[:120]}")
        params = _parameters(header["params"], MalformedKeys, "evaluation_keys.params")
        if header["params_hash"] != params.hash():
            raise MalformedKeys(f"evaluation_keys.params_hash: expected {params.hash()}, "
                                f"received {str(header['params_hash'])[:80]!r}")
        blobs = split_sections(payload, header["lengths"], MalformedKeys, "evaluation_keys")
        if len(blobs) != len(sections):
            raise MalformedKeys(f"evaluation_keys.lengths: expected {len(sections)} entries, received {len(blobs)}")
        steps = header["galois_steps"]
        if not isinstance(steps, list) or len(steps) >= params.slots:
            raise MalformedKeys(f"evaluation_keys.galois_steps: expected a list of < {params.slots} steps, "
                                f"received {str(steps)[:80]}")
        groups = [steps] if version == 1 and len(blobs) > 1 else header.get("galois_groups", [])
        if not isinstance(groups, list) or len(groups) != len(blobs) - 1 or not all(isinstance(g, list) for g in groups):
            raise MalformedKeys(f"evaluation_keys.galois_groups: expected {len(blobs) - 1} lists of steps, "
                                f"received {str(groups)[:120]}")
        try:
            parts = [(normalize_steps(params, g), blob) for g, blob in zip(groups, blobs[1:], strict=True)]
        except ParameterError as exc:
            raise MalformedKeys(f"evaluation_keys.galois_groups: {exc}") from None
        return cls(params, blobs[0], parts, steps)

    @property
    def size_bytes(self) -> int:
        """Bytes of :meth:`to_bytes` (what the client uploads once)."""
        if self._size is None:
            self._size = sum(len(p) for p in self.to_parts())
        return self._size

    @property
    def key_id(self) -> str:
        """SHA-256 hex of :meth:`to_bytes`: the id the key store registers these keys under."""
        if self._key_id is None:
            digest = hashlib.sha256()
            for part in self.to_parts():
                digest.update(part)
            self._key_id = digest.hexdigest()
        return self._key_id


_HELD: weakref.WeakValueDictionary[str, EvaluationKeys] = weakref.WeakValueDictionary()  # key id -> held keys


class SecretKeyring:
    """The client's CKKS secret key, its parameters and rotation steps. Never leaves the client.

    Create with :meth:`generate` or :meth:`load`; ship :meth:`evaluation_keys` to the server.
    """

    def __init__(self, params: CkksParameters, secret_key: sa.SecretKey, galois_steps: Sequence[int]) -> None:
        self.params = params
        self.galois_steps = normalize_steps(params, galois_steps)
        ctx = params.seal_context()
        self._secret_key = secret_key
        self._encoder = sa.CKKSEncoder(ctx)
        self._encryptor = sa.Encryptor(ctx, secret_key)
        self._decryptor = sa.Decryptor(ctx, secret_key)
        self._evaluation_keys: EvaluationKeys | None = None

    @classmethod
    def generate(cls, params: CkksParameters, galois_steps: Sequence[int]) -> SecretKeyring:
        """A fresh secret key for ``params``; evaluation keys will cover ``galois_steps``."""
        return cls(params, sa.KeyGenerator(params.seal_context()).secret_key(), galois_steps)

    def evaluation_keys(self, progress: Callable[[int, int], None] | None = None) -> EvaluationKeys:
        """Seeded relinearization + Galois keys for this keyring's steps (generated once, then cached).

        Galois keys are generated group by group (:func:`galois_groups`, one SEAL object each, never near SEAL's
        2 GiB limit); ``progress(done, total)`` is called after each key object (relin first).
        """
        if self._evaluation_keys is None:
            keygen = sa.KeyGenerator(self.params.seal_context(), self._secret_key)
            groups = galois_groups(self.params, self.galois_steps)
            relin = seal_to_bytes(keygen.create_relin_keys())
            if progress:
                progress(1, 1 + len(groups))
            parts = []
            for index, steps in enumerate(groups):
                # Pass Galois elements, never steps: the bindings' list[int] overloads are ambiguous, and a list of
                # non-negative steps is silently taken as elements (step 1 would become the identity element 1).
                elements = sorted({galois_element(self.params, s) for s in steps})
                parts.append((steps, seal_to_bytes(keygen.create_galois_keys(elements))))
                if progress:
                    progress(index + 2, 1 + len(groups))
            self._evaluation_keys = EvaluationKeys(self.params, relin, parts, self.galois_steps)
        return self._evaluation_keys

    def _plaintext(self, vector: np.ndarray, index: int) -> sa.Plaintext:
        x = np.asarray(vector, dtype=np.float64)
        if x.ndim != 1 or x.size > self.params.slots:
            raise ParameterError(f"vectors[{index}]: expected a 1-D array of <= {self.params.slots} values, "
                                 f"received shape {x.shape}")
        if not np.all(np.isfinite(x)):
            raise ParameterError(f"vectors[{index}]: expected finite values, received NaN or inf")
        padded = np.zeros(self.params.slots)
        padded[:x.size] = x
        pt = sa.Plaintext()
        self._encoder.encode(padded.tolist(), self.params.scale, pt)
        return pt

    def encrypt(self, vectors: Sequence[np.ndarray]) -> list[sa.Ciphertext]:
        """One ciphertext per vector (zero-padded to ``slots``), at ``params.scale`` on the top level."""
        out = []
        for i, v in enumerate(vectors):
            ct = sa.Ciphertext()
            self._encryptor.encrypt_symmetric(self._plaintext(v, i), ct)
            out.append(ct)
        return out

    def encrypt_to_bytes(self, vectors: Sequence[np.ndarray]) -> bytes:
        """Like :meth:`encrypt`, serialized seeded (about half the bytes) for :func:`ciphertexts_from_bytes`."""
        return ciphertexts_to_bytes([self._encryptor.encrypt_symmetric(self._plaintext(v, i))
                                     for i, v in enumerate(vectors)])

    def decrypt(self, cts: Sequence[sa.Ciphertext]) -> list[np.ndarray]:
        """Decrypt and decode each ciphertext to ``slots`` float64 values.

        Raises:
            MismatchError: a ciphertext does not belong to this keyring's parameters.
        """
        ctx, out = self.params.seal_context(), []
        for i, ct in enumerate(cts):
            if not sa.is_valid_for(ct, ctx):
                raise MismatchError(f"cts[{i}]: expected a ciphertext for parameters {self.params.hash()[:12]}, "
                                    "received one that SEAL finds invalid for them")
            pt = sa.Plaintext()
            self._decryptor.decrypt(ct, pt)
            out.append(np.asarray(self._encoder.decode_double(pt), dtype=np.float64))
        return out

    def save(self, path: str | os.PathLike[str], passphrase: str | None = None) -> None:
        """Write the keyring atomically with mode 0600.

        With a passphrase the secret key is encrypted with Fernet (AES-128-CBC + HMAC-SHA256) under a
        scrypt-derived key (``cryptography`` package). **Without one the secret key is stored in the clear**:
        anyone who can read the file can decrypt everything encrypted under it. The secret key is
        serialized in memory (:mod:`veil.he.serialize`); only the finished file reaches the disk.

        Without a passphrase a :class:`CleartextKeyringWarning` is issued.

        Raises:
            KeyringError: an empty passphrase (pass None to store the key in the clear, knowingly).
        """
        check_passphrase(passphrase, "save")
        if passphrase is None:
            warnings.warn(f"keyring {os.fspath(path)}: saved without a passphrase, so the secret key is on disk in the "
                          "clear (mode 0600); pass a passphrase (veil he keygen --passphrase-env VAR) to encrypt it",
                          CleartextKeyringWarning, stacklevel=2)
        secret = seal_to_bytes(self._secret_key, secret=True)
        header: dict[str, Any] = {"params": self.params.to_dict(), "galois_steps": list(self.galois_steps),
                                  "protection": "none"}
        if passphrase is not None:
            salt = os.urandom(16)
            secret = fernet(passphrase, salt, SCRYPT).encrypt(secret)
            header.update(protection="fernet-scrypt", salt=salt.hex(), scrypt=SCRYPT)
        write_atomic(path, pack(KEYRING_MAGIC, FORMAT_VERSION, header, secret), mode=0o600)  # never readable by others

    @classmethod
    def load(cls, path: str | os.PathLike[str], passphrase: str | None = None) -> SecretKeyring:
        """Read a keyring written by :meth:`save`.

        Raises:
            KeyringError: malformed file (its parameters or galois_steps included), scrypt settings out of bounds,
                missing, empty or wrong passphrase.
        """
        check_passphrase(passphrase, "load")
        _, header, secret = unpack(Path(path).read_bytes(), KEYRING_MAGIC, (FORMAT_VERSION,), KeyringError, "keyring")
        if header.get("protection") == "fernet-scrypt":
            if passphrase is None:
                raise KeyringError(f"keyring {path}: expected a passphrase (the secret key is encrypted), received none")
            from cryptography.fernet import InvalidToken

            scrypt = scrypt_settings(header.get("scrypt"), path)
            try:
                salt = bytes.fromhex(header["salt"])
            except (KeyError, TypeError, ValueError):
                raise KeyringError(f"keyring {path}: salt expected hex bytes, received "
                                   f"{str(header.get('salt'))[:40]!r}") from None
            cipher = fernet(passphrase, salt, scrypt)
            try:
                secret = cipher.decrypt(secret)
            except InvalidToken:
                raise KeyringError(f"keyring {path}: wrong passphrase") from None
        elif header.get("protection") != "none":
            raise KeyringError(f"keyring.protection: expected 'none' or 'fernet-scrypt', "
                               f"received {header.get('protection')!r}")
        params = _parameters(header.get("params"), KeyringError, f"keyring {path}: params")
        try:
            secret_key = seal_from_bytes(sa.SecretKey(), params.seal_context(), secret, secret=True)
        except Exception as exc:  # SEAL raises RuntimeError/ValueError subclasses for bad input
            raise KeyringError(f"keyring {path}: secret key does not load ({type(exc).__name__}: {exc})") from None
        try:
            return cls(params, secret_key, header.get("galois_steps", []))
        except ParameterError as exc:  # a keyring file's fields are its format's: say so (issue 31 item 14)
            raise KeyringError(f"keyring {path}: {exc}") from None


class CleartextKeyringWarning(UserWarning):
    """A keyring was saved without a passphrase: its secret key is on disk in the clear (mode 0600)."""


def _parameters(data: Any, error: type[HEError], what: str) -> CkksParameters:
    """``CkksParameters.from_dict`` for untrusted JSON: wrong types become ``error``, not a TypeError."""
    if not isinstance(data, dict) or not isinstance(data.get("coeff_mod_bit_sizes"), list):
        raise error(f"{what}: expected a JSON object with a list coeff_mod_bit_sizes, received {str(data)[:120]}")
    return CkksParameters.from_dict(data)
