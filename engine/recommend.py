"""``POST /v2/recommend``: rank the repository's models for a user's PAVE spec, in plaintext or encrypted.

The repository's specs are the files export writes beside each served model: ``<repo>/<model>/pave.json``, and
``<repo>/<model>/pave/<adapter>.json`` for the adapters of a multi-adapter model (ranked as ``<model>:<adapter>``).
Only loaded models are ranked; a spec file that does not parse is skipped, logged once per file version, and
named in the answer's ``skipped``.

Plaintext (``Content-Type: application/json``)::

    {"spec": <a user spec, veil.pave format>, "top_k": 5}      (top_k optional)
    -> {"spec": {identity, identity_hash, dim}, "ranking": [{"model", "score"}...], "models": M, "skipped": [...]}

Private (``Content-Type: application/octet-stream``): the client registers its evaluation keys once with
``POST /v2/he/keys`` (the key store of encrypted inference: owner secret, quota, TTL; accepted whenever a loaded model
has a PAVE spec), then each query is a ``pave-query`` envelope of :mod:`veil.he.recommend` (the encrypted unit vector,
the envelope's ``key_id`` and ``meta.key_secret``) -> a ``pave-scores`` envelope: one ciphertext, slot m the cosine
with model m; the model order is in its header. Key errors are those of encrypted inference: a missing
``key_secret`` 400, an unknown ``key_id`` 404, an expired one 410, another owner's 403. The server never sees the
vector or a score, and holds no secret key (the key store refuses keyrings and private contexts; the bundle's
container has no secret section; :class:`~veil.he.keys.EvaluationKeys` refuses anything else).

Specs of another base, projection seed or rank are not comparable: the request is refused (400) with the fields
that differ when no model of the repository shares the user's identity.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import orjson
from fastapi import Request
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response
from veil.pave import (
    MAX_DIM,
    PaveVector,
    SpecFormatError,
    SpecMismatch,
    check_comparable,
    rank_models,
    spec_paths,
)

from .errors import MalformedRequest
from .http import _json, _plane, read_body

log = logging.getLogger("veil.engine.recommend")
MAX_DEPTH = 32  # nesting of a spec's JSON (its identity is a flat object of a few settings)
MAX_JSON_BYTES = 8 * 2**20  # a plaintext request: a spec of up to ~1.5 M floats in base64
MAX_PRIVATE_CIPHERTEXTS = 16  # a private query: up to 16 x 4096 = 65536 dimensions
_FIELDS = ("spec", "top_k")


class SpecRegistry:
    """The specs of a repository's models, re-read when a file changes (mtime, size), broken ones skipped."""

    def __init__(self, repo: Path) -> None:
        self.repo = repo
        self._cache: dict[Path, tuple[tuple[int, int], PaveVector | None]] = {}

    def _read(self, path: Path) -> PaveVector | None:
        try:
            stat = path.stat()
        except FileNotFoundError:
            return None
        key = (stat.st_mtime_ns, stat.st_size)
        cached = self._cache.get(path)
        if cached is not None and cached[0] == key:
            return cached[1]
        try:
            spec = PaveVector.from_json(path.read_bytes(), what=str(path.relative_to(self.repo)))
            if spec.kind != "model":
                raise SpecFormatError(f"{path.name}.kind: expected 'model', received {spec.kind!r}")
        except (OSError, SpecFormatError) as exc:
            log.warning("skipping the PAVE spec %s: %s", path, exc)  # once per file version (cached below)
            spec = None
        self._cache[path] = (key, spec)
        return spec

    def specs(self, models: list[str]) -> tuple[dict[str, PaveVector], list[str]]:
        """(name -> spec, names of unreadable spec files) for the given loaded model names."""
        found, skipped = {}, []
        for model in sorted(models):
            for name, path in spec_paths(self.repo, model):
                spec = self._read(path)
                if spec is None:
                    skipped.append(name)
                else:
                    found[name] = spec
        return found, skipped


def registry(request: Request) -> SpecRegistry:
    state = request.app.state
    if getattr(state, "pave_specs", None) is None:
        state.pave_specs = SpecRegistry(Path(state.dataplane.repo))
    return state.pave_specs


def parse_request(body: bytes) -> tuple[PaveVector, int | None]:
    """The plaintext request body -> (user spec, top_k).

    Raises:
        MalformedRequest: invalid JSON, unknown or missing fields, a malformed spec, a bad top_k (400).
    """
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise MalformedRequest(f"request body: expected a JSON object, received invalid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise MalformedRequest(f"request body: expected a JSON object, received {type(data).__name__}")
    unknown = sorted(str(k)[:40] for k in set(data) - set(_FIELDS))
    if unknown:
        raise MalformedRequest(f"request body: expected only the fields {list(_FIELDS)}, received unknown {unknown[:8]}")
    if "spec" not in data:
        raise MalformedRequest("spec: expected a user PAVE spec (veil.pave format), received none")
    top_k = data.get("top_k")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
        raise MalformedRequest(f"top_k: expected an int >= 1, received {str(top_k)[:40]}")
    check_depth(data["spec"], "spec")
    try:
        spec = PaveVector.from_dict(data["spec"], "spec")
    except SpecFormatError as exc:
        raise MalformedRequest(str(exc)) from None
    if spec.kind != "user":
        raise MalformedRequest(f"spec.kind: expected 'user', received {spec.kind!r}")
    return spec, top_k


def check_depth(value: Any, where: str, limit: int = MAX_DEPTH) -> None:
    """Refuse JSON nested deeper than ``limit`` (walked with a stack, not recursion): comparing, hashing or
    printing a spec recurses, and ~990 levels of ``identity`` answered 500 RecursionError (issue 31 item 8).

    Raises:
        MalformedRequest: naming ``where``, the limit and that the value is deeper (400).
    """
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            if depth > limit:
                raise MalformedRequest(f"{where}: expected JSON nested at most {limit} levels deep, received "
                                       "deeper nesting")
            stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))


def comparable(identity: dict[str, Any], dim: int | None, specs: dict[str, PaveVector]) -> dict[str, PaveVector]:
    """The specs sharing ``identity``; none -> 400 naming what differs from the first model's identity.

    Raises:
        MalformedRequest: the repository has no spec, or none of the user's identity.
    """
    check_depth(identity, "spec.identity")
    if not specs:
        raise MalformedRequest("POST /v2/recommend: no loaded model of this repository has a PAVE spec "
                               "(export with `veil export ... --spec`)")
    same = {n: s for n, s in specs.items() if s.identity == identity}
    if not same:
        name, first = next(iter(specs.items()))
        try:
            check_comparable(identity, first, name)
        except SpecMismatch as exc:
            raise MalformedRequest(str(exc)) from None
    if dim is not None:
        bad = sorted(n for n, s in same.items() if s.dim != dim)
        if bad:
            raise MalformedRequest(f"spec.dim: expected {same[bad[0]].dim} ({bad[0]}), received {dim}")
    return same


def _body_limit(private: bool, app_limit: int) -> int:
    if not private:
        return min(app_limit, MAX_JSON_BYTES)
    from veil.he.recommend import recommend_parameters

    params = recommend_parameters()
    ct = 2 * params.poly_modulus_degree * (len(params.coeff_mod_bit_sizes) - 1) * 8 + 4096  # unseeded, worst case
    return min(app_limit, MAX_PRIVATE_CIPHERTEXTS * ct + 64 * 1024)  # ciphertexts only: keys are registered


def key_bundle_limit(plane: Any) -> int | None:
    """The largest private-matching key bundle ``POST /v2/he/keys`` takes: None when no loaded model has a spec."""
    from veil.he.recommend import key_bundle_limit as limit

    repo = Path(plane.repo)
    return limit() if any(spec_paths(repo, model) for model in plane.models) else None


async def recommend(request: Request) -> Response:
    """``POST /v2/recommend`` (see the module docstring)."""
    kind = request.headers.get("content-type", "application/json").partition(";")[0].strip().lower()
    if kind not in ("application/json", "application/octet-stream"):
        raise MalformedRequest(f"Content-Type: expected application/json (a spec) or application/octet-stream "
                               f"(a private pave-query envelope), received {kind[:60]!r}")
    private = kind == "application/octet-stream"
    body = await read_body(request, _body_limit(private, request.app.state.max_body_bytes),
                           "POST /v2/recommend's request limit" + ("; a private query carries its ciphertexts only, "
                                                                   "the evaluation keys go once to POST /v2/he/keys"
                                                                   if private else ""))
    plane = _plane(request)
    specs, skipped = registry(request).specs(list(plane.models))
    if not private:
        spec, top_k = parse_request(body)
        models = comparable(spec.identity, spec.dim, specs)
        ranking = rank_models(spec, models)[:top_k]
        return _json({"spec": spec.settings(), "ranking": [{"model": n, "score": s} for n, s in ranking],
                      "models": len(models), "skipped": skipped})
    return Response(await run_in_threadpool(_private, body, specs, plane.keystore()),
                    media_type="application/octet-stream")


def _private(body: bytes, specs: dict[str, PaveVector], store: Any) -> bytes:
    """Open the query, check it against the repository's identities, fetch its registered keys, evaluate, seal."""
    import numpy as np
    from veil.he.recommend import (
        encrypted_scores,
        open_query,
        recommend_parameters,
        registered_keys,
        seal_scores,
    )

    identity, dim, cts, key_id, key_secret = open_query(body, max_dim=min(MAX_DIM, MAX_PRIVATE_CIPHERTEXTS *
                                                                          recommend_parameters().slots))
    models = comparable(identity, dim, specs)
    keys = registered_keys(store, key_id, key_secret)
    names = sorted(models)
    ct = encrypted_scores(keys, cts, np.stack([models[n].vector for n in names]))
    return seal_scores(ct, names, key_id, identity)


__all__ = ["SpecRegistry", "comparable", "key_bundle_limit", "parse_request", "recommend"]
