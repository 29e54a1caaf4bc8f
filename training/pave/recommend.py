"""Which of a repository's models fits my data: the user side of ``veil recommend`` and its Python entry point.

The user's spec is fitted here, on the user's machine, with exactly the settings of the repository's specs (read
from their identity) on the same base (its weight hash is checked); then the models are ranked locally, or by a
server's ``POST /v2/recommend`` in plaintext or privately (CKKS: the server sees neither the vector nor a score).

Example:
    >>> from veil.training.pave.recommend import recommend
    >>> recommend("models", texts, labels, url="http://127.0.0.1:8000", private=True)["ranking"][:3]
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from veil.he.recommend_spec import PaveVector, SpecFormatError, SpecMismatch, rank_models, spec_paths

from .base import SpecBase
from .config import PaveConfig
from .fit import user_spec


def repository_specs(repo: str | Path) -> dict[str, PaveVector]:
    """Every model spec of a repository folder (``<model>/pave.json``, ``<model>/pave/<adapter>.json``).

    Raises:
        FileNotFoundError: the folder does not exist or holds no spec.
        SpecFormatError: a spec file is malformed (the message names the file and the field).
    """
    repo = Path(repo)
    if not repo.is_dir():
        raise FileNotFoundError(f"--repo: expected a model repository folder, received {str(repo)!r}")
    specs = {}
    for folder in sorted(p for p in repo.iterdir() if p.is_dir() and not p.name.startswith(".")):
        for name, path in spec_paths(repo, folder.name):
            specs[name] = PaveVector.from_json(path.read_bytes(), what=str(path.relative_to(repo)))
    if not specs:
        raise FileNotFoundError(f"--repo {repo}: expected PAVE specs (<model>/pave.json, written by `veil export ... "
                                "--spec`), received none")
    return specs


def config_from_identity(identity: dict[str, Any], **fit: Any) -> PaveConfig:
    """The PaveConfig that reproduces ``identity`` (rank, seed, scale, layers, targets, head); ``fit`` sets the rest."""
    try:
        names = [t.split(".", 3) for t in identity["targets"]]  # encoder.layer.<i>.<relative name>
        layers = sorted({int(n[2]) for n in names})
        targets = list(dict.fromkeys(n[3] for n in names))
        return PaveConfig(rank=identity["rank"], projection_seed=identity["projection_seed"], scale=identity["scale"],
                          layers=len(layers), targets=targets, num_outputs=identity["num_outputs"],
                          head_seed=identity["head_seed"], **fit)
    except (KeyError, IndexError, ValueError, TypeError) as exc:
        raise SpecFormatError(f"identity: expected the fields of a veil.training.pave spec (targets, rank, "
                              f"projection_seed, scale, num_outputs, head_seed), received {sorted(identity)} ({exc})") from None


def base_for(identity: dict[str, Any], base: str | None = None, **fit: Any) -> SpecBase:
    """The spec base of ``identity`` (the bundled MiniLM, or the transformers folder ``base``), hash-checked.

    Raises:
        SpecMismatch: the loaded base's weights are not the ones the repository's specs were fitted on.
    """
    from veil.training.adapters.finetune import load_encoder

    config = config_from_identity(identity, **fit)
    if base is None and identity["base"] == "all-MiniLM-L6-v2":
        spec_base = SpecBase.bundled(config)
    elif base is None:
        raise ValueError(f"--base: expected the folder of the base {identity['base']!r} the repository's specs were "
                         "fitted on, received none")
    else:
        encoder, tokenizer = load_encoder(base)
        spec_base = SpecBase(identity["base"], encoder, tokenizer, config)
    if spec_base.identity != identity:
        diff = sorted(k for k in set(identity) | set(spec_base.identity) if identity.get(k) != spec_base.identity.get(k))
        raise SpecMismatch(f"base: the loaded base differs from the repository's spec base in {diff} (e.g. "
                           f"base_sha256 expected {identity['base_sha256']}, received {spec_base.base_sha256})")
    return spec_base


def _post(url: str, body: bytes, content_type: str, timeout: float) -> bytes:
    req = urllib.request.Request(url.rstrip("/") + "/v2/recommend", data=body, method="POST",
                                 headers={"Content-Type": content_type})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.read()
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode(errors="replace")[:500]
        raise ValueError(f"POST {url}/v2/recommend: HTTP {exc.code}: {detail}") from None


def recommend(repo: str | Path, texts: Sequence[str], labels: Sequence[int], *, url: str | None = None,
              private: bool = False, top_k: int | None = None, base: str | None = None,
              timeout: float = 600.0) -> dict[str, Any]:
    """Rank the repository's models for the task of ``texts`` / ``labels`` (a user's few labelled examples).

    Args:
        repo: the model repository folder (its specs give the spec settings; ranked locally without ``url``).
        url: a ``veil serve`` of that repository: rank there (``POST /v2/recommend``).
        private: encrypt the user's vector (CKKS, 128-bit); the ranking is decrypted here.
        top_k: keep the best ``top_k``.
        base: the base's transformers folder when it is not the bundled MiniLM.

    Returns:
        ``{"spec": {identity, identity_hash, dim}, "ranking": [{"model", "score"}...], "mode": ...}``; private
        mode adds ``"bytes": {"keys", "query"}``: the evaluation keys registered once, the query sent.
    """
    specs = repository_specs(repo)
    identity = next(iter(specs.values())).identity
    spec = user_spec(base_for(identity, base), texts, labels)
    mode = ("server" if url else "local") + (", private (CKKS)" if private else "")
    sent: dict[str, int] = {}
    if private:
        ranking, sent = _private_ranking(spec, specs, url, timeout)
    elif url:
        body = json.dumps({"spec": spec.to_dict(), **({"top_k": top_k} if top_k else {})}).encode()
        data = json.loads(_post(url, body, "application/json", timeout))
        ranking = [(r["model"], r["score"]) for r in data["ranking"]]
    else:
        ranking = rank_models(spec, {n: s for n, s in specs.items() if s.identity == spec.identity})
    return {"spec": spec.settings(), "mode": mode,
            "ranking": [{"model": n, "score": round(float(s), 6)} for n, s in ranking[:top_k]],
            **({"bytes": sent} if private else {})}


def _private_ranking(spec: PaveVector, specs: dict[str, PaveVector], url: str | None,
                     timeout: float) -> tuple[list[tuple[str, float]], dict[str, int]]:
    """The private protocol: register the evaluation keys once, send the ciphertexts, decrypt the scores; against
    ``url``, or in-process (a temporary key store and what the server runs) without one."""
    import tempfile

    from veil.he.keystore import KeyStore
    from veil.he.recommend import (
        PrivateRecommendClient,
        encrypted_scores,
        open_query,
        registered_keys,
        seal_scores,
    )

    client = PrivateRecommendClient(spec)
    if url:
        keys = client.register(url, timeout)["bytes"]
        return client.rank(url, timeout), {"keys": keys, "query": client.last_request_bytes}
    with tempfile.TemporaryDirectory(prefix="veil-pave-keys-") as folder:
        store = KeyStore(Path(folder), quota_bytes=2**30, ttl_seconds=3600)
        keys = client.register(store)["bytes"]
        query = client.query()
        same = {n: s for n, s in specs.items() if s.identity == spec.identity}
        ident, _, cts, key_id, key_secret = open_query(query, max_dim=spec.dim)
        names = sorted(same)
        ct = encrypted_scores(registered_keys(store, key_id, key_secret), cts, np.stack([same[n].vector for n in names]))
        answer = seal_scores(ct, names, key_id, ident)
    return client.ranking(answer), {"keys": keys, "query": len(query)}


def read_few_shots(path: str | Path) -> tuple[list[str], list[int]]:
    """A JSONL file of ``{"text": str, "label": int}`` lines -> (texts, labels).

    Raises:
        ValueError: a line that is not such an object (the message names the line).
    """
    texts, labels = [], []
    for i, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{i}: expected a JSON object, received invalid JSON ({exc.msg})") from None
        if not isinstance(row, dict) or not isinstance(row.get("text"), str) or isinstance(row.get("label"), bool) \
                or not isinstance(row.get("label"), int):
            raise ValueError(f"{path}:{i}: expected {{\"text\": str, \"label\": int}}, received {line[:80]!r}")
        texts.append(row["text"])
        labels.append(row["label"])
    if not texts:
        raise ValueError(f"{path}: expected at least one labelled example, received none")
    return texts, labels
