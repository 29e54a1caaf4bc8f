"""CKKS parameter sets at 128-bit security: validation, selection from a level budget, size report.

A chain ``[first, scale × levels, special]`` gives ``levels`` rescalings; ``first − scale`` bits hold the
integer part of the output and ``special`` is SEAL's key-switching prime. Only sets inside the
HomomorphicEncryption.org 128-bit table (``seal/util/hestdparms.h``) are accepted, and SEAL checks again.

Example:
    >>> from veil.he.params import select_parameters, describe
    >>> p = select_parameters(levels=2, precision_bits=20)
    >>> p.poly_modulus_degree, p.coeff_mod_bit_sizes
    (8192, (54, 34, 34, 54))
    >>> describe(p, galois_steps=[1, 2])["security"]
    '128-bit (HE standard)'
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
from typing import Any

import tenseal.sealapi as sa
from veil.he.errors import ParameterError, SecurityError
from veil.he.sealbytes import seal_to_bytes

# N -> max log2 Q at 128-bit classical security (HE standard; SEAL CoeffModulus::MaxBitCount).
MAX_LOG_Q_128 = {1024: 27, 2048: 54, 4096: 109, 8192: 218, 16384: 438, 32768: 881}
POLY_MODULUS_DEGREES = (4096, 8192, 16384, 32768)
MIN_SCALE_BITS = 20
MAX_PRIME_BITS = 60
SECURITY = "128-bit (HE standard)"


def noise_bits(poly_modulus_degree: int) -> float:
    """Predicted log2 of the worst-slot CKKS error after one multiply + rescale, in units of one scale.

    Calibrated on SEAL 4 via TenSEAL 0.3.18 (max error over all slots of a fresh ciphertext squared once):
    13.3 bits at N=8192, 14.1 at 16384, 15.0 at 32768. The model ``log2(N)/2 + 7.5`` is an upper estimate.
    """
    return math.log2(poly_modulus_degree) / 2 + 7.5


@dataclasses.dataclass(frozen=True)
class CkksParameters:
    """One CKKS parameter set, validated on construction.

    Args:
        poly_modulus_degree (int): ring dimension N; slots = N / 2.
        coeff_mod_bit_sizes (tuple[int, ...]): prime sizes ``[first, scale × levels, special]``.
        scale_bits (int): log2 of the encoding scale; every middle prime has this size.

    Raises:
        SecurityError: log2 Q above the 128-bit cap for N, or SEAL refuses the set.
        ParameterError: an ill-formed chain (unknown N, prime sizes, scale).
    """

    poly_modulus_degree: int = dataclasses.field(metadata={"help": "ring dimension N (slots = N/2)"})
    coeff_mod_bit_sizes: tuple[int, ...] = dataclasses.field(
        metadata={"help": "prime bit sizes [first, scale x levels, special]"})
    scale_bits: int = dataclasses.field(metadata={"help": "log2 of the encoding scale (= middle primes)"})

    def __post_init__(self) -> None:
        object.__setattr__(self, "coeff_mod_bit_sizes", tuple(self.coeff_mod_bit_sizes))
        self._validate()
        if not _seal_context(self).parameters_set():
            ctx = _seal_context(self)
            raise SecurityError(f"CkksParameters: SEAL refuses {self.to_dict()}: "
                                f"{ctx.parameters_error_name()} ({ctx.parameters_error_message()})")

    def _validate(self) -> None:
        n, chain, s = self.poly_modulus_degree, self.coeff_mod_bit_sizes, self.scale_bits
        for name, value in (("poly_modulus_degree", n), ("scale_bits", s)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise ParameterError(f"CkksParameters.{name}: expected an int, received {value!r}")
        if n not in POLY_MODULUS_DEGREES:
            raise ParameterError(f"CkksParameters.poly_modulus_degree: expected one of "
                                 f"{list(POLY_MODULUS_DEGREES)}, received {n}")
        if len(chain) < 2 or any(isinstance(b, bool) or not isinstance(b, int) for b in chain):
            raise ParameterError(f"CkksParameters.coeff_mod_bit_sizes: expected at least 2 ints "
                                 f"[first, ..., special], received {list(chain)}")
        if not MIN_SCALE_BITS <= s <= MAX_PRIME_BITS:
            raise ParameterError(f"CkksParameters.scale_bits: expected {MIN_SCALE_BITS}..{MAX_PRIME_BITS}, "
                                 f"received {s}")
        bad = [b for b in chain if not MIN_SCALE_BITS <= b <= MAX_PRIME_BITS]
        if bad:
            raise ParameterError(f"CkksParameters.coeff_mod_bit_sizes: expected every prime in "
                                 f"{MIN_SCALE_BITS}..{MAX_PRIME_BITS} bits, received {list(chain)}")
        middle = chain[1:-1]
        if any(b != s for b in middle):
            raise ParameterError(f"CkksParameters.coeff_mod_bit_sizes: expected middle primes equal to "
                                 f"scale_bits={s}, received {list(middle)}")
        if chain[0] < s:
            raise ParameterError(f"CkksParameters.coeff_mod_bit_sizes[0]: expected first prime >= "
                                 f"scale_bits={s}, received {chain[0]}")
        if chain[-1] < max(chain[:-1]):
            raise ParameterError(f"CkksParameters.coeff_mod_bit_sizes[-1]: expected the special prime >= "
                                 f"every other prime ({max(chain[:-1])} bits), received {chain[-1]}")
        if self.log_q > MAX_LOG_Q_128[n]:
            raise SecurityError(f"CkksParameters.coeff_mod_bit_sizes: expected log2 Q <= {MAX_LOG_Q_128[n]} "
                                f"for 128-bit security at N={n}, received {self.log_q} ({list(chain)})")

    @property
    def levels(self) -> int:
        """Multiplicative levels (rescalings) available: ``len(chain) − 2``."""
        return len(self.coeff_mod_bit_sizes) - 2

    @property
    def log_q(self) -> int:
        """Total modulus bits, special prime included (what the security cap bounds)."""
        return sum(self.coeff_mod_bit_sizes)

    @property
    def slots(self) -> int:
        """Values packed per ciphertext: N / 2."""
        return self.poly_modulus_degree // 2

    @property
    def scale(self) -> float:
        """The encoding scale 2**scale_bits."""
        return 2.0 ** self.scale_bits

    @property
    def precision_bits(self) -> float:
        """Predicted fractional bits kept after a multiply (scale_bits − noise_bits(N))."""
        return round(self.scale_bits - noise_bits(self.poly_modulus_degree), 1)

    @property
    def integer_bits(self) -> int:
        """Bits left for the integer part of values at the last level: first prime − scale."""
        return self.coeff_mod_bit_sizes[0] - self.scale_bits

    def to_dict(self) -> dict[str, Any]:
        return {"poly_modulus_degree": self.poly_modulus_degree,
                "coeff_mod_bit_sizes": list(self.coeff_mod_bit_sizes), "scale_bits": self.scale_bits}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CkksParameters:
        """Build from :meth:`to_dict` output; missing or unknown keys are refused by name."""
        names = {f.name for f in dataclasses.fields(cls)}
        if not isinstance(data, dict) or set(data) != names:
            got = sorted(data) if isinstance(data, dict) else type(data).__name__
            raise ParameterError(f"CkksParameters: expected keys {sorted(names)}, received {got}")
        return cls(**data)

    def to_json(self) -> str:
        """Canonical JSON (sorted keys, no spaces): the input of :meth:`hash`."""
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    def hash(self) -> str:
        """SHA-256 hex digest of the canonical JSON; envelopes and key files bind to it."""
        return hashlib.sha256(self.to_json().encode()).hexdigest()

    def seal_context(self) -> sa.SEALContext:
        """The (cached, shared) SEAL context at 128-bit security for these parameters."""
        return _seal_context(self)


@functools.lru_cache(maxsize=8)
def _seal_context(params: CkksParameters) -> sa.SEALContext:
    parms = sa.EncryptionParameters(sa.SCHEME_TYPE.CKKS)
    parms.set_poly_modulus_degree(params.poly_modulus_degree)
    parms.set_coeff_modulus(sa.CoeffModulus.Create(params.poly_modulus_degree, list(params.coeff_mod_bit_sizes)))
    return sa.SEALContext(parms, True, sa.SEC_LEVEL_TYPE.TC128)


def _chain_for(n: int, levels: int, scale_bits: int, integer_bits: int) -> list[int] | None:
    """The chain with the most integer headroom (up to 20 bits) that fits N's cap, or None."""
    first = min(MAX_PRIME_BITS, scale_bits + 20, (MAX_LOG_Q_128[n] - scale_bits * levels) // 2)
    if first - scale_bits < integer_bits:
        return None
    return [first] + [scale_bits] * levels + [first]


def select_parameters(levels: int, precision_bits: int = 20, min_slots: int = 0,
                      integer_bits: int = 10) -> CkksParameters:
    """The fastest (smallest-N) 128-bit parameter set for a circuit of ``levels`` rescalings.

    Args:
        levels: multiplicative levels the circuit consumes (plaintext multiplies count).
        precision_bits: fractional bits wanted after a multiply; sets scale_bits = this + noise_bits(N).
        min_slots: the fewest slots a ciphertext must offer (N/2 >= min_slots).
        integer_bits: bits for the integer part of outputs (first prime − scale).

    Returns:
        CkksParameters with chain ``[first, scale × levels, special]``.

    Raises:
        ParameterError: no 128-bit set fits; the message says how many levels the largest set gives.
    """
    if isinstance(levels, bool) or not isinstance(levels, int) or levels < 0:
        raise ParameterError(f"select_parameters: `levels` expected an int >= 0, received {levels!r}")
    for n in POLY_MODULUS_DEGREES:
        scale_bits = max(MIN_SCALE_BITS, math.ceil(precision_bits + noise_bits(n)))
        if n // 2 < min_slots or scale_bits + integer_bits > MAX_PRIME_BITS:
            continue
        chain = _chain_for(n, levels, scale_bits, integer_bits)
        if chain is not None:
            return CkksParameters(n, tuple(chain), scale_bits)
    n = POLY_MODULUS_DEGREES[-1]
    scale_bits = max(MIN_SCALE_BITS, math.ceil(precision_bits + noise_bits(n)))
    most = max(0, (MAX_LOG_Q_128[n] - 2 * (scale_bits + integer_bits)) // scale_bits)
    raise ParameterError(
        f"select_parameters: needs {levels} levels at {precision_bits} bits of precision, {integer_bits} integer "
        f"bits and >= {min_slots} slots; the largest 128-bit set (N={n}, log2 Q <= {MAX_LOG_Q_128[n]}) gives at "
        f"most {most} at a {scale_bits}-bit scale. Lower precision_bits or the circuit depth (no bootstrapping).")


@functools.lru_cache(maxsize=64)  # the segment search's cost model asks for every candidate's set (~1 s at N=32768)
def measured_sizes(params: CkksParameters) -> dict[str, int]:
    """Serialized sizes of one seeded key-switching key and of ciphertexts, from throwaway keys."""
    ctx = params.seal_context()
    keygen = sa.KeyGenerator(ctx)
    encryptor = sa.Encryptor(ctx, keygen.secret_key())
    ct = sa.Ciphertext()
    encryptor.encrypt_zero_symmetric(ct)
    fresh_unseeded = len(seal_to_bytes(ct))
    sa.Evaluator(ctx).mod_switch_to_inplace(ct, ctx.last_parms_id())
    return {"switch_key": len(seal_to_bytes(keygen.create_relin_keys())),
            "fresh": len(seal_to_bytes(encryptor.encrypt_zero_symmetric())),
            "fresh_unseeded": fresh_unseeded, "last_level": len(seal_to_bytes(ct))}


def galois_key_count(params: CkksParameters, galois_steps: list[int]) -> int:
    """Distinct Galois keys for these rotation steps (steps are taken modulo the slot count; 0 needs none)."""
    return len({s % params.slots for s in galois_steps} - {0})


def describe(params: CkksParameters, galois_steps: list[int]) -> dict[str, Any]:
    """What a parameter set costs, before the client's keys are generated.

    Sizes are measured once per parameter set (cached) on throwaway keys, serialized as veil ships them:
    seeded (SEAL ``Serializable``) and zstd-compressed. One Galois key per distinct rotation step has the
    size of the relinearization key; containers add a few hundred bytes of header.
    """
    sizes = measured_sizes(params)
    return {
        "poly_modulus_degree": params.poly_modulus_degree, "coeff_mod_bit_sizes": list(params.coeff_mod_bit_sizes),
        "scale_bits": params.scale_bits, "levels": params.levels, "log_q": params.log_q,
        "max_log_q": MAX_LOG_Q_128[params.poly_modulus_degree], "slots": params.slots,
        "precision_bits": params.precision_bits, "integer_bits": params.integer_bits, "security": SECURITY,
        "params_hash": params.hash(),
        "sizes_bytes": {
            "ciphertext_fresh": sizes["fresh"], "ciphertext_fresh_unseeded": sizes["fresh_unseeded"],
            "ciphertext_last_level": sizes["last_level"], "relin_keys": sizes["switch_key"],
            "galois_keys": galois_key_count(params, galois_steps) * sizes["switch_key"],
            "galois_key_per_step": sizes["switch_key"],
        },
        "sizes_source": "measured once per parameter set on throwaway keys (seeded, zstd), cached",
    }
