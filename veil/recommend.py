"""`veil recommend`: which of a repository's models fits my few labelled examples (PAVE specs).

The user's spec is fitted locally on the repository's shared base (:mod:`veil.training.pave`); the ranking is
computed locally, or by a server (`--url`), in plaintext or privately (`--private`: the vector is CKKS-encrypted
with :mod:`veil.he.recommend`, the server sees no score). Prints JSON (the ranking and the spec settings) on stdout.
This front-door module joins the two rooms, so training never imports he.

Example:
    >>> from veil.recommend import recommend
    >>> recommend("models", texts, labels, url="http://127.0.0.1:8000", private=True)["ranking"][:3]
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from veil.pave import PaveVector, rank_models


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
    from veil.training.pave.fit import user_spec
    from veil.training.pave.recommend import base_for, repository_specs

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


EXAMPLE = """example:
  veil export finetuned runs/lora-sentiment --repo models --name sentiment --spec
  veil recommend --repo models --data few_shots.jsonl            # lines: {"text": "...", "label": 1}
  veil serve --repo models &  veil recommend --repo models --data few_shots.jsonl --url http://127.0.0.1:8000 --private
"""


def build_parser(prog: str = "veil recommend") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0], epilog=EXAMPLE,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repo", type=Path, required=True, help="model repository folder with PAVE specs")
    parser.add_argument("--data", type=Path, required=True, help="JSONL of {\"text\": str, \"label\": int} (e.g. 32 lines)")
    parser.add_argument("--url", default=None, help="a `veil serve` of the repository: rank there (POST /v2/recommend)")
    parser.add_argument("--private", action="store_true", help="encrypt the spec vector (CKKS, 128-bit)")
    parser.add_argument("--top-k", type=int, default=None, help="print only the best K models")
    parser.add_argument("--base", default=None, help="the base's transformers folder (default: the bundled MiniLM)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.top_k is not None and args.top_k < 1:
        raise ValueError(f"--top-k: expected an int >= 1, received {args.top_k}")
    from veil.training.pave.recommend import read_few_shots

    texts, labels = read_few_shots(args.data)
    print(json.dumps(recommend(args.repo, texts, labels, url=args.url, private=args.private, top_k=args.top_k,
                               base=args.base), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
