"""Server-side store of clients' evaluation keys: content-addressed, owned, quota-bound, expiring, LRU-evicted.

A client registers its :class:`~veil.he.keys.EvaluationKeys` bytes once and gets back a ``key_id`` (the
SHA-256 of the canonical bundle) and a ``key_secret``: a random token only that client holds, required to
use or delete the key set (the operator's admin token may delete any). The store refuses anything holding
a secret key (a veil keyring, a private TenSEAL context), malformed keys and bundles larger than the whole
quota; it stores only what it parsed (the bundle re-serialized from its parsed fields). Bounds: each source
(client address) holds at most ``keys_per_source`` key sets (one more is refused: several owners may share an
address, so a source's bound never evicts anyone's keys), and when the byte quota is full the least recently
used key sets are evicted, so neither one client nor a flood of them locks others out; keys expire
``ttl_seconds`` after their last registration. A key set that is deleted, evicted or expired keeps its owner
record for another ``ttl_seconds``: registering the same keys again meanwhile takes that owner's ``key_secret``,
so nobody else can claim them (issue 31 item 6). Files are 0600 in a 0700 folder. Logs carry key ids and sizes
only, never key material.

Example:
    >>> store = KeyStore(Path("/var/lib/veil/keys"), quota_bytes=2**30, ttl_seconds=86400)
    >>> reg = store.register(evaluation_key_bytes, source="10.0.0.7")   # doctest: +SKIP
    >>> keys = store.get(reg.key_id, reg.key_secret)                    # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import json
import logging
import os
import re
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from veil.he.errors import (
    ExpiredKey,
    KeyAccessDenied,
    MalformedKeys,
    QuotaExceeded,
    SecretKeyRefused,
    UnknownKey,
)
from veil.he.keys import EVALUATION_KEYS_MAGIC, KEYRING_MAGIC, EvaluationKeys

from veil.atomic import write_atomic

log = logging.getLogger(__name__)
_KEY_ID = re.compile(r"^[0-9a-f]{64}$")
_SUFFIX, _OWNER = ".evk", ".owner"


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


@dataclasses.dataclass(frozen=True)
class Registration:
    """What :meth:`KeyStore.register` returns.

    Args:
        key_id (str): the SHA-256 hex of the stored (canonical) bundle.
        key_secret (str | None): the owner's token, returned once; None when the owner renewed a key set.
        size (int): bytes stored.
    """

    key_id: str
    key_secret: str | None
    size: int


class KeyStore:
    """Evaluation keys on disk under ``root``: owners, a byte quota, per-source bounds, a TTL and LRU eviction.

    Args:
        root: folder holding ``<key_id>.evk`` (the bundle) and ``<key_id>.owner`` (secret hash, source).
        quota_bytes: the most bytes all stored key sets may take together (LRU eviction beyond).
        ttl_seconds: seconds a key set lives after its last registration.
        memory_items: parsed key sets kept in memory (least recently used dropped first).
        keys_per_source: key sets one source may hold; registering one more is refused.
        clock: the time source (seconds); tests pass a fake one.
    """

    def __init__(self, root: Path, quota_bytes: int, ttl_seconds: float, memory_items: int = 8,
                 keys_per_source: int = 4, clock: Callable[[], float] = time.time) -> None:
        if quota_bytes <= 0 or ttl_seconds <= 0 or memory_items < 0 or keys_per_source < 1:
            raise ValueError(f"KeyStore: expected quota_bytes > 0, ttl_seconds > 0, memory_items >= 0, "
                             f"keys_per_source >= 1, received {quota_bytes}, {ttl_seconds}, {memory_items}, "
                             f"{keys_per_source}")
        self.root = Path(root)
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.quota_bytes, self.ttl_seconds, self.memory_items = quota_bytes, ttl_seconds, memory_items
        self.keys_per_source = keys_per_source
        self._clock = clock
        self._cache: OrderedDict[str, EvaluationKeys] = OrderedDict()
        self._owners: dict[str, dict[str, str]] = {}  # key_id -> {"secret_sha256", "source"}
        self._used: dict[str, float] = {}  # key_id -> last registration or use (LRU order)
        self._lock = threading.RLock()

    def _path(self, key_id: str) -> Path:
        if not isinstance(key_id, str) or not _KEY_ID.match(key_id):
            raise UnknownKey(f"key_id: expected 64 lowercase hex digits, received {str(key_id)[:80]!r}")
        return self.root / f"{key_id}{_SUFFIX}"

    def _files(self) -> list[Path]:
        return [p for p in self.root.glob(f"*{_SUFFIX}") if _KEY_ID.match(p.stem)]

    def _expired(self, path: Path) -> bool:
        return self._clock() - path.stat().st_mtime > self.ttl_seconds

    def _forget(self, path: Path, keep_owner: bool = True) -> None:
        """Delete a key set's bundle; its owner record stays (restamped now) for ``ttl_seconds`` unless
        ``keep_owner`` is False, so that only its owner can register the same keys again meanwhile."""
        path.unlink(missing_ok=True)
        owner = path.with_suffix(_OWNER)
        if keep_owner and owner.exists():
            now = self._clock()
            os.utime(owner, (now, now))
        else:
            owner.unlink(missing_ok=True)
        for table in (self._cache, self._owners, self._used):
            table.pop(path.stem, None)

    def _owner(self, key_id: str) -> dict[str, str] | None:
        """The owner record of a stored key set (None for a bundle without one: never usable)."""
        if key_id not in self._owners:
            try:
                record = json.loads(self.root.joinpath(f"{key_id}{_OWNER}").read_text())
            except (OSError, ValueError):
                return None
            if not isinstance(record, dict) or not isinstance(record.get("secret_sha256"), str):
                return None
            self._owners[key_id] = record
        return self._owners[key_id]

    def _last_used(self, path: Path) -> float:
        return self._used.get(path.stem, path.stat().st_mtime)

    def purge_expired(self) -> int:
        """Delete every expired key set (and owner records left without a bundle); return how many key sets."""
        with self._lock:
            expired = [p for p in self._files() if self._expired(p)]
            for p in expired:
                self._forget(p)
                log.info("he keystore: expired key %s deleted", p.stem)
            for owner in self.root.glob(f"*{_OWNER}"):  # a former owner's claim lasts one more TTL
                if not owner.with_suffix(_SUFFIX).exists() and self._expired(owner):
                    owner.unlink(missing_ok=True)
            return len(expired)

    def register(self, data: bytes, *, source: str = "local", key_secret: str | None = None) -> Registration:
        """Validate and store evaluation keys; return their key id and, for a new key set, its owner's secret.

        Registering the same keys again restarts their TTL; it takes the owner's ``key_secret``, also within
        ``ttl_seconds`` after they were deleted, evicted or expired (the owner record outlives the bundle).

        Args:
            data: a veil evaluation-key bundle.
            source: who uploads (the client address): bounds how many key sets one source holds.
            key_secret: the owner's secret, to renew a key set already registered.

        Raises:
            SecretKeyRefused: the payload holds a secret key.
            QuotaExceeded: the bundle alone is larger than ``quota_bytes``.
            KeyAccessDenied: the key set is registered already (or was, within ``ttl_seconds``) and ``key_secret``
                is not its owner's.
            QuotaExceeded: ``source`` holds ``keys_per_source`` key sets already.
            MalformedKeys, SecurityError, ParameterError: not valid veil evaluation keys.
        """
        if not isinstance(data, (bytes, bytearray)):
            raise MalformedKeys(f"register: expected bytes, received {type(data).__name__}")
        data = bytes(data)
        refuse_foreign_formats(data)
        if len(data) > self.quota_bytes:
            raise QuotaExceeded(f"register: expected at most {self.quota_bytes} bytes (--he-key-quota-mb), "
                                f"received {len(data)}")
        keys = EvaluationKeys.from_bytes(data)
        # only the parsed fields are stored, nothing else a client sent; written in pieces, never joined in memory
        canonical, key_id, size = keys.to_parts(), keys.key_id, keys.size_bytes
        with self._lock:
            self.purge_expired()
            path, now = self._path(key_id), self._clock()
            secret, owned = None, path.with_suffix(_OWNER).exists()
            if path.exists():
                self._authorize(key_id, key_secret)
            else:
                if owned:  # deleted, evicted or expired recently: its owner's to register again, nobody else's
                    self._authorize(key_id, key_secret)
                self._make_room(source, size)
                if not owned:
                    secret = secrets.token_urlsafe(32)
                    write_atomic(path.with_suffix(_OWNER), json.dumps({"secret_sha256": _digest(secret),
                                                                       "source": source}), mode=0o600)
                write_atomic(path, canonical, mode=0o600)
            os.utime(path, (now, now))
            self._used[key_id] = now
            keys.release_bytes(path)  # held parsed only: the seeded bytes stay in the file
            self._remember(key_id, keys)
        log.info("he keystore: %s key %s (%d bytes)", "registered" if secret else "renewed", key_id, size)
        return Registration(key_id, secret, size)

    def _make_room(self, source: str, size: int) -> None:
        """Refuse a source at its bound (several owners may share one address: evicting the source's oldest key
        set would drop another owner's keys), then evict anyone's least recently used until ``size`` fits."""
        files = sorted(self._files(), key=self._last_used)
        held = sum((self._owner(p.stem) or {}).get("source") == source for p in files)
        if held >= self.keys_per_source:
            raise QuotaExceeded(f"register: expected at most {self.keys_per_source} key sets per source "
                                f"(--he-keys-per-source), source {source!r} holds {held}; delete one "
                                "(DELETE /v2/he/keys/<key_id>) or let one expire")
        used = sum(p.stat().st_size for p in files)
        while files and used + size > self.quota_bytes:
            victim = files.pop(0)
            used -= victim.stat().st_size
            self._evict(victim, f"the quota of {self.quota_bytes} bytes is full (--he-key-quota-mb)")

    def _evict(self, path: Path, why: str) -> None:
        self._forget(path)
        log.info("he keystore: evicted least recently used key %s: %s", path.stem, why)

    def _authorize(self, key_id: str, key_secret: str | None) -> None:
        owner = self._owner(key_id)
        if owner is None:
            self._forget(self._path(key_id), keep_owner=False)
            raise UnknownKey(f"key_id: the evaluation keys under {key_id} had no owner record and were deleted; "
                             "register them again")
        if not isinstance(key_secret, str) or not hmac.compare_digest(_digest(key_secret), owner["secret_sha256"]):
            raise KeyAccessDenied(f"key_secret: expected the secret returned when {key_id} was registered, "
                                  f"received {'none' if key_secret is None else 'a different one'}")

    def _remember(self, key_id: str, keys: EvaluationKeys) -> None:
        self._cache[key_id] = keys
        self._cache.move_to_end(key_id)
        while len(self._cache) > self.memory_items:
            self._cache.popitem(last=False)

    def get(self, key_id: str, key_secret: str | None) -> EvaluationKeys:
        """The evaluation keys registered under ``key_id``, for their owner.

        Raises:
            UnknownKey: never registered (or deleted, evicted, or expired and already purged).
            ExpiredKey: its TTL has passed; the key set is deleted now.
            KeyAccessDenied: ``key_secret`` is not the owner's.
            MalformedKeys: the stored file no longer matches its id.
        """
        with self._lock:
            path = self._path(key_id)
            if not path.exists():
                raise UnknownKey(f"key_id: no evaluation keys registered under {key_id} (never registered, "
                                 "deleted, or evicted to make room: register them again)")
            if self._expired(path):
                self._forget(path)
                raise ExpiredKey(f"key_id: the evaluation keys under {key_id} expired after {self.ttl_seconds} s; "
                                 "register them again")
            self._authorize(key_id, key_secret)
            self._used[key_id] = self._clock()
            if key_id in self._cache:
                self._cache.move_to_end(key_id)
                return self._cache[key_id]
            data = path.read_bytes()
            if hashlib.sha256(data).hexdigest() != key_id:
                self._forget(path)
                raise MalformedKeys(f"key_id: the stored keys under {key_id} are corrupted and were deleted")
            keys = EvaluationKeys.from_bytes(data)
            keys.release_bytes(path)
            self._remember(key_id, keys)
            return keys

    def delete(self, key_id: str, key_secret: str | None = None, *, admin: bool = False) -> None:
        """Delete a key set (a client re-keying or leaving): its owner, or the operator with ``admin``.

        Raises:
            UnknownKey: nothing is registered under ``key_id``.
            KeyAccessDenied: neither ``admin`` nor the owner's ``key_secret``.
        """
        with self._lock:
            path = self._path(key_id)
            if not path.exists():
                raise UnknownKey(f"key_id: no evaluation keys registered under {key_id}")
            if not admin:
                self._authorize(key_id, key_secret)
            self._forget(path)
        log.info("he keystore: deleted key %s", key_id)

    def usage(self) -> dict[str, Any]:
        """Stored key sets and bytes against the quota (expired ones are purged first)."""
        with self._lock:
            self.purge_expired()
            files = self._files()
            return {"keys": len(files), "bytes": sum(p.stat().st_size for p in files), "quota_bytes": self.quota_bytes,
                    "ttl_seconds": self.ttl_seconds, "in_memory": len(self._cache),
                    "keys_per_source": self.keys_per_source, "sources": len({(self._owner(p.stem) or {}).get("source")
                                                                             for p in files})}


def _digest(key_secret: str) -> str:
    return hashlib.sha256(key_secret.encode()).hexdigest()
