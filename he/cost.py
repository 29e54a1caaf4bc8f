"""The compiler's cost model: predicted seconds of a plan, its key bytes and key-generation time.

Stated, not tuned: one key switch (a rotation, or the relinearization after a ciphertext product) costs about
``N (a k (k + 1) + b k)`` nanoseconds and a plaintext product ``PRODUCT_NS x N x k``, with N the ring, (a, b) =
``KEY_SWITCH_NS[N]`` and k the data primes left where the op runs (the chain's primes less the special one, less
one per rescaling: a key switch decomposes the ciphertext into k parts and multiplies each with a key over k + 1
primes). An op runs at the level of its inputs (``values[...]["level"]`` in the plan). The constants are
``python benchmarks/he_opcost.py``'s fit (docs/results.md § he_opcost: SEAL 4 through tenseal 0.3.18, one core of
a 2-core Xeon with AVX-512, rotations and relinearizations at the top, middle and last level of the chains the
compiler picks, within ~10 % of each); N = 4096 takes 8192's. Generating one key-switching key costs
``KEYGEN_NS x N x L^2`` (L: all primes). Counting every op at the top level, as this model did before, overstated
the deep segments 2.3-3.3x (docs/results.md § he_deep). Given the evaluator's ``encoded_bytes`` budget, a mask
past it is encoded at each use (:class:`veil.he.evaluate.PlanEvaluator` encodes masks in op order while N x 8 x k
bytes each still fit) and costs ``N (c + d k)`` ns more, (c, d) = ``ENCODE_NS``: he_opcost's mask-encode column
(an FFT and one NTT per prime), 3-5.5x the product it feeds. Without a budget every mask counts as encoded at
load, as the segment search assumes.

:func:`veil.he.segments.compile_segmented` picks, among the segmentations that fit 128-bit sets, the one with the
lowest :func:`objective`: predicted evaluation seconds of one request, plus each refresh round's client work and
round trip, plus the one-time key cost (generation and upload) spread over ``KEY_AMORTIZE_REQUESTS`` requests,
subject to ``max_key_bytes`` of keys in all. `benchmarks/he_deep.py` prints the prediction beside the measured time
of every segment.
"""

from __future__ import annotations

from typing import Any

KEY_SWITCH_NS = {4096: (6.6, 47.5), 8192: (6.6, 47.5), 16384: (11.2, 34.4), 32768: (13.1, 37.1)}
PRODUCT_NS = 5.5
ENCODE_NS = (25.0, 14.5)  # a mask encoded at use: N (c + d k) ns (fit to he_opcost's mask-encode column)
KEYGEN_NS = 160.0
ROUND_SECONDS = 0.25  # a refresh round: the client decrypts, re-encodes and encrypts, plus one round trip
UPLOAD_BYTES_PER_SECOND = 100e6  # keys and ciphertexts over a 1 Gbit/s link, the order of a data-centre client
KEY_AMORTIZE_REQUESTS = 10  # the one-time key cost counts as if shared by this many requests
MAX_KEY_BYTES = 1 << 30  # default budget for all evaluation keys of a model (client memory, upload, server store)


def _key_object_bytes(params) -> int:
    """One key-switching key as the client ships it (seeded, zstd), measured once per parameter set on throwaway
    keys: 0.71-0.85x of he.galois.switch_key_bytes' 8-byte-word bound, which stays the server's upload cap."""
    from veil.he.params import measured_sizes

    return measured_sizes(params)["switch_key"]


def plan_cost(plan, encoded_bytes: int | None = None) -> dict[str, Any]:
    """Predicted cost of one request through ``plan`` (a :class:`veil.he.plan.Plan`), and its keys.

    ``encoded_bytes``: the evaluator's budget of masks encoded at load (None: all of them); the masks past it are
    costed as encoded at each use, and ``encoded_bytes_left`` is what a next round's evaluator would get."""
    from veil.he.packing import decompose, rotation_uses
    from veil.he.params import galois_key_count  # tenseal: not needed by `veil export he --help`

    params = plan.parameters()
    n, primes = params.poly_modulus_degree, len(params.coeff_mod_bit_sizes)
    values = plan.spec.get("values", {})
    period, manifest = plan.spec.get("period"), set(plan.galois_steps)
    modulus = plan.key_modulus if plan.mode == "latency" else n // 2  # steps equal modulo this share a key
    switches = products = 0
    a, b = KEY_SWITCH_NS[n]
    switch_units = product_units = encode_units = 0.0  # ns per N: a k (k+1) + b k per key switch, k per product
    budget, at_use = encoded_bytes, 0
    for op in plan.ops:
        kind = op["op"]
        width = 1 if plan.mode == "latency" else int(values.get(op["outputs"][0], {}).get("features", 1))
        level = max((int(values.get(v, {}).get("level", 0)) for v in op["inputs"]), default=0)
        k = max(1, primes - 1 - level)
        op_switches = op_products = 0
        if kind == "mul":
            op_switches = width
        elif kind == "sumsq":
            op_switches = width * len(op["inputs"])  # the square, and the mean's square when it has one
        if kind in ("linear", "sumsq") and plan.mode == "latency":
            op_switches += sum(count * len(decompose(step, manifest, modulus))
                               for step, count in rotation_uses([op], period).items())
        if kind == "linear":
            if plan.mode == "latency":  # one product per mask of every diagonal part, plus the broadcast sums
                op_products = sum(len(plan.tensors[part["masks"]]) for diagonals in op["diagonals"]
                                  for part in (diagonals or []) if part is not None)
                if budget is not None:  # masks (not the broadcast sums) encoded in op order while N 8 k bytes fit
                    loaded = min(op_products, budget // (8 * n * k))
                    budget -= loaded * 8 * n * k
                    at_use += op_products - loaded
                    encode_units += (op_products - loaded) * (ENCODE_NS[0] + ENCODE_NS[1] * k)
                op_products += sum(t is not None for broadcast in op["broadcast"] for t in (broadcast or []))
            else:
                op_products = sum(int(values.get(v, {}).get("features", 1)) for v in op["inputs"]) * width
        switches, products = switches + op_switches, products + op_products
        switch_units += op_switches * (a * k * (k + 1) + b * k)
        product_units += op_products * k
    keys = 1 + galois_key_count(params, list(plan.galois_steps))
    key_bytes = keys * _key_object_bytes(params)
    return {"poly_modulus_degree": n, "primes": primes, "key_switches": switches, "plaintext_products": products,
            "predicted_seconds": (switch_units + product_units * PRODUCT_NS + encode_units) * n * 1e-9,
            "masks_encoded_at_use": at_use, "encode_seconds": encode_units * n * 1e-9, "encoded_bytes_left": budget,
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


MODEL = (f"predicted seconds = key switches x N (a k(k+1) + b k) ns, (a, b) per N {KEY_SWITCH_NS}, + plaintext "
         f"products x {PRODUCT_NS} ns x N x k per segment (k: data primes left at each op's level), + masks "
         f"past the server's encoded-mask budget x N ({ENCODE_NS[0]} + {ENCODE_NS[1]} k) ns (none in the search), + "
         f"{ROUND_SECONDS} s per refresh round, + (key generation {KEYGEN_NS} ns x N x L^2 per key + upload at "
         f"{UPLOAD_BYTES_PER_SECOND / 1e6:g} MB/s) / {KEY_AMORTIZE_REQUESTS} requests; keys within max_key_bytes")
