"""The compiler's cost model: predicted seconds of a plan, its key bytes and key-generation time.

Stated, not tuned: one key switch (a rotation, or the relinearization after a ciphertext product) costs about
``KEY_SWITCH_NS x N x L^2`` nanoseconds and a plaintext product ``PRODUCT_NS x N x L``, with N the ring and L the
primes of the chain (the top level: an upper estimate, since ciphertexts lose a prime per level). Measured with
SEAL 4 through tenseal 0.3.18 on one core of a 2-core AMD EPYC (AVX-512): a rotation 1.9 ms at N = 8192 (L = 4),
16.6 ms at 16384 (L = 8), 120 ms at 32768 (L = 14), 267 ms at 32768 (L = 22): 14.5-18.7 ns x N x L^2; a
plaintext product 5-12 ns x N x L; generating one key-switching key 150-165 ns x N x L^2.

:func:`veil.he.segments.compile_segmented` picks, among the segmentations that fit 128-bit sets, the one with the
lowest :func:`objective`: predicted evaluation seconds of one request, plus each refresh round's client work and
round trip, plus the one-time key cost (generation and upload) spread over ``KEY_AMORTIZE_REQUESTS`` requests,
subject to ``max_key_bytes`` of keys in all. `benchmarks/he_deep.py` prints the prediction beside the measured time
of every segment.
"""

from __future__ import annotations

from typing import Any

KEY_SWITCH_NS = 16.0
PRODUCT_NS = 8.0
KEYGEN_NS = 160.0
ROUND_SECONDS = 0.25  # a refresh round: the client decrypts, re-encodes and encrypts, plus one round trip
UPLOAD_BYTES_PER_SECOND = 100e6  # keys and ciphertexts over a 1 Gbit/s link, the order of a data-centre client
KEY_AMORTIZE_REQUESTS = 10  # the one-time key cost counts as if shared by this many requests
MAX_KEY_BYTES = 1 << 30  # default budget for all evaluation keys of a model (client memory, upload, server store)


def _key_object_bytes(params) -> int:
    """One key-switching key as the client ships it (seeded, zstd), measured once per parameter set on throwaway
    keys: 0.71-0.85x of he.keys.switch_key_bytes' 8-byte-word bound, which stays the server's upload cap."""
    from veil.he.params import measured_sizes

    return measured_sizes(params)["switch_key"]


def plan_cost(plan) -> dict[str, Any]:
    """Predicted cost of one request through ``plan`` (a :class:`veil.he.plan.Plan`), and its keys."""
    from veil.he.params import galois_key_count  # tenseal: not needed by `veil export he --help`

    params = plan.parameters()
    n, primes = params.poly_modulus_degree, len(params.coeff_mod_bit_sizes)
    values = plan.spec.get("values", {})
    switches = int(plan.spec.get("rotations", {}).get("key_switches", 0))
    products = 0
    for op in plan.ops:
        kind = op["op"]
        width = 1 if plan.mode == "latency" else int(values.get(op["outputs"][0], {}).get("features", 1))
        if kind == "mul":
            switches += width
        elif kind == "sumsq":
            switches += width * len(op["inputs"])  # the square, and the mean's square when it has one
        elif kind == "linear":
            if plan.mode == "latency":  # one product per mask of every diagonal part, plus the broadcast sums
                products += sum(len(plan.tensors[part["masks"]]) for diagonals in op["diagonals"]
                                for part in (diagonals or []) if part is not None)
                products += sum(t is not None for broadcast in op["broadcast"] for t in (broadcast or []))
            else:
                inputs = sum(int(values.get(v, {}).get("features", 1)) for v in op["inputs"])
                products += inputs * width
    keys = 1 + galois_key_count(params, list(plan.galois_steps))
    key_bytes = keys * _key_object_bytes(params)
    return {"poly_modulus_degree": n, "primes": primes, "key_switches": switches, "plaintext_products": products,
            "predicted_seconds": (switches * KEY_SWITCH_NS * n * primes**2 + products * PRODUCT_NS * n * primes) * 1e-9,
            "keys": keys, "key_bytes": key_bytes, "keygen_seconds": keys * KEYGEN_NS * n * primes**2 * 1e-9}


def key_bytes(plans: list) -> int:
    """Evaluation-key bytes of a cutting: one key set per distinct parameter set, holding the relinearization key
    and the union of its segments' Galois steps (what ``HeSession.create`` generates)."""
    from veil.he.params import galois_key_count

    sets: dict[str, tuple[Any, set[int]]] = {}
    for plan in plans:
        params = plan.parameters()
        sets.setdefault(params.hash(), (params, set()))[1].update(plan.galois_steps)
    return sum((1 + galois_key_count(params, sorted(steps))) * _key_object_bytes(params)
               for params, steps in sets.values())


def objective(costs: list[dict[str, Any]]) -> float:
    """What the segment search minimizes: seconds of one request with the keys' one-time cost spread out."""
    evaluate = sum(c["predicted_seconds"] for c in costs) + ROUND_SECONDS * (len(costs) - 1)
    keys = sum(c["keygen_seconds"] + c["key_bytes"] / UPLOAD_BYTES_PER_SECOND for c in costs)
    return evaluate + keys / KEY_AMORTIZE_REQUESTS


MODEL = (f"predicted seconds = key switches x {KEY_SWITCH_NS} ns x N x L^2 + plaintext products x {PRODUCT_NS} ns "
         f"x N x L per segment, + {ROUND_SECONDS} s per refresh round, + (key generation {KEYGEN_NS} ns x N x L^2 "
         f"per key + upload at {UPLOAD_BYTES_PER_SECOND / 1e6:g} MB/s) / {KEY_AMORTIZE_REQUESTS} requests; "
         f"keys within max_key_bytes")
