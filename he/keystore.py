"""Server-side store of clients' evaluation keys: content-addressed, quota-bound, expiring, LRU-cached.

A client registers its :class:`~veil.he.keys.EvaluationKeys` bytes once and gets back a ``key_id`` (the
SHA-256 of those bytes); requests then carry the key id. The store refuses anything holding a secret key
(a veil keyring, a private TenSEAL context), keys over the byte quota and malformed keys; keys expire
``ttl_seconds`` after their last registration. Logs carry key ids and sizes only, never key material.

Example:
    >>> store = KeyStore(Path("/var/lib/veil/keys"), quota_bytes=2**30, ttl_seconds=86400)
    >>> key_id = store.register(evaluation_key_bytes)         # doctest: +SKIP
    >>> keys = store.get(key_id)                               # doctest: +SKIP
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from veil.he.errors import ExpiredKey, MalformedKeys, QuotaExceeded, SecretKeyRefused, UnknownKey
from veil.he.keys import EVALUATION_KEYS_MAGIC, KEYRING_MAGIC, EvaluationKeys

from veil.config import write_atomic

log = logging.getLogger(__name__)
_KEY_ID = re.compile(r"^[0-9a-f]{64}$")
_SUFFIX = ".evk"


def refuse_foreign_formats(data: bytes) -> None:
    """Refuse payloads that are not veil evaluation keys, loudly when they hold a secret key.

    Raises:
        SecretKeyRefused: a veil secret keyring, or a TenSEAL context that has a secret key.
        MalformedKeys: a public TenSEAL context (unsupported: send veil evaluation keys) or anything else.
    """
    if data.startswith(EVALUATION_KEYS_MAGIC):
        return
    if data.startswith(KEYRING_MAGIC):
        raise SecretKeyRefused("register: received a veil secret keyring; send only "
                               "SecretKeyring.evaluation_keys().to_bytes(), never the secret key")
    import tenseal as ts

    try:
        context = ts.context_from(data)
    except Exception:  # TenSEAL raises various types for non-protobuf input: not a TenSEAL context
        raise MalformedKeys(f"register: expected veil evaluation keys (magic {EVALUATION_KEYS_MAGIC!r}), "
                            f"received {len(data)} bytes starting {data[:8]!r}") from None
    if context.has_secret_key() or context.is_private():
        raise SecretKeyRefused("register: received a TenSEAL context holding a secret key; it was not stored. "
                               "Never send the secret key: send veil evaluation keys instead")
    raise MalformedKeys("register: unsupported format: a public TenSEAL context; send veil evaluation keys "
                        "(SecretKeyring.evaluation_keys().to_bytes()), which carry only the Galois steps needed")


class KeyStore:
    """Evaluation keys on disk under ``root``, with a byte quota, a TTL and an in-memory LRU.

    Args:
        root: folder holding one ``<key_id>.evk`` file per registered key set.
        quota_bytes: the most bytes all stored key sets may take together.
        ttl_seconds: seconds a key set lives after its last registration.
        memory_items: parsed key sets kept in memory (least recently used evicted first).
        clock: the time source (seconds); tests pass a fake one.
    """

    def __init__(self, root: Path, quota_bytes: int, ttl_seconds: float, memory_items: int = 8,
                 clock: Callable[[], float] = time.time) -> None:
        if quota_bytes <= 0 or ttl_seconds <= 0 or memory_items < 0:
            raise ValueError(f"KeyStore: expected quota_bytes > 0, ttl_seconds > 0, memory_items >= 0, received "
                             f"{quota_bytes}, {ttl_seconds}, {memory_items}")
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.quota_bytes, self.ttl_seconds, self.memory_items = quota_bytes, ttl_seconds, memory_items
        self._clock = clock
        self._cache: OrderedDict[str, EvaluationKeys] = OrderedDict()
        self._lock = threading.RLock()

    def _path(self, key_id: str) -> Path:
        if not isinstance(key_id, str) or not _KEY_ID.match(key_id):
            raise UnknownKey(f"key_id: expected 64 lowercase hex digits, received {str(key_id)[:80]!r}")
        return self.root / f"{key_id}{_SUFFIX}"

    def _files(self) -> list[Path]:
        return [p for p in self.root.glob(f"*{_SUFFIX}") if _KEY_ID.match(p.stem)]

    def _expired(self, path: Path) -> bool:
        return self._clock() - path.stat().st_mtime > self.ttl_seconds

    def _forget(self, path: Path) -> None:
        path.unlink(missing_ok=True)
        self._cache.pop(path.stem, None)

    def purge_expired(self) -> int:
        """Delete every expired key set; return how many were deleted."""
        with self._lock:
            expired = [p for p in self._files() if self._expired(p)]
            for p in expired:
                self._forget(p)
                log.info("he keystore: expired key %s deleted", p.stem)
            return len(expired)

    def register(self, data: bytes) -> str:
        """Validate and store evaluation keys; return their key id (SHA-256 hex of ``data``).

        Registering the same bytes again returns the same id and restarts its TTL.

        Raises:
            SecretKeyRefused: the payload holds a secret key.
            QuotaExceeded: storing it would exceed ``quota_bytes``.
            MalformedKeys, SecurityError, ParameterError: not valid veil evaluation keys.
        """
        if not isinstance(data, (bytes, bytearray)):
            raise MalformedKeys(f"register: expected bytes, received {type(data).__name__}")
        data = bytes(data)
        refuse_foreign_formats(data)
        if len(data) > self.quota_bytes:
            raise QuotaExceeded(f"register: expected at most {self.quota_bytes} bytes, received {len(data)}")
        keys = EvaluationKeys.from_bytes(data)
        key_id = hashlib.sha256(data).hexdigest()
        with self._lock:
            self.purge_expired()
            path, now = self._path(key_id), self._clock()
            if not path.exists():
                used = sum(p.stat().st_size for p in self._files())
                if used + len(data) > self.quota_bytes:
                    raise QuotaExceeded(f"register: expected at most {self.quota_bytes - used} more bytes "
                                        f"(quota {self.quota_bytes}, used {used}), received {len(data)}")
                write_atomic(path, data)
            os.utime(path, (now, now))
            self._remember(key_id, keys)
        log.info("he keystore: registered key %s (%d bytes)", key_id, len(data))
        return key_id

    def _remember(self, key_id: str, keys: EvaluationKeys) -> None:
        self._cache[key_id] = keys
        self._cache.move_to_end(key_id)
        while len(self._cache) > self.memory_items:
            self._cache.popitem(last=False)

    def get(self, key_id: str) -> EvaluationKeys:
        """The evaluation keys registered under ``key_id``.

        Raises:
            UnknownKey: never registered (or deleted, or expired and already purged).
            ExpiredKey: its TTL has passed; the key set is deleted now.
            MalformedKeys: the stored file no longer matches its id.
        """
        with self._lock:
            path = self._path(key_id)
            if not path.exists():
                raise UnknownKey(f"key_id: no evaluation keys registered under {key_id}")
            if self._expired(path):
                self._forget(path)
                raise ExpiredKey(f"key_id: the evaluation keys under {key_id} expired after {self.ttl_seconds} s; "
                                 "register them again")
            if key_id in self._cache:
                self._cache.move_to_end(key_id)
                return self._cache[key_id]
            data = path.read_bytes()
            if hashlib.sha256(data).hexdigest() != key_id:
                self._forget(path)
                raise MalformedKeys(f"key_id: the stored keys under {key_id} are corrupted and were deleted")
            keys = EvaluationKeys.from_bytes(data)
            self._remember(key_id, keys)
            return keys

    def delete(self, key_id: str) -> None:
        """Delete a key set (a client re-keying or leaving).

        Raises:
            UnknownKey: nothing is registered under ``key_id``.
        """
        with self._lock:
            path = self._path(key_id)
            if not path.exists():
                raise UnknownKey(f"key_id: no evaluation keys registered under {key_id}")
            self._forget(path)
        log.info("he keystore: deleted key %s", key_id)

    def usage(self) -> dict[str, Any]:
        """Stored key sets and bytes against the quota (expired ones are purged first)."""
        with self._lock:
            self.purge_expired()
            files = self._files()
            return {"keys": len(files), "bytes": sum(p.stat().st_size for p in files), "quota_bytes": self.quota_bytes,
                    "ttl_seconds": self.ttl_seconds, "in_memory": len(self._cache)}
