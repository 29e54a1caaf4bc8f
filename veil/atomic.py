"""Atomic writes: readers see the old file or folder or the whole new one, never a half.

:func:`write_atomic` (a file), :func:`atomic_dir` (a folder, published by :func:`publish_dir`) and
:func:`sweep_stale` (the temporaries that killed writers left). Needs only the standard library.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import hashlib
import os
import re
import secrets
import shutil
import socket
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

STALE_AFTER_S = 3600.0  # a temporary older than this is stale even if a process with its writer's pid still runs
_TEMP = re.compile(r"^\.(?P<name>.+)\.(?P<kind>tmp|old)-(?P<host>[0-9a-f]{4})-(?P<pid>\d+)-[0-9a-f]{8}$")
# this machine, in temporaries' names: a pid is only checked on the host that wrote it (shared repositories)
HOST = hashlib.sha256(socket.gethostname().encode()).hexdigest()[:4]
_RENAME_EXCHANGE, _AT_FDCWD = 2, -100


def _temp_path(final: Path, kind: str = "tmp") -> Path:
    """A fresh hidden sibling ``.<name>.<kind>-<host>-<pid>-<hex>``: the writer's host and pid let the sweeper
    tell a live writer's temporary from a killed one's."""
    return final.with_name(f".{final.name}.{kind}-{HOST}-{os.getpid()}-{secrets.token_hex(4)}")


def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):
        return False
    except PermissionError:  # alive, owned by someone else
        return True
    return True


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def sweep_stale(folder: str | os.PathLike[str], max_age_s: float = STALE_AFTER_S) -> list[Path]:
    """Remove the temporaries that killed writers left in ``folder``; returns what was removed.

    A temporary is one of :func:`write_atomic`'s / :func:`atomic_dir`'s hidden ``.<name>.tmp-<host>-<pid>-<hex>``
    (or ``.old-``) entries; it is stale when it was written on this host by a pid no longer running, or when it
    is older than ``max_age_s`` (the pid may have been reused; another host's pid cannot be checked). A live
    writer's fresh temporary is left alone. An ``.old-``
    folder whose published name is missing (a writer killed inside the non-atomic fallback of
    :func:`atomic_dir`) is renamed back into place instead of removed. Called by every atomic write.
    """
    folder, removed, now = Path(folder), [], time.time()
    try:
        entries = list(os.scandir(folder))
    except FileNotFoundError:
        return removed
    for entry in entries:
        match = _TEMP.match(entry.name)
        if match is None:
            continue
        try:
            age = now - entry.stat(follow_symlinks=False).st_mtime
        except FileNotFoundError:
            continue
        if age < max_age_s and (match["host"] != HOST or _pid_alive(int(match["pid"]))):
            continue
        path, final = Path(entry.path), folder / match["name"]
        if match["kind"] == "old" and not os.path.lexists(final):
            with contextlib.suppress(OSError):
                os.rename(path, final)  # the only copy: put it back
                continue
        _remove(path)
        removed.append(path)
    return removed


def _sweep_legacy(final: Path, max_age_s: float = STALE_AFTER_S) -> None:
    """Temporaries of releases before the pid-stamped names (``.<name>.XXXXXXXX[.tmp]``, ``.<name>.old``), once
    older than ``max_age_s``."""
    legacy = re.compile(rf"^\.{re.escape(final.name)}\.([a-z0-9_]{{8}}(\.tmp)?|old)$")
    with contextlib.suppress(FileNotFoundError):
        for entry in os.scandir(final.parent):
            if legacy.match(entry.name) and time.time() - entry.stat(follow_symlinks=False).st_mtime >= max_age_s:
                _remove(Path(entry.path))


def _fsync(path: Path) -> None:
    """Flush a file's (or a folder's entries') data to disk, so a power cut cannot publish empty files."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError:  # some filesystems refuse fsync on folders
        pass
    finally:
        os.close(fd)


def write_atomic(path: str | os.PathLike[str], data: bytes | str | Sequence[bytes | memoryview],
                 mode: int | None = None) -> None:
    """Write a file so that readers see the old content or the whole new one, never a half.

    ``data`` may be a list of parts, written one after the other (a large artifact is never joined in memory).

    The file is created with ``mode`` (default ``0o666`` less the user's umask, as ``open`` does; pass ``0o600``
    for secrets), written and fsynced under a pid-stamped hidden name and renamed over ``path`` in one step.
    Temporaries of killed writers in the same folder are swept first (:func:`sweep_stale`).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    sweep_stale(path.parent)
    _sweep_legacy(path)
    tmp = _temp_path(path)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666 if mode is None else mode)
    try:
        with os.fdopen(fd, "wb") as fh:
            if mode is not None:
                os.fchmod(fh.fileno(), mode)  # exactly ``mode``, whatever the umask
            for part in [data] if isinstance(data, (bytes, bytearray, memoryview, str)) else data:
                fh.write(part.encode() if isinstance(part, str) else part)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync(path.parent)


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths in one step (Linux ``renameat2(RENAME_EXCHANGE)``); False where the OS or the filesystem
    cannot (macOS, some network filesystems)."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV):
        return False
    raise OSError(err, os.strerror(err), str(b))


def publish_dir(tmp: Path, final: Path) -> None:
    """Put the complete folder ``tmp`` at ``final`` in one atomic step, replacing any old folder there.

    * ``final`` absent: one ``rename``.
    * ``final`` present (a real folder, also one written by older releases): one ``renameat2(RENAME_EXCHANGE)``
      swaps the two folders, so ``final`` is the old folder or the new one at every instant; the old one, now
      under the temporary's name, is then removed (a kill here leaves a stale temporary, swept later).
    * Where the filesystem cannot exchange (non-Linux, some network filesystems), the fallback is two renames:
      the old folder moves aside to ``.<name>.old-<pid>-<hex>``, then the new one moves in. A kill between them
      leaves no ``final`` for an instant's worth of readers; the next atomic write in that folder
      (:func:`sweep_stale`) renames the old folder back.

    The published path stays a plain folder (no symlink indirection), so Triton, checkpoint loaders and
    ``Path.resolve()`` see the layout unchanged.
    """
    if not os.path.lexists(final):
        try:
            os.rename(tmp, final)
            _fsync(final.parent)
            return
        except OSError:  # another writer published meanwhile: replace theirs below
            if not os.path.lexists(final):
                raise
    if _exchange(tmp, final):
        _fsync(final.parent)
        _remove(tmp)  # the old folder, under the temporary name
        return
    old = _temp_path(final, "old")
    os.rename(final, old)
    os.rename(tmp, final)
    _fsync(final.parent)
    _remove(old)


@contextlib.contextmanager
def atomic_dir(final: str | os.PathLike[str]) -> Iterator[Path]:
    """Build a folder under a temporary sibling name, then publish it in one step (replacing any old one).

    Readers see the previous folder or the complete new one, never a half-written one or none
    (:func:`publish_dir` says how, and what happens on filesystems that cannot swap folders atomically). On an
    error the temporary folder is removed and ``final`` is left as it was. The folder is created with the
    user's umask (``0o777`` less it), its files are fsynced before publishing, and temporaries of killed
    writers beside ``final`` are swept first.

    Example:
        >>> with atomic_dir("runs/ck") as tmp:
        ...     (tmp / "config.json").write_text("{}")
    """
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    sweep_stale(final.parent)
    _sweep_legacy(final)
    tmp = _temp_path(final)
    os.mkdir(tmp, 0o777)
    try:
        yield tmp
        for root, _dirs, files in os.walk(tmp):
            for name in files:
                if not os.path.islink(os.path.join(root, name)):
                    _fsync(Path(root) / name)
        publish_dir(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
