"""Bytes in and out of SEAL objects, and the checksummed container every veil HE file uses.

SEAL's Python bindings (``tenseal.sealapi``) save and load only through file paths, so objects pass
through a private temporary folder (on ``/dev/shm`` where it exists; mode 0700, removed at exit).

Container layout (all integers big-endian)::

    magic (8 bytes) | version (uint16) | header length (uint32) | SHA-256 of header+payload (32 bytes)
    | header (UTF-8 JSON object) | payload
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import shutil
import struct
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import tenseal.sealapi as sa
from veil.he.errors import HEError, MalformedCiphertext
from veil.he.params import CkksParameters

_PREFIX = struct.Struct(">8sHI32s")
CIPHERTEXTS_MAGIC = b"VEILCTS\x00"
CIPHERTEXTS_VERSION = 1
_tmp_dir: Path | None = None


class _Savable(Protocol):
    def save(self, path: str) -> None: ...


def _private_dir() -> Path:
    """This process's private scratch folder for SEAL's path-based (de)serialization."""
    global _tmp_dir
    if _tmp_dir is None or not _tmp_dir.is_dir():
        base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
        _tmp_dir = Path(tempfile.mkdtemp(prefix="veil-he-", dir=base))  # mode 0700
        atexit.register(shutil.rmtree, _tmp_dir, True)
    return _tmp_dir


def seal_to_bytes(obj: _Savable) -> bytes:
    """Serialize a SEAL object (or a seeded ``Serializable``) with SEAL's default compression."""
    fd, path = tempfile.mkstemp(dir=_private_dir())
    os.close(fd)
    try:
        obj.save(path)
        return Path(path).read_bytes()
    finally:
        os.unlink(path)


def seal_from_bytes(obj: Any, context: sa.SEALContext, data: bytes) -> Any:
    """Load ``data`` into the empty SEAL object ``obj`` (SEAL checks validity for ``context``); return it."""
    fd, path = tempfile.mkstemp(dir=_private_dir())
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        obj.load(context, path)
        return obj
    finally:
        os.unlink(path)


def pack(magic: bytes, version: int, header: dict[str, Any], payload: bytes = b"") -> bytes:
    """Build a container: prefix, canonical JSON header, payload."""
    head = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    digest = hashlib.sha256(head + payload).digest()
    return _PREFIX.pack(magic, version, len(head), digest) + head + payload


def unpack(data: bytes, magic: bytes, versions: Sequence[int], error: type[HEError],
           what: str) -> tuple[int, dict[str, Any], bytes]:
    """Parse and verify a container; return ``(version, header, payload)``.

    Raises:
        error: naming the field (magic, version, length, checksum, header) that is wrong.
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise error(f"{what}: expected bytes, received {type(data).__name__}")
    data = bytes(data)
    if len(data) < _PREFIX.size:
        raise error(f"{what}: expected at least {_PREFIX.size} bytes, received {len(data)}")
    got_magic, version, head_len, digest = _PREFIX.unpack_from(data)
    if got_magic != magic:
        raise error(f"{what}.magic: expected {magic!r}, received {got_magic!r}")
    if version not in versions:
        raise error(f"{what}.version: expected one of {list(versions)}, received {version}")
    body = data[_PREFIX.size:]
    if head_len > len(body):
        raise error(f"{what}.header_length: expected <= {len(body)}, received {head_len}")
    actual = hashlib.sha256(body).digest()
    if actual != digest:
        raise error(f"{what}.sha256: expected {digest.hex()}, received {actual.hex()} (corrupted or truncated)")
    try:
        header = json.loads(body[:head_len])
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise error(f"{what}.header: expected a JSON object, received unparsable bytes ({exc})") from None
    if not isinstance(header, dict):
        raise error(f"{what}.header: expected a JSON object, received {type(header).__name__}")
    return version, header, body[head_len:]


def split_sections(payload: bytes, lengths: Any, error: type[HEError], what: str) -> list[bytes]:
    """Cut ``payload`` into consecutive sections of the given lengths (which must cover it exactly)."""
    if not isinstance(lengths, list) or not all(isinstance(n, int) and n >= 0 for n in lengths):
        raise error(f"{what}.lengths: expected a list of non-negative ints, received {lengths!r}")
    if sum(lengths) != len(payload):
        raise error(f"{what}.lengths: expected a total of {len(payload)} bytes, received {sum(lengths)}")
    out, start = [], 0
    for n in lengths:
        out.append(payload[start:start + n])
        start += n
    return out


def ciphertexts_to_bytes(cts: Sequence[_Savable]) -> bytes:
    """Serialize ciphertexts (plain ``sa.Ciphertext`` or seeded ``Serializable`` ones) into one container."""
    blobs = [seal_to_bytes(ct) for ct in cts]
    return pack(CIPHERTEXTS_MAGIC, CIPHERTEXTS_VERSION, {"count": len(blobs), "lengths": [len(b) for b in blobs]},
                b"".join(blobs))


def ciphertexts_from_bytes(params: CkksParameters, data: bytes) -> list[sa.Ciphertext]:
    """Parse :func:`ciphertexts_to_bytes` output and check every ciphertext belongs to ``params``.

    Raises:
        MalformedCiphertext: garbage, a bad checksum, or a ciphertext that SEAL finds invalid for the
            parameters' context (other parameters, wrong size, not NTT form).
    """
    _, header, payload = unpack(data, CIPHERTEXTS_MAGIC, (CIPHERTEXTS_VERSION,), MalformedCiphertext, "ciphertexts")
    blobs = split_sections(payload, header.get("lengths"), MalformedCiphertext, "ciphertexts")
    if header.get("count") != len(blobs):
        raise MalformedCiphertext(f"ciphertexts.count: expected {len(blobs)}, received {header.get('count')!r}")
    context, out = params.seal_context(), []
    for i, blob in enumerate(blobs):
        try:
            ct = seal_from_bytes(sa.Ciphertext(), context, blob)
        except Exception as exc:  # SEAL raises RuntimeError/ValueError/IOError subclasses for bad input
            raise MalformedCiphertext(f"ciphertexts[{i}]: not a ciphertext for parameters {params.hash()[:12]} "
                                      f"(N={params.poly_modulus_degree}, chain={list(params.coeff_mod_bit_sizes)}): "
                                      f"{type(exc).__name__}: {exc}") from None
        if not sa.is_valid_for(ct, context):
            raise MalformedCiphertext(f"ciphertexts[{i}]: expected a ciphertext valid for parameters "
                                      f"{params.hash()[:12]}, received one SEAL finds invalid")
        if ct.size() != 2:
            raise MalformedCiphertext(f"ciphertexts[{i}].size: expected 2 polynomials (relinearized), "
                                      f"received {ct.size()}")
        out.append(ct)
    return out
