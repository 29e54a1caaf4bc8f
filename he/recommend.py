"""Private PAVE matching: the client's unit spec vector under CKKS, encrypted dot products with every model's vector
on the server, the ranking decrypted by the client alone. Torch-free (numpy, tenseal).

Protocol (one request, one answer; both are :mod:`veil.he.envelope` envelopes)::

    client: u (unit, D values) -> C = ceil(D / slots) fresh ciphertexts + evaluation keys (no secret key)
            envelope kind "pave-query", meta {identity, identity_hash, dim, lengths}
    server: for every model m (unit vector v_m):  s_m = RotSum( sum_c ct_c * v_m[c] ) * e_m     (2 levels)
            one ciphertext, slot m = <u, v_m> = cos(u, v_m); envelope kind "pave-scores", meta {models, ...}
    client: decrypt, read slots 0..M-1, rank

"One rotation-sum per model": ``log2(slots)`` rotations by powers of two put the sum in every slot, the one-hot
mask ``e_m`` keeps it in slot m only, so the answer is one ciphertext for all models and the server learns neither
``u`` nor any score. Weights are encoded at the scale of the prime the next rescale drops, so every rescale lands
back on exactly ``params.scale`` (as in :mod:`veil.he.evaluate`).

Example:
    >>> client = PrivateRecommendClient(user_spec)                   # keys for this spec's dimension
    >>> body = client.query()                                        # POST /v2/recommend (octet-stream)
    >>> ranking = client.ranking(response_body)                      # [(model, cosine), ...] best first
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import tenseal.sealapi as sa
from veil.he.envelope import open_envelope, seal_envelope
from veil.he.errors import EnvelopeError, MismatchError, ParameterError
from veil.he.evaluate import Chain
from veil.he.keys import EvaluationKeys, SecretKeyring, max_bundle_bytes
from veil.he.params import CkksParameters, select_parameters
from veil.he.recommend_spec import PaveVector, SpecFormatError, check_identity, identity_hash
from veil.he.serialize import ciphertexts_from_bytes, ciphertexts_to_bytes, split_sections

KIND_QUERY, KIND_SCORES = "pave-query", "pave-scores"
PLAN = "pave-cosine-v1"  # what the envelopes' plan_hash binds: this circuit, for one spec identity
LEVELS = 2  # plaintext multiply by v_m, plaintext multiply by the mask
PRECISION_BITS = 25  # fractional bits after a multiply: score errors ~1e-6 at D = 1e4 (ranking gaps are larger)
_QUERY_META = ("dim", "identity", "identity_hash", "lengths")


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
    """The user's side: a secret keyring, the encrypted query, the decrypted ranking. The key never leaves it.

    Args:
        spec: the user's PAVE spec (its identity binds the request).
        keyring: an existing keyring for :func:`recommend_parameters` (default: a fresh one).
    """

    def __init__(self, spec: PaveVector, keyring: SecretKeyring | None = None) -> None:
        self.spec = spec
        self.params = recommend_parameters()
        if keyring is not None and (keyring.params != self.params or
                                    not set(galois_steps(self.params)) <= set(keyring.galois_steps)):
            raise ParameterError(f"keyring: expected parameters {self.params.to_dict()} with steps "
                                 f"{galois_steps(self.params)}, received {keyring.params.to_dict()} with steps "
                                 f"{list(keyring.galois_steps)}")
        self.keyring = keyring or SecretKeyring.generate(self.params, galois_steps(self.params))

    @property
    def key_id(self) -> str:
        return self.keyring.evaluation_keys().key_id

    def query(self) -> bytes:
        """The request body: the evaluation keys and the encrypted unit vector, in one ``pave-query`` envelope."""
        slots, u = self.params.slots, self.spec.vector.astype(np.float64)
        keys = self.keyring.evaluation_keys().to_bytes()
        cts = self.keyring.encrypt_to_bytes([u[i:i + slots] for i in range(0, u.size, slots)])
        return seal_envelope(keys + cts, kind=KIND_QUERY, key_id=self.key_id, params_hash=self.params.hash(),
                             plan_hash=plan_hash(self.spec.identity_hash),
                             meta={"identity": self.spec.identity, "identity_hash": self.spec.identity_hash,
                                   "dim": self.spec.dim, "lengths": [len(keys), len(cts)]})

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


def open_query(body: bytes, max_dim: int) -> tuple[dict[str, Any], int, EvaluationKeys, list[sa.Ciphertext], str]:
    """Server side: parse and check a ``pave-query`` envelope before any evaluation.

    Returns:
        (identity, dim, evaluation keys, fresh ciphertexts, key id).

    Raises:
        EnvelopeError, MalformedKeys, MalformedCiphertext, ParameterError: naming the field that is wrong.
        SpecFormatError: the stated identity is malformed.
    """
    params = recommend_parameters()
    env = open_envelope(body, expect_kind=KIND_QUERY, expect_params_hash=params.hash())
    meta = env.meta
    if sorted(meta) != sorted(_QUERY_META):
        raise EnvelopeError(f"envelope.meta: expected exactly the fields {list(_QUERY_META)}, received "
                            f"{[str(k)[:40] for k in sorted(meta)][:8]}")
    identity = check_identity(meta["identity"], "envelope.meta.identity")
    if meta["identity_hash"] != identity_hash(identity) or env.plan_hash != plan_hash(identity_hash(identity)):
        raise EnvelopeError(f"envelope.meta.identity_hash: expected {identity_hash(identity)} (of the identity, "
                            f"also in plan_hash), received {str(meta['identity_hash'])[:80]!r}")
    dim = meta["dim"]
    if isinstance(dim, bool) or not isinstance(dim, int) or not 1 <= dim <= max_dim:
        raise EnvelopeError(f"envelope.meta.dim: expected an int in 1..{max_dim}, received {str(dim)[:40]}")
    keys_bytes, cts_bytes = _sections(env.payload, meta["lengths"], params)
    keys = EvaluationKeys.from_bytes(keys_bytes)
    if keys.params != params or keys.key_id != env.key_id:
        raise EnvelopeError(f"envelope.key_id: expected the id of the enclosed keys ({keys.key_id}) at parameters "
                            f"{params.hash()[:12]}, received {env.key_id[:80]!r}")
    missing = sorted(set(galois_steps(params)) - set(keys.galois_steps))
    if missing:
        raise EnvelopeError(f"evaluation_keys.galois_steps: expected {galois_steps(params)}, missing {missing}")
    cts = ciphertexts_from_bytes(params, cts_bytes, max_count=chunk_count(dim, params), fresh=True)
    if len(cts) != chunk_count(dim, params):
        raise EnvelopeError(f"ciphertexts.count: expected {chunk_count(dim, params)} for dim {dim} at "
                            f"{params.slots} slots, received {len(cts)}")
    return identity, dim, keys, cts, env.key_id


def _sections(payload: bytes, lengths: Any, params: CkksParameters) -> tuple[bytes, bytes]:
    if not isinstance(lengths, list) or len(lengths) != 2:
        raise EnvelopeError(f"envelope.meta.lengths: expected [key bytes, ciphertext bytes], received {str(lengths)[:80]}")
    keys_bytes, cts_bytes = split_sections(payload, lengths, EnvelopeError, "envelope.meta")
    limit = max_bundle_bytes(params, galois_steps(params))
    if len(keys_bytes) > limit:
        raise EnvelopeError(f"evaluation_keys: expected at most {limit} bytes, received {len(keys_bytes)}")
    return keys_bytes, cts_bytes


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
           "encrypted_scores", "galois_steps", "open_query", "recommend_parameters", "seal_scores"]
