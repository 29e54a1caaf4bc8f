"""The PAVE specification file: a model's (or a user's) normalised parameter vector and the identity that makes two
vectors comparable. Torch-free (numpy only), so training writes it, export places it, the engine and the client
read it.

A spec (``pave.json`` beside a model's ``veil.json``; ``pave/<adapter>.json`` for the adapters of a multi-adapter
model) is one JSON object::

    {"format": "veil-pave-spec", "version": 1, "kind": "model" | "user",
     "identity": {"base": ..., "base_sha256": ..., "projection_seed": ..., "rank": ..., ...},
     "identity_hash": sha256(canonical identity JSON), "dim": D,
     "vector_b64": base64 of D little-endian float32 (L2 norm 1), "fit": {how it was fitted}}

Two vectors are comparable only when their identities are equal: the same shared base (by weight hash), the same
frozen projection A (its seed, rank and scale, the layers it spans) and the same head. Anything else is refused
with the fields that differ (:func:`check_comparable`). Reference: *A Study on PAVE Specification for Learnware*
(ICLR 2026), spec ``other_seeds.md`` §2.

Example:
    >>> import numpy as np
    >>> ident = {"base": "b", "base_sha256": "0" * 64, "projection_seed": 1, "rank": 2}
    >>> a = PaveVector("model", ident, np.array([3.0, 4.0]))
    >>> round(float(a.vector[1]), 2)
    0.8
    >>> PaveVector.from_dict(a.to_dict()).identity_hash == a.identity_hash
    True
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

FORMAT = "veil-pave-spec"
VERSION = 1
SPEC_FILE = "pave.json"  # beside veil.json
ADAPTER_SPEC_DIR = "pave"  # <model>/pave/<adapter id>.json
MAX_DIM = 1 << 22  # 4 Mi floats (16 MiB): far above any spec veil fits, bounds what a reader allocates
REQUIRED_IDENTITY = ("base", "base_sha256", "projection_seed", "rank")
KINDS = ("model", "user")
_FIELDS = ("dim", "fit", "format", "identity", "identity_hash", "kind", "vector_b64", "version")


class SpecFormatError(ValueError):
    """A spec is malformed: the message names the field, the expected and the received value (HTTP 400)."""

    status_code = 400


class SpecMismatch(ValueError):
    """Two specs are not comparable (different base, projection seed, rank...): the message names the fields (400)."""

    status_code = 400


def _short(value: Any, n: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= n else text[:n] + "..."


def identity_hash(identity: Mapping[str, Any]) -> str:
    """SHA-256 hex of the canonical JSON of ``identity`` (sorted keys, no spaces)."""
    return hashlib.sha256(json.dumps(identity, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def check_identity(identity: Any, what: str = "identity") -> dict[str, Any]:
    """The identity as a plain JSON dict, or SpecFormatError naming the missing or ill-typed field."""
    if not isinstance(identity, Mapping):
        raise SpecFormatError(f"{what}: expected a JSON object, received {type(identity).__name__}")
    for key in REQUIRED_IDENTITY:
        if key not in identity:
            raise SpecFormatError(f"{what}.{key}: expected a value, received none (required: {list(REQUIRED_IDENTITY)})")
    if not isinstance(identity["base"], str) or not identity["base"]:
        raise SpecFormatError(f"{what}.base: expected a non-empty string, received {_short(identity['base'])}")
    digest = identity["base_sha256"]
    if not isinstance(digest, str) or len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
        raise SpecFormatError(f"{what}.base_sha256: expected 64 lower-case hex digits, received {_short(digest)}")
    for key in ("projection_seed", "rank"):
        value = identity[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < (1 if key == "rank" else 0):
            raise SpecFormatError(f"{what}.{key}: expected an int >= {1 if key == 'rank' else 0}, received {_short(value)}")
    try:
        return json.loads(json.dumps(dict(identity), sort_keys=True))
    except (TypeError, ValueError) as exc:
        raise SpecFormatError(f"{what}: expected JSON values, received {exc}") from None


def normalise(vector: Any, what: str = "vector") -> np.ndarray:
    """``vector`` as a float32 array of L2 norm 1; SpecFormatError for non-finite, empty or zero vectors."""
    x = np.asarray(vector, dtype=np.float64)
    if x.ndim != 1 or not 1 <= x.size <= MAX_DIM:
        raise SpecFormatError(f"{what}: expected a 1-D vector of 1..{MAX_DIM} values, received shape {x.shape}")
    if not np.all(np.isfinite(x)):
        raise SpecFormatError(f"{what}: expected finite values, received NaN or inf")
    norm = float(np.linalg.norm(x))
    if norm == 0.0:
        raise SpecFormatError(f"{what}: expected a non-zero vector, received all zeros")
    return (x / norm).astype(np.float32)


@dataclasses.dataclass(frozen=True)
class PaveVector:
    """One PAVE specification: ``kind`` (model or user), its ``identity``, the unit ``vector`` and ``fit`` notes.

    The vector is normalised on construction, so a dot product of two comparable specs is their cosine.
    """

    kind: str
    identity: dict[str, Any]
    vector: np.ndarray
    fit: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise SpecFormatError(f"kind: expected one of {list(KINDS)}, received {_short(self.kind)}")
        object.__setattr__(self, "identity", check_identity(self.identity))
        object.__setattr__(self, "vector", normalise(self.vector))
        if not isinstance(self.fit, Mapping):
            raise SpecFormatError(f"fit: expected a JSON object, received {type(self.fit).__name__}")

    @property
    def identity_hash(self) -> str:
        return identity_hash(self.identity)

    @property
    def dim(self) -> int:
        return int(self.vector.size)

    def settings(self) -> dict[str, Any]:
        """What a recommendation answer reports about the spec: identity, its hash, the dimension."""
        return {"identity": self.identity, "identity_hash": self.identity_hash, "dim": self.dim}

    def to_dict(self) -> dict[str, Any]:
        raw = np.ascontiguousarray(self.vector, dtype="<f4").tobytes()
        return {"format": FORMAT, "version": VERSION, "kind": self.kind, "identity": self.identity,
                "identity_hash": self.identity_hash, "dim": self.dim,
                "vector_b64": base64.b64encode(raw).decode(), "fit": dict(self.fit)}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1, sort_keys=True)

    @classmethod
    def from_dict(cls, data: Any, what: str = "spec") -> PaveVector:
        """Parse and check :meth:`to_dict` output (untrusted input: every field is checked, nothing unknown kept).

        Raises:
            SpecFormatError: naming the field, the expected and the received value.
        """
        if not isinstance(data, Mapping):
            raise SpecFormatError(f"{what}: expected a JSON object, received {type(data).__name__}")
        unknown, missing = sorted(set(data) - set(_FIELDS)), sorted(set(_FIELDS) - set(data))
        if unknown or missing:
            raise SpecFormatError(f"{what}: expected exactly the fields {list(_FIELDS)}, received unknown "
                                  f"{[str(k)[:40] for k in unknown[:8]]} and missing {missing}")
        if data["format"] != FORMAT:
            raise SpecFormatError(f"{what}.format: expected {FORMAT!r}, received {_short(data['format'])}")
        if data["version"] != VERSION or isinstance(data["version"], bool):
            raise SpecFormatError(f"{what}.version: expected {VERSION}, received {_short(data['version'])}")
        dim = data["dim"]
        if isinstance(dim, bool) or not isinstance(dim, int) or not 1 <= dim <= MAX_DIM:
            raise SpecFormatError(f"{what}.dim: expected an int in 1..{MAX_DIM}, received {_short(dim)}")
        text = data["vector_b64"]
        if not isinstance(text, str) or len(text) != 4 * ((4 * dim + 2) // 3):
            raise SpecFormatError(f"{what}.vector_b64: expected the base64 of {dim} float32 values "
                                  f"({4 * ((4 * dim + 2) // 3)} characters), received "
                                  f"{len(text) if isinstance(text, str) else type(text).__name__}")
        try:
            raw = base64.b64decode(text, validate=True)
        except ValueError as exc:
            raise SpecFormatError(f"{what}.vector_b64: expected base64, received invalid text ({exc})") from None
        vector = np.frombuffer(raw, dtype="<f4")
        try:
            spec = cls(data["kind"], check_identity(data["identity"], f"{what}.identity"),
                       normalise(vector, f"{what}.vector_b64"), data["fit"])
        except SpecFormatError as exc:
            msg = str(exc)
            raise SpecFormatError(msg if msg.startswith(what) else f"{what}.{msg}") from None
        if data["identity_hash"] != spec.identity_hash:
            raise SpecFormatError(f"{what}.identity_hash: expected {spec.identity_hash} (of the identity), "
                                  f"received {_short(data['identity_hash'])}")
        return spec

    @classmethod
    def from_json(cls, text: str | bytes, what: str = "spec") -> PaveVector:
        try:
            data = json.loads(text)
        except (ValueError, RecursionError) as exc:
            raise SpecFormatError(f"{what}: expected JSON, received unparsable text ({exc})") from None
        return cls.from_dict(data, what)


def check_comparable(user: PaveVector | Mapping[str, Any], model: PaveVector, name: str = "model") -> None:
    """Refuse comparing vectors of different identities (base, projection seed, rank, layers, head).

    ``user`` is a spec or an identity dict. The message names every differing field with both values.

    Raises:
        SpecMismatch: the identities differ, or the dimensions do.
    """
    ident = user.identity if isinstance(user, PaveVector) else dict(user)
    if ident != model.identity:
        keys = sorted(set(ident) | set(model.identity))
        diff = [f"identity.{k}: expected {_short(model.identity.get(k), 70)} ({name}), received "
                f"{_short(ident.get(k), 70)}" for k in keys if ident.get(k) != model.identity.get(k)]
        raise SpecMismatch(f"spec not comparable with {name} (PAVE vectors from different bases or projections "
                           f"cannot be matched): " + "; ".join(diff))
    if isinstance(user, PaveVector) and user.dim != model.dim:
        raise SpecMismatch(f"dim: expected {model.dim} ({name}), received {user.dim}")


def spec_paths(repo: str | os.PathLike[str], model: str) -> list[tuple[str, Path]]:
    """The spec files of one model folder: ``(model, pave.json)`` and ``(model:adapter, pave/<adapter>.json)``,
    those that exist, sorted."""
    folder = Path(repo) / model
    out = [(model, folder / SPEC_FILE)] if (folder / SPEC_FILE).is_file() else []
    if (folder / ADAPTER_SPEC_DIR).is_dir():
        out += [(f"{model}:{p.stem}", p) for p in sorted((folder / ADAPTER_SPEC_DIR).glob("*.json")) if p.is_file()]
    return out


def rank_models(user: PaveVector, models: Mapping[str, PaveVector]) -> list[tuple[str, float]]:
    """Models by cosine similarity to ``user``, best first (ties by name); every model must be comparable."""
    for name, spec in models.items():
        check_comparable(user, spec, name)
    scores = [(name, float(np.dot(user.vector.astype(np.float64), spec.vector.astype(np.float64))))
              for name, spec in models.items()]
    return sorted(scores, key=lambda t: (-t[1], t[0]))
