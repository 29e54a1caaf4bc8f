"""Private PAVE matching: the client's unit spec vector under CKKS, encrypted dot products with every model's vector
on the server, the ranking decrypted by the client alone. Torch-free (numpy, tenseal).

Protocol (keys once, then one request and one answer per query; both are :mod:`veil.he.envelope` envelopes)::

    client, once: evaluation keys (relinearization + Galois keys, no secret key) -> POST /v2/he/keys
            -> {key_id, key_secret} (the server's :class:`~veil.he.keystore.KeyStore`, as for encrypted inference)
    client: u (unit, D values) -> C = ceil(D / slots) fresh ciphertexts, nothing else
            envelope kind "pave-query", key_id, meta {identity, identity_hash, dim, key_secret}
    server: the keys registered under key_id (owner's key_secret), then for every model m (unit vector v_m):
            s_m = RotSum( sum_c ct_c * v_m[c] ) * e_m     (2 levels)
            one ciphertext, slot m = <u, v_m> = cos(u, v_m); envelope kind "pave-scores", meta {models, ...}
    client: decrypt, read slots 0..M-1, rank

"One rotation-sum per model": ``log2(slots)`` rotations by powers of two put the sum in every slot, the one-hot
mask ``e_m`` keeps it in slot m only, so the answer is one ciphertext for all models and the server learns neither
``u`` nor any score. Weights are encoded at the scale of the prime the next rescale drops, so every rescale lands
back on exactly ``params.scale`` (as in :mod:`veil.he.evaluate`).

Example:
    >>> client = PrivateRecommendClient(user_spec)                   # a fresh secret keyring
    >>> client.register("http://127.0.0.1:8000")                     # POST /v2/he/keys, once (~8.5 MiB)
    >>> ranking = client.rank("http://127.0.0.1:8000")               # POST /v2/recommend: ciphertexts only
    >>> body = client.query()                                        # or by hand: the octet-stream request,
    >>> ranking = client.ranking(response_body)                      # [(model, cosine), ...] best first
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import tenseal.sealapi as sa
from veil.he.envelope import open_envelope, seal_envelope
from veil.he.errors import EnvelopeError, KeyringError, MismatchError, ParameterError
from veil.he.evaluate import Chain
from veil.he.galois import max_bundle_bytes
from veil.he.keys import EvaluationKeys, SecretKeyring
from veil.he.params import CkksParameters, select_parameters
from veil.he.serialize import ciphertexts_from_bytes, ciphertexts_to_bytes
from veil.pave import PaveVector, SpecFormatError, check_identity, identity_hash

if TYPE_CHECKING:
    from veil.he.keystore import KeyStore

KIND_QUERY, KIND_SCORES = "pave-query", "pave-scores"
PLAN = "pave-cosine-v1"  # what the envelopes' plan_hash binds: this circuit, for one spec identity
LEVELS = 2  # plaintext multiply by v_m, plaintext multiply by the mask
PRECISION_BITS = 25  # fractional bits after a multiply: score errors ~1e-6 at D = 1e4 (ranking gaps are larger)
_QUERY_META = ("dim", "identity", "identity_hash", "key_secret")


def recommend_parameters() -> CkksParameters:
    """The 128-bit CKKS set of private matching: 2 levels at 25 bits (N = 8192, 4096 slots)."""
    return select_parameters(levels=LEVELS, precision_bits=PRECISION_BITS)


def galois_steps(params: CkksParameters) -> list[int]:
    """The rotation steps of a full rotation-sum: 1, 2, 4, ..., slots/2."""
    return [1 << k for k in range(int(math.log2(params.slots)))]


def chunk_count(dim: int, params: CkksParameters) -> int:
    """Ciphertexts one D-dimensional vector takes (``slots`` values each)."""
    return -(-dim // params.slots)


def plan_hash(identity_sha: str) -> str:
    """The envelopes' plan binding: the circuit and the spec identity (a query for one base is never
    answered with scores of another)."""
    return f"{PLAN}:{identity_sha}"


class PrivateRecommendClient:
    """The user's side: a secret keyring, its registration, the encrypted query, the decrypted ranking. The secret
    key never leaves it; the evaluation keys go to the server once (:meth:`register`), each query carries only
    its ciphertexts and the key id and secret of that registration.

    Args:
        spec: the user's PAVE spec (its identity binds the request).
        keyring: an existing keyring for :func:`recommend_parameters` (default: a fresh one).
        key_secret: the secret returned when this keyring's evaluation keys were registered (a client for another
            spec with the same keyring reuses that registration); None: call :meth:`register` first.
    """

    def __init__(self, spec: PaveVector, keyring: SecretKeyring | None = None, key_secret: str | None = None) -> None:
        self.spec = spec
        self.params = recommend_parameters()
        if keyring is not None and (keyring.params != self.params or
                                    not set(galois_steps(self.params)) <= set(keyring.galois_steps)):
            raise ParameterError(f"keyring: expected parameters {self.params.to_dict()} with steps "
                                 f"{galois_steps(self.params)}, received {keyring.params.to_dict()} with steps "
                                 f"{list(keyring.galois_steps)}")
        self.keyring = keyring or SecretKeyring.generate(self.params, galois_steps(self.params))
        self.key_secret = key_secret
        self.last_request_bytes = 0  # bytes of the last query :meth:`rank` sent
        self._bundle: bytes | None = None

    def evaluation_keys(self) -> bytes:
        """The evaluation-key bundle (relinearization + Galois keys, no secret key) that :meth:`register` uploads."""
        if self._bundle is None:
            self._bundle = self.keyring.evaluation_keys().to_bytes()
        return self._bundle

    @property
    def key_id(self) -> str:
        """The key store's id of the evaluation keys (SHA-256 of their bundle), known before registering."""
        return hashlib.sha256(self.evaluation_keys()).hexdigest()

    def register(self, target: str | KeyStore, timeout: float = 600.0) -> dict[str, Any]:
        """Register the evaluation keys once: ``POST {target}/v2/he/keys`` for a server URL, or a
        :class:`~veil.he.keystore.KeyStore` in this process. Registering again renews them (their TTL) with the
        secret held.

        Returns:
            ``{"key_id", "key_secret", "bytes"}`` (key_secret None when renewing: the held one stays valid).

        Raises:
            ServerError: the server refused (its HTTP status and error text), e.g. another owner's keys.
            SecretKeyRefused, KeyAccessDenied, QuotaExceeded: the in-process store refused.
        """
        bundle = self.evaluation_keys()
        if isinstance(target, str):
            from veil.he.client import _request

            headers = {"Content-Type": "application/octet-stream"}
            if self.key_secret:
                headers["Authorization"] = f"Bearer {self.key_secret}"
            body, _ = _request(target.rstrip("/") + "/v2/he/keys", bundle, headers, timeout=timeout)
            answer = json.loads(body)
            key_id, key_secret, size = answer["key_id"], answer.get("key_secret"), answer.get("bytes", len(bundle))
        else:
            reg = target.register(bundle, source="local", key_secret=self.key_secret)
            key_id, key_secret, size = reg.key_id, reg.key_secret, reg.size
        if key_id != self.key_id:
            raise EnvelopeError(f"key_id: expected the SHA-256 of the uploaded keys ({self.key_id}), received "
                                f"{str(key_id)[:80]!r}")
        self.key_secret = key_secret or self.key_secret
        return {"key_id": key_id, "key_secret": key_secret, "bytes": size}

    def query(self) -> bytes:
        """The request body: the encrypted unit vector and the registration's key id and secret, in one
        ``pave-query`` envelope (no keys: about 160 KiB per 4096 dimensions).

        Raises:
            KeyringError: the evaluation keys are not registered yet (call :meth:`register` first).
        """
        if not self.key_secret:
            raise KeyringError("key_secret: expected the secret of a registration, received none; call "
                               "PrivateRecommendClient.register(url) first (POST /v2/he/keys, once per keyring)")
        slots, u = self.params.slots, self.spec.vector.astype(np.float64)
        cts = self.keyring.encrypt_to_bytes([u[i:i + slots] for i in range(0, u.size, slots)])
        return seal_envelope(cts, kind=KIND_QUERY, key_id=self.key_id, params_hash=self.params.hash(),
                             plan_hash=plan_hash(self.spec.identity_hash),
                             meta={"identity": self.spec.identity, "identity_hash": self.spec.identity_hash,
                                   "dim": self.spec.dim, "key_secret": self.key_secret})

    def rank(self, url: str, timeout: float = 600.0) -> list[tuple[str, float]]:
        """Register the keys if not yet, POST one query to ``{url}/v2/recommend``, decrypt: models best first.

        Raises:
            ServerError: the server refused (its HTTP status and error text; 404/410: register again).
        """
        from veil.he.client import _request

        if not self.key_secret:
            self.register(url, timeout)
        self.last_request_bytes = len(body := self.query())
        answer, _ = _request(url.rstrip("/") + "/v2/recommend", body,
                             {"Content-Type": "application/octet-stream"}, timeout=timeout)
        return self.ranking(answer)

    def scores(self, body: bytes) -> tuple[list[str], np.ndarray]:
        """(model names, cosine scores) from the server's ``pave-scores`` envelope.

        Raises:
            EnvelopeError: not an answer to this client's query (kind, key, parameters or identity differ).
        """
        env = open_envelope(body, expect_kind=KIND_SCORES, expect_key_id=self.key_id,
                            expect_params_hash=self.params.hash(), expect_plan_hash=plan_hash(self.spec.identity_hash))
        models = env.meta.get("models")
        if not isinstance(models, list) or not all(isinstance(m, str) for m in models) or len(models) > self.params.slots:
            raise EnvelopeError(f"envelope.meta.models: expected a list of <= {self.params.slots} model names, "
                                f"received {str(models)[:80]}")
        [ct] = ciphertexts_from_bytes(self.params, env.payload, max_count=1)
        values = self.keyring.decrypt([ct])[0]
        return models, values[:len(models)]

    def ranking(self, body: bytes) -> list[tuple[str, float]]:
        """Models by decrypted cosine, best first (ties by name)."""
        names, values = self.scores(body)
        return sorted(((n, float(v)) for n, v in zip(names, values, strict=True)), key=lambda t: (-t[1], t[0]))


def open_query(body: bytes, max_dim: int) -> tuple[dict[str, Any], int, list[sa.Ciphertext], str, str]:
    """Server side: parse and check a ``pave-query`` envelope before any evaluation.

    Returns:
        (identity, dim, fresh ciphertexts, key id, key secret): look the keys up with :func:`registered_keys`.

    Raises:
        EnvelopeError, MalformedCiphertext, ParameterError: naming the field that is wrong (400); a query that
            still carries its evaluation keys (``meta.lengths``, before issue 33) is refused naming the fix.
        SpecFormatError: the stated identity is malformed.
    """
    params = recommend_parameters()
    env = open_envelope(body, expect_kind=KIND_QUERY, expect_params_hash=params.hash())
    meta = env.meta
    if "lengths" in meta and "key_secret" not in meta:
        raise EnvelopeError("envelope.meta.key_secret: expected the secret returned by POST /v2/he/keys, received "
                            "a query carrying its evaluation keys (meta.lengths); register the keys once "
                            "(PrivateRecommendClient.register) and send only the ciphertexts")
    if sorted(meta) != sorted(_QUERY_META):
        raise EnvelopeError(f"envelope.meta: expected exactly the fields {list(_QUERY_META)}, received "
                            f"{[str(k)[:40] for k in sorted(meta)][:8]}")
    key_secret = meta["key_secret"]
    if not isinstance(key_secret, str) or not key_secret:
        raise EnvelopeError(f"envelope.meta.key_secret: expected the secret returned by POST /v2/he/keys, received "
                            f"{'none' if key_secret in (None, '') else type(key_secret).__name__}")
    identity = check_identity(meta["identity"], "envelope.meta.identity")
    if meta["identity_hash"] != identity_hash(identity) or env.plan_hash != plan_hash(identity_hash(identity)):
        raise EnvelopeError(f"envelope.meta.identity_hash: expected {identity_hash(identity)} (of the identity, "
                            f"also in plan_hash), received {str(meta['identity_hash'])[:80]!r}")
    dim = meta["dim"]
    if isinstance(dim, bool) or not isinstance(dim, int) or not 1 <= dim <= max_dim:
        raise EnvelopeError(f"envelope.meta.dim: expected an int in 1..{max_dim}, received {str(dim)[:40]}")
    cts = ciphertexts_from_bytes(params, env.payload, max_count=chunk_count(dim, params), fresh=True)
    if len(cts) != chunk_count(dim, params):
        raise EnvelopeError(f"ciphertexts.count: expected {chunk_count(dim, params)} for dim {dim} at "
                            f"{params.slots} slots, received {len(cts)}")
    return identity, dim, cts, env.key_id, key_secret


def registered_keys(store: KeyStore, key_id: str, key_secret: str) -> EvaluationKeys:
    """The evaluation keys a query names, from the key store, checked for private matching.

    Raises:
        UnknownKey (404), ExpiredKey (410), KeyAccessDenied (403): as for encrypted inference.
        MismatchError: the keys are for other parameters or lack a rotation step (400).
    """
    keys = store.get(key_id, key_secret)
    params = recommend_parameters()
    if keys.params != params:
        raise MismatchError(f"key_id {key_id}: keys were made for parameters {keys.params.hash()[:12]}, private "
                            f"matching expects {params.hash()[:12]} (veil.he.recommend.recommend_parameters)")
    missing = sorted(set(galois_steps(params)) - set(keys.galois_steps))
    if missing:
        raise MismatchError(f"key_id {key_id}: Galois keys for steps {missing} are missing (private matching "
                            f"needs {galois_steps(params)})")
    return keys


def key_bundle_limit() -> int:
    """The most bytes a private-matching key bundle takes (what ``POST /v2/he/keys`` must accept for it)."""
    params = recommend_parameters()
    return max_bundle_bytes(params, galois_steps(params))


def encrypted_scores(keys: EvaluationKeys, cts: Sequence[sa.Ciphertext], matrix: np.ndarray) -> sa.Ciphertext:
    """One ciphertext whose slot m holds ``<u, matrix[m]>`` (``u`` encrypted in ``cts``); no secret key involved.

    Args:
        keys: the client's evaluation keys (Galois keys for every power-of-two step).
        cts: the client's fresh ciphertexts, ``slots`` values of ``u`` each.
        matrix: (M, D) float model vectors, M <= slots, D <= len(cts) * slots.

    Raises:
        MismatchError: the shapes do not fit the ciphertexts.
    """
    params = keys.params
    chain, slots = Chain(params), params.slots
    ev = chain.evaluator
    matrix = np.asarray(matrix, dtype=np.float64)
    if matrix.ndim != 2 or not 1 <= matrix.shape[0] <= slots or matrix.shape[1] > len(cts) * slots:
        raise MismatchError(f"matrix: expected (M <= {slots}, D <= {len(cts) * slots}), received {matrix.shape}")
    padded = np.zeros((matrix.shape[0], len(cts) * slots))
    padded[:, :matrix.shape[1]] = matrix
    total = None
    for m, row in enumerate(padded):
        acc = None
        for c, ct in enumerate(cts):
            part = row[c * slots:(c + 1) * slots]
            if not part.any():
                continue
            term = sa.Ciphertext()
            ev.multiply_plain(ct, chain.encode(part, 0, chain.primes[0]), term)  # (slots,) u_c * v_m,c
            if acc is None:
                acc = term
            else:
                ev.add_inplace(acc, term)
        if acc is None:  # an all-zero row scores 0: nothing to add
            continue
        chain.rescale(acc)  # scale q0 * Delta / q0 = Delta, level 1
        for step in galois_steps(params):  # every slot <- sum of all slots
            rotated = sa.Ciphertext()
            ev.rotate_vector(acc, step, keys.galois.key_for(step), rotated)
            ev.add_inplace(acc, rotated)
        mask = np.zeros(slots)
        mask[m] = 1.0
        ev.multiply_plain_inplace(acc, chain.encode(mask, 1, chain.primes[1]))  # keep slot m only
        chain.rescale(acc)  # level 2, scale Delta
        if total is None:
            total = acc
        else:
            ev.add_inplace(total, acc)
    if total is None:
        raise MismatchError("matrix: expected at least one non-zero model vector, received only zeros")
    return total


def seal_scores(ct: sa.Ciphertext, models: list[str], key_id: str, identity: dict[str, Any]) -> bytes:
    """The ``pave-scores`` envelope: one ciphertext, the model order, bound to the query's key and identity."""
    params = recommend_parameters()
    digest = identity_hash(identity)
    return seal_envelope(ciphertexts_to_bytes([ct]), kind=KIND_SCORES, key_id=key_id, params_hash=params.hash(),
                         plan_hash=plan_hash(digest), meta={"models": list(models), "identity_hash": digest})


__all__ = ["KIND_QUERY", "KIND_SCORES", "PrivateRecommendClient", "SpecFormatError", "chunk_count",
           "encrypted_scores", "galois_steps", "key_bundle_limit", "open_query", "recommend_parameters",
           "registered_keys", "seal_scores"]
