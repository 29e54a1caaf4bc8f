"""SEAL objects to and from bytes in memory (:func:`seal_to_bytes`, :func:`seal_from_bytes`).

SEAL's Python bindings (``tenseal.sealapi``) save and load only through file paths. veil hands SEAL the
path ``/proc/self/fd/N`` of an anonymous in-memory file (``memfd_create``): it has no name in any folder,
is never linked, and vanishes with its descriptor, so no object, the secret key included, ever reaches a
file system, and a killed process leaves nothing behind (a named file in ``/dev/shm`` did). TenSEAL's
``Context.serialize`` is in memory too, but it cannot carry veil's seeded keys or a bare secret key.
Where ``memfd_create`` is missing (not Linux), public objects fall back to a private temporary folder
(mode 0700, removed at exit) and a secret key is refused rather than written there.

This module needs no parameter set, so :mod:`veil.he.params` (which measures serialized sizes) and
:mod:`veil.he.serialize` (veil's containers, which need parameter sets) both build on it.
"""

from __future__ import annotations

import atexit
import os
import shutil
import struct
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

import tenseal.sealapi as sa
from veil.he.errors import KeyringError

_SEAL_HEADER = struct.Struct("<HBBBBHQ")  # SEAL's SEALHeader: magic, header size, version, compression, size
_SEAL_MAGIC = 0xA15E
_IN_MEMORY = hasattr(os, "memfd_create") and os.path.isdir("/proc/self/fd")
_tmp_dir: Path | None = None


class Savable(Protocol):
    """A SEAL object (or a seeded ``Serializable``): it saves itself to a path."""

    def save(self, path: str) -> None: ...


def _private_dir() -> Path:
    """This process's private scratch folder, only where anonymous in-memory files are unavailable."""
    global _tmp_dir
    if _tmp_dir is None or not _tmp_dir.is_dir():
        _tmp_dir = Path(tempfile.mkdtemp(prefix="veil-he-"))  # mode 0700
        atexit.register(shutil.rmtree, _tmp_dir, True)
    return _tmp_dir


@contextmanager
def _scratch(secret: bool) -> Iterator[tuple[str, int | None]]:
    """A path SEAL can open, and the descriptor behind it when it is an anonymous in-memory file."""
    if _IN_MEMORY:
        fd = os.memfd_create("veil-seal", os.MFD_CLOEXEC)
        try:
            yield f"/proc/self/fd/{fd}", fd
        finally:
            os.close(fd)
        return
    if secret:
        raise KeyringError("secret key: this platform has no anonymous in-memory files (memfd_create), and veil "
                           "never writes a secret key to a named temporary file; use Linux for keyring files")
    fd, path = tempfile.mkstemp(dir=_private_dir())
    os.close(fd)
    try:
        yield path, None
    finally:
        os.unlink(path)


def seal_to_bytes(obj: Savable, *, secret: bool = False) -> bytes:
    """Serialize a SEAL object (or a seeded ``Serializable``) with SEAL's default compression, in memory.

    Args:
        obj: the SEAL object.
        secret: the object is a secret key (refused where it could only pass through a named file).
    """
    with _scratch(secret) as (path, fd):
        obj.save(path)
        if fd is None:
            return Path(path).read_bytes()
        size = os.fstat(fd).st_size
        return os.pread(fd, size, 0)


def seal_from_bytes(obj: Any, context: sa.SEALContext, data: bytes | memoryview, *, secret: bool = False) -> Any:
    """Load ``data`` into the empty SEAL object ``obj`` (SEAL checks validity for ``context``); return it.

    SEAL's own header must state exactly ``len(data)`` bytes: SEAL ignores trailing bytes, and a veil
    container never carries bytes it has not parsed.

    Raises:
        ValueError: the bytes do not start with a SEAL header stating their length (SEAL raises
            RuntimeError/ValueError subclasses for the rest).
    """
    data = memoryview(data).cast("B")  # a view: a section of a large upload is never copied here
    if len(data) < _SEAL_HEADER.size:
        raise ValueError(f"expected a SEAL object of at least {_SEAL_HEADER.size} bytes, received {len(data)}")
    magic, _, _, _, _, _, size = _SEAL_HEADER.unpack_from(data)
    if magic != _SEAL_MAGIC or size != len(data):
        raise ValueError(f"expected a SEAL header (magic 0x{_SEAL_MAGIC:X}) stating {len(data)} bytes, received "
                         f"magic 0x{magic:X} stating {size}")
    with _scratch(secret) as (path, fd):
        if fd is None:
            Path(path).write_bytes(data)
        else:
            view = data
            while view:
                view = view[os.write(fd, view):]
        obj.load(context, path)
        return obj
