"""Dataclass configs shared by every room: JSON round trip, validation helpers, argparse generation, the closed
plugin registry (:class:`Registry`) and atomic writes.

Every veil config is a ``@dataclass`` that inherits :class:`Config`. Fields carry their help text in
``metadata={"help": ...}`` so that ``--help`` on the command line is written once, here. Closed choices
are ``Literal[...]`` and are checked on construction with an error that names the field, the expected
values and the received value. This module needs neither torch nor numpy.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import dataclasses
import enum
import errno
import hashlib
import importlib
import json
import os
import re
import secrets
import shutil
import socket
import sys
import time
import types
import typing
import warnings
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, Generic, Literal, TypeVar, get_args, get_origin

C = TypeVar("C", bound="Config")
V = TypeVar("V")
_UNION_TYPES = (typing.Union, types.UnionType)


class ConfigError(ValueError):
    """A config field holds a value outside what the field accepts."""


def field(default: Any, help: str, **kwargs: Any) -> Any:
    """A dataclass field with its help text; lists and dicts get a factory."""
    if isinstance(default, (list, dict)):
        return dataclasses.field(default_factory=lambda: type(default)(default), metadata={"help": help}, **kwargs)
    return dataclasses.field(default=default, metadata={"help": help}, **kwargs)


def _check_type(cls_name: str, name: str, hint: Any, value: Any) -> Any:
    """Check (and gently coerce) one value against its type hint; raise ConfigError otherwise."""
    origin, args = get_origin(hint), get_args(hint)
    if origin is Literal:
        if value not in args:
            raise ConfigError(f"{cls_name}.{name}: expected one of {list(args)}, received {value!r}")
        return value
    if origin in _UNION_TYPES:
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _check_type(cls_name, name, inner[0], value) if len(inner) == 1 else value
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{cls_name}.{name}: expected a bool, received {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{cls_name}.{name}: expected an int, received {value!r}")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{cls_name}.{name}: expected a number, received {value!r}")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise ConfigError(f"{cls_name}.{name}: expected a string, received {value!r}")
        return value
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{cls_name}.{name}: expected a list, received {value!r}")
        item = args[0] if args else Any
        items = [_check_type(cls_name, f"{name}[{i}]", item, v) for i, v in enumerate(value)] if item is not Any else list(value)
        return tuple(items) if origin is tuple else items
    if isinstance(hint, type) and issubclass(hint, Config):
        if isinstance(value, hint):
            return value
        if isinstance(value, dict):
            return hint.from_dict(value)
        raise ConfigError(f"{cls_name}.{name}: expected a {hint.__name__} or a dict, received {value!r}")
    return value


@dataclasses.dataclass
class Config:
    """Base of every veil config: typed, validated, JSON round-trippable."""

    def __post_init__(self) -> None:
        hints = typing.get_type_hints(type(self))
        for f in dataclasses.fields(self):
            setattr(self, f.name, _check_type(type(self).__name__, f.name, hints[f.name], getattr(self, f.name)))
        self.validate()

    def validate(self) -> None:
        """Cross-field checks; subclasses raise ConfigError naming the field(s)."""

    # -- JSON -----------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            out[f.name] = value.to_dict() if isinstance(value, Config) else (list(value) if isinstance(value, tuple) else value)
        return out

    @classmethod
    def from_dict(cls: type[C], data: dict[str, Any]) -> C:
        """Build from a dict; unknown keys are ignored with a warning that names them."""
        if not isinstance(data, dict):
            raise ConfigError(f"{cls.__name__}: expected a JSON object, received {type(data).__name__}")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            warnings.warn(f"{cls.__name__}: ignoring unknown keys {unknown}", UserWarning, stacklevel=2)
        return cls(**{k: v for k, v in data.items() if k in names})

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls: type[C], text: str) -> C:
        return cls.from_dict(json.loads(text))

    def replace(self: C, **changes: Any) -> C:
        return dataclasses.replace(self, **changes)

    # -- argparse -------------------------------------------------------------------------------
    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser, prefix: str = "", skip: tuple[str, ...] = ()) -> None:
        """Add one ``--<prefix><field>`` flag per scalar field; help and choices come from the field metadata."""
        hints = typing.get_type_hints(cls)
        group = parser.add_argument_group(f"{cls.__name__} ({cls.__doc__.splitlines()[0] if cls.__doc__ else ''})")
        for f in dataclasses.fields(cls):
            hint = hints[f.name]
            if f.name in skip or (isinstance(hint, type) and issubclass(hint, Config)):
                continue
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
            text = f.metadata.get("help", "")
            if default != "" and "default:" not in text:  # an empty default says nothing; a stated one once
                text = f"{text} (default: {default})"
            kwargs: dict[str, Any] = {"default": None, "dest": flag_dest(prefix, f.name), "help": text}
            origin, args = get_origin(hint), get_args(hint)
            if origin in _UNION_TYPES:
                hint = next(a for a in args if a is not type(None))
                origin, args = get_origin(hint), get_args(hint)
            if hint is bool:
                kwargs["action"] = argparse.BooleanOptionalAction
            elif origin is Literal:
                kwargs["choices"] = list(args)
            elif origin in (list, tuple):
                kwargs.update(nargs="+", type=args[0] if args else str)
            elif origin is dict:
                kwargs.update(type=json_object, metavar="JSON")
            else:
                kwargs["type"] = hint if hint in (int, float, str) else str
            group.add_argument("--" + flag_dest(prefix, f.name).replace("_", "-"), **kwargs)

    @classmethod
    def from_args(cls: type[C], args: argparse.Namespace, prefix: str = "", base: dict[str, Any] | None = None,
                  **overrides: Any) -> C:
        """Start from ``base`` (a dict, or the defaults) and apply every ``--<prefix>`` flag the user gave."""
        values = dict(base or {})
        for f in dataclasses.fields(cls):
            given = getattr(args, flag_dest(prefix, f.name), None)
            if given is not None:
                values[f.name] = given
        values.update(overrides)
        return cls.from_dict(values)


def json_object(text: str) -> dict[str, Any]:
    """argparse type of a dict field: a JSON object given inline."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"expected a JSON object, received {text!r} ({exc.msg})") from exc
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, received {text!r}")
    return value


def flag_dest(prefix: str, name: str) -> str:
    """argparse dest of field ``name`` under ``prefix``; a field already named by it is not prefixed twice
    (PsoftConfig.psoft_mag_a -> ``--psoft-mag-a``, not ``--psoft-psoft-mag-a``)."""
    stem = prefix.replace("-", "_")
    return name if stem and name.startswith(stem) else stem + name


# -- lazy packages ------------------------------------------------------------------------------------------
def import_object(target: str, default: str | None = None) -> Any:
    """The object ``"module:name"`` names (``"module"`` alone: its ``default`` attribute), imported on call: how a
    verb table or a registry names code it must not import before it runs."""
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name or default or "")


def lazy_exports(package: str, exports: Mapping[str, str]) -> tuple[Any, Any]:
    """PEP 562 ``__getattr__`` and ``__dir__`` for a package whose public names load on first use.

    A room's ``__init__`` that imported every submodule made each CLI's ``--help`` import torch (issue 24:
    1.4-2.4 s); with this, ``import veil.training.uldnet.config`` stays as light as that module. ``exports`` maps
    a public name to the submodule defining it (``{"train_uldnet": ".trainer"}``; a name that is the submodule
    itself, ``{"lora": ".lora"}``, gives the module).

    Example:
        >>> __getattr__, __dir__ = lazy_exports(__name__, {"PolyNorm": ".polynorm"})
    """
    module = sys.modules[package]

    def __getattr__(name: str) -> Any:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        loaded = importlib.import_module(exports[name], package)
        value = loaded if exports[name].rpartition(".")[2] == name else getattr(loaded, name)
        setattr(module, name, value)  # later lookups skip __getattr__
        return value

    def __dir__() -> list[str]:
        return sorted(set(module.__dict__) | set(exports))

    return __getattr__, __dir__


# -- registries ----------------------------------------------------------------------------------------------
class RegistryError(ConfigError, KeyError):
    """A registry refused a name: outside its closed set, registered twice, or not lower case."""

    __str__ = Exception.__str__  # the message, not KeyError's repr of it


class Registry(Mapping[str, V], Generic[V]):
    """A closed registry of named plugins, the PEFT way (``register_peft_method``).

    The set of names is fixed when the registry is made; each name registers once; a name outside the set, a
    second registration and a name that is not lower case are refused with the known names (and, for a new
    name, where to add it) in the message. ``modules`` maps a name to the module whose import registers it, so
    an entry loads on first lookup and listing the names (:attr:`names`, e.g. for argparse ``choices``) imports
    nothing. It is a read-only mapping: iteration yields every name (as given: Enum members stay members), lookup (by
name or member) loads and returns its entry.

    Args:
        what: what a name is, as messages say it (``"optimizer"``, ``"method"``).
        names: the closed set (strings, or a ``str`` Enum's members).
        modules: ``{name: module}`` importing which registers the name (optional).
        where: where a new name must be added, for the refusal's fix (``"AdapterMethod in training/..."``).

    Example:
        >>> CODECS = Registry("codec", ["png", "jpeg"])
        >>> CODECS.register("png", PngCodec)
        >>> CODECS["webp"]   # RegistryError: codec: expected one of ['jpeg', 'png'], received 'webp'
    """

    def __init__(self, what: str, names: Iterable[str], modules: Mapping[str, str] | None = None,
                 where: str = "") -> None:
        self.what, self.where = what, where
        self._keys = tuple(names)  # as given: iteration yields a ``str`` Enum's members
        self._names = tuple(_registry_key(n) for n in self._keys)
        self._modules = dict(modules or {})
        self._entries: dict[str, V] = {}
        unknown = sorted(set(self._modules) - set(self._names))
        if len(set(self._names)) != len(self._names) or unknown:
            raise RegistryError(f"{what} registry: expected distinct names with modules among them, received "
                                f"names {list(self._names)}, modules for {sorted(self._modules)}")

    @property
    def names(self) -> tuple[str, ...]:
        """Every name of the closed set, in the order given; imports nothing."""
        return self._names

    def register(self, name: str, entry: V) -> V:
        """Register ``entry`` under ``name`` (once); returns ``entry``."""
        key = _registry_key(name)
        if key != key.lower():
            raise RegistryError(f"{self.what}: name: expected lower case, received {key!r}")
        if key not in self._names:
            fix = f"; add it to {self.where}" if self.where else ""
            raise RegistryError(f"{self.what}: expected one of {sorted(self._names)}, received {key!r}{fix}")
        if key in self._entries:
            raise RegistryError(f"{self.what}: {key!r} is already registered ({self._entries[key]!r}); "
                                "each name registers once")
        self._entries[key] = entry
        return entry

    def __getitem__(self, name: str) -> V:
        key = _registry_key(name)
        if key not in self._names:
            raise RegistryError(f"{self.what}: expected one of {sorted(self._names)}, received {name!r}")
        if key not in self._entries and key in self._modules:
            importlib.import_module(self._modules[key])
        if key not in self._entries:
            where = f"importing {self._modules[key]} did not register it" if key in self._modules else "nothing registered it"
            raise RegistryError(f"{self.what}: {key!r} is known but not registered ({where})")
        return self._entries[key]

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and _registry_key(name) in self._names

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._names)

    def __repr__(self) -> str:
        return f"Registry({self.what!r}, {list(self._names)})"


def _registry_key(name: Any) -> str:
    """A registry key: a ``str`` Enum member counts as its value."""
    return name.value if isinstance(name, enum.Enum) else name


# -- atomic writes ------------------------------------------------------------------------------------------
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


def write_atomic(path: str | os.PathLike[str], data: bytes | str, mode: int | None = None) -> None:
    """Write a file so that readers see the old content or the whole new one, never a half.

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
            fh.write(data.encode() if isinstance(data, str) else data)
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
