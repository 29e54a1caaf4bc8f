"""The HE cost model's constants, measured: one key switch and one plaintext product per ring and level.

he/cost.py predicts a plan's seconds as key switches x KEY_SWITCH_NS x N x k (k + 1) + plaintext products x
PRODUCT_NS x N x k, with k the data primes left at the level where the op runs (a key switch decomposes the
ciphertext into k parts and multiplies each with a key over k + 1 primes; a product touches k primes). This script
times, with SEAL through tenseal.sealapi on one core, a rotation (one Galois key), a relinearization after a
ciphertext product, and a plaintext product, at the top, the middle and the last level of the 128-bit chains the
compiler picks (he.params.select_parameters), and fits the two constants (median over configurations of
seconds / (N k (k + 1)) and seconds / (N k)): what he/cost.py states.

    python benchmarks/he_opcost.py
    python benchmarks/he_opcost.py --quick     # N = 8192 only
"""

from __future__ import annotations

import statistics
import sys
import time
from typing import Any

import numpy as np
from common import argument_parser, command_line, environment, save_results

RINGS = (8192, 16384, 32768)
SHORT_32768 = 11  # the PolyResNet's deep segments: 11 levels at N = 32768 (docs/results.md § he_resnet)


def chains() -> list[tuple[int, int]]:
    """(N, levels): the most levels each ring holds at 20 bits of precision (what deep segments fill), and the
    11-level chain at N = 32768 the PolyResNet's segments take."""
    from veil.he.errors import ParameterError
    from veil.he.params import select_parameters

    most: dict[int, int] = {}
    for levels in range(1, 64):
        try:
            most[select_parameters(levels, precision_bits=20).poly_modulus_degree] = levels
        except ParameterError:
            break
    return [(n, most[n]) for n in RINGS if n in most] + [(32768, SHORT_32768)]


def _timed(call, repeats: int) -> float:
    """Median seconds of ``call()`` over ``repeats`` runs (one warm-up first)."""
    call()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _op_seconds(sa, evaluator, ct, plain, relin, galois, repeats: int, encode) -> dict[str, float]:
    """Median seconds of a rotation by 1, a relinearization of ct^2, a plaintext product, an addition and the
    encoding of one mask at this level from its float32 values (what PlanEvaluator does for a mask past its
    ``encoded_bytes`` budget, at every use: he/evaluate.py)."""
    out, square, relinearized = sa.Ciphertext(), sa.Ciphertext(), sa.Ciphertext()
    evaluator.multiply(ct, ct, square)
    return {"encode_s": _timed(encode, repeats),
            "rotate_s": _timed(lambda: evaluator.rotate_vector(ct, 1, galois, out), repeats),
            "relinearize_s": _timed(lambda: evaluator.relinearize(square, relin, relinearized), repeats),
            "plain_product_s": _timed(lambda: evaluator.multiply_plain(ct, plain, out), repeats),
            "add_s": _timed(lambda: evaluator.add(ct, ct, out), repeats)}


def measure_chain(n: int, levels: int, repeats: int) -> list[dict[str, Any]]:
    """Rotation, relinearization and plaintext-product seconds at the top, middle and last level of one chain."""
    import tenseal.sealapi as sa
    from veil.he.galois import galois_element
    from veil.he.params import select_parameters

    params = select_parameters(levels, precision_bits=20)
    if params.poly_modulus_degree != n:
        raise RuntimeError(f"{levels} levels chose N={params.poly_modulus_degree}, expected {n}")
    ctx = params.seal_context()
    keygen = sa.KeyGenerator(ctx)
    public = sa.PublicKey()
    keygen.create_public_key(public)
    relin, galois = sa.RelinKeys(), sa.GaloisKeys()
    keygen.create_relin_keys(relin)
    keygen.create_galois_keys([galois_element(params, 1)], galois)
    encoder, encryptor, evaluator = sa.CKKSEncoder(ctx), sa.Encryptor(ctx, public), sa.Evaluator(ctx)
    values = np.random.default_rng(0).uniform(-1, 1, params.slots).tolist()
    rows, data, level = [], ctx.first_context_data(), 0
    top = params.levels
    probe = {0, top // 2, top - 1}
    while data is not None and level < top:
        if level in probe:
            plain, ct = sa.Plaintext(), sa.Ciphertext()
            encoder.encode(values, data.parms_id(), params.scale, plain)
            encryptor.encrypt(plain, ct)
            k = len(data.parms().coeff_modulus())  # data primes at this level (the special prime is not in it)
            mask, pid = np.asarray(values, dtype=np.float32), data.parms_id()

            def encode(mask=mask, pid=pid) -> None:
                encoder.encode(np.asarray(mask, dtype=np.float64).tolist(), pid, params.scale, sa.Plaintext())

            rows.append({"N": n, "chain_primes": len(params.coeff_mod_bit_sizes), "level": level, "k": k,
                         **_op_seconds(sa, evaluator, ct, plain, relin, galois, repeats, encode)})
        data, level = data.next_context_data(), level + 1
    return rows


def fit(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per ring, the key switch's ``a``, ``b`` (ns) in N (a k (k + 1) + b k), least squares in relative error over
    the rotations and relinearizations at every probed level; one plaintext product's ns per N k over all rows."""
    switch: dict[int, list[float]] = {}
    for n in sorted({r["N"] for r in rows}):
        ks = np.array([r["k"] for r in rows if r["N"] == n for _ in (0, 1)], dtype=float)
        ts = np.array([r[key] for r in rows if r["N"] == n for key in ("rotate_s", "relinearize_s")])
        design = np.stack([n * ks * (ks + 1), n * ks], axis=1) / ts[:, None]
        a, b = np.linalg.lstsq(design, np.ones_like(ts), rcond=None)[0]
        switch[n] = [round(float(a) * 1e9, 1), round(float(b) * 1e9, 1)]
    per_product = np.array([r["plain_product_s"] / (r["N"] * r["k"]) for r in rows])
    return {"key_switch_ns": switch, "product_ns": round(float(np.median(per_product)) * 1e9, 1)}


def main(argv: list[str] | None = None) -> int:
    parser = argument_parser(__doc__)
    parser.add_argument("--quick", action="store_true", help="N = 8192 only, 3 repeats")
    parser.add_argument("--repeats", type=int, default=7, help="timed calls per op (median)")
    args = parser.parse_args(argv)
    import os

    import tenseal
    from veil.he import cost

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    measured = chains()[:1] if args.quick else chains()
    repeats = 3 if args.quick else args.repeats
    rows = [row for n, levels in measured for row in measure_chain(n, levels, repeats)]
    fitted = fit(rows)
    report = {"environment": environment("1 thread", tenseal=tenseal.__version__),
              "command": command_line(__file__, argv), "rows": rows, "fit": fitted,
              "stated": {"key_switch_ns": cost.KEY_SWITCH_NS, "product_ns": cost.PRODUCT_NS}}
    env = report["environment"]
    lines = [
        "## The HE cost model's constants (`he_opcost`, issue 35)", "",
        f"`{report['command']}` — {env['date']}, {env['machine']}, tenseal {env['tenseal']}. SEAL through "
        f"tenseal.sealapi, one call at a time; median of {repeats} calls per op. k = data primes at the level "
        "(the chain's primes less the special one, less one per rescaling).", "",
        "| N | chain primes | level | k | rotation ms | relinearization ms | plaintext product ms | addition ms | "
        "mask encode ms | he/cost.py predicted / measured: rotation, product |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        a, b = cost.KEY_SWITCH_NS.get(r["N"], (float("nan"), float("nan")))
        switch = r["N"] * (a * r["k"] * (r["k"] + 1) + b * r["k"]) * 1e-9
        product = r["N"] * r["k"] * cost.PRODUCT_NS * 1e-9
        lines.append(f"| {r['N']} | {r['chain_primes']} | {r['level']} | {r['k']} | {r['rotate_s'] * 1e3:.2f} | "
                     f"{r['relinearize_s'] * 1e3:.2f} | {r['plain_product_s'] * 1e3:.3f} | {r['add_s'] * 1e3:.3f} | "
                     f"{r['encode_s'] * 1e3:.2f} | {switch / r['rotate_s']:.2f}, {product / r['plain_product_s']:.2f} |")
    ratios = [r["encode_s"] / r["plain_product_s"] for r in rows]
    rings = ", ".join(f"N = {n}: a = {a}, b = {b}" for n, (a, b) in fitted["key_switch_ns"].items())
    stated = ", ".join(f"N = {n}: a = {a}, b = {b}" for n, (a, b) in cost.KEY_SWITCH_NS.items())
    lines += ["", f"Fit: a key switch takes N (a k (k+1) + b k) ns with **{rings}**; a plaintext product "
              f"**{fitted['product_ns']} ns x N x k**. he/cost.py states {stated}; {cost.PRODUCT_NS} ns "
              "(the predicted / measured column).", "",
              f"A mask encoded at use (past the evaluator's `encoded_bytes` budget) costs **{min(ratios):.1f}–"
              f"{max(ratios):.1f}x the plaintext product it feeds** (the encode column over the product column): "
              "an FFT and one NTT per prime against one pass over N k words. he/cost.py counts products only, so a "
              "plan whose masks do not fit the budget runs slower than predicted by about that much per product."]
    save_results(args.out, "he_opcost", report, "\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
