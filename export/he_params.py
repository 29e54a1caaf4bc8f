"""Why an HE plan runs at its CKKS parameter set: the smallest ring N that holds it, and why no smaller one does.

``veil.he.compile`` takes the smallest 128-bit set :func:`veil.he.params.select_parameters` finds for the
plan's levels, precision and slot need. The rule has one home, he's: whether ring N holds the plan is asked of
``select_parameters`` itself (offered only rings >= N, it holds at N or not), and the integer bits are its
default. This module only words the answer so ``veil export he`` can say what decided N: a set holds ``levels``
rescalings at a ``scale``-bit scale (``scale = max(20, ceil(precision_bits + noise_bits(N)))``) when one
ciphertext block fits in N/2 slots and ``scale x levels + 2 x (scale + integer bits)`` stays within the
HE-standard cap on log2 Q for N.

Example:
    >>> choice = parameter_choice(plan)
    >>> choice["poly_modulus_degree"], choice["why"]
    (16384, 'N=16384 is the smallest 128-bit ring that holds 8 levels ...')
"""

from __future__ import annotations

import inspect
import math
from typing import Any

from veil.he.errors import ParameterError
from veil.he.params import (
    MAX_LOG_Q_128,
    MAX_PRIME_BITS,
    MIN_SCALE_BITS,
    POLY_MODULUS_DEGREES,
    noise_bits,
    select_parameters,
)

# integer bits of the output (first prime - scale): compile asks select_parameters for its default
INTEGER_BITS: int = inspect.signature(select_parameters).parameters["integer_bits"].default


def _holds(n: int, levels: int, precision_bits: int, slots_needed: int) -> bool:
    """he's rule: select_parameters, offered only rings >= n, picks n."""
    try:
        return select_parameters(levels, precision_bits, min_slots=max(slots_needed, n // 2)).poly_modulus_degree == n
    except ParameterError:
        return False


def ring_fit(n: int, levels: int, precision_bits: int, slots_needed: int) -> dict[str, Any]:
    """Whether ring ``n`` holds ``levels`` rescalings at ``precision_bits`` with ``slots_needed`` slots; why not."""
    scale = max(MIN_SCALE_BITS, math.ceil(precision_bits + noise_bits(n)))
    need_q = scale * levels + 2 * (scale + INTEGER_BITS)
    cap = MAX_LOG_Q_128[n]
    reasons = []
    if n // 2 < slots_needed:
        reasons.append(f"{n // 2} slots < the {slots_needed} one ciphertext block needs")
    if scale + INTEGER_BITS > MAX_PRIME_BITS:
        reasons.append(f"a {scale}-bit scale plus {INTEGER_BITS} integer bits exceeds a {MAX_PRIME_BITS}-bit prime")
    if need_q > cap:
        reasons.append(f"{levels} levels at a {scale}-bit scale ({precision_bits} bits of precision + "
                       f"{noise_bits(n):g} of noise) need log2 Q >= {scale} x {levels} + 2 x ({scale} + "
                       f"{INTEGER_BITS}) = {need_q}, above the 128-bit cap {cap}")
    fits = _holds(n, levels, precision_bits, slots_needed)
    if not fits and not reasons:
        reasons.append("select_parameters finds no 128-bit set at this N")
    return {"poly_modulus_degree": n, "slots": n // 2, "scale_bits": scale, "min_log_q": need_q, "max_log_q": cap,
            "fits": fits, "why_not": "; ".join(reasons) if not fits else ""}


def parameter_choice(plan) -> dict[str, Any]:
    """The plan's ring N, chain and slot need, and why each smaller 128-bit ring cannot hold it.

    Args:
        plan: a compiled :class:`veil.he.plan.Plan`.

    Returns:
        {poly_modulus_degree, coeff_mod_bit_sizes, levels, precision_bits, slots_needed, batch_capacity,
        log_q, max_log_q, rings (one :func:`ring_fit` row per N up to the chosen one), why (one sentence)}.
    """
    params = plan.parameters()
    levels, bits = plan.levels, int(plan.spec["precision_bits"])
    slots_needed = int(plan.spec.get("period") or 0) if plan.mode == "latency" else 0
    rings = [ring_fit(n, levels, bits, slots_needed) for n in POLY_MODULUS_DEGREES if n <= params.poly_modulus_degree]
    n = params.poly_modulus_degree
    chain = list(params.coeff_mod_bit_sizes)
    held = (f"N={n} is the smallest 128-bit ring that holds {levels} levels at {bits} bits of precision"
            + (f" with a {slots_needed}-slot block per image ({params.slots // slots_needed} images per ciphertext)"
               if slots_needed else " (throughput: one ciphertext per feature, N/2 images per call)")
            + f": chain {chain} (a {params.scale_bits}-bit scale, log2 Q {params.log_q} <= {MAX_LOG_Q_128[n]})")
    smaller = [f"N={r['poly_modulus_degree']}: {r['why_not']}" for r in rings[:-1] if not r["fits"]]
    return {"poly_modulus_degree": n, "coeff_mod_bit_sizes": chain, "scale_bits": params.scale_bits,
            "levels": levels, "precision_bits": bits, "slots_needed": slots_needed,
            "batch_capacity": int(plan.spec.get("batch_capacity") or params.slots), "log_q": params.log_q,
            "max_log_q": MAX_LOG_Q_128[n], "rings": rings, "why": "; ".join([held, *smaller])}
