"""Galois keys by rotation step: normalized steps, SEAL's Galois elements, key sizes, and the groups (one SEAL
object each) that :class:`veil.he.keys.SecretKeyring` generates and :class:`veil.he.keys.EvaluationKeys` ships.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import tenseal.sealapi as sa
from veil.he.errors import MismatchError, ParameterError
from veil.he.params import CkksParameters, galois_key_count

# Galois keys are generated and shipped in groups of at most this many seeded bytes, one SEAL object each: SEAL
# objects past 2 GiB cannot be read back (a single read() returns at most 2 GiB - 4 KiB on Linux, and SEAL's own
# streams are bounded too; TenSEAL#452), and a group is the unit of key-generation progress.
GALOIS_GROUP_BYTES = 256 << 20
_SEAL_HEADER_BYTES = 16


def normalize_steps(params: CkksParameters, galois_steps: Sequence[int]) -> tuple[int, ...]:
    """Sorted distinct rotation steps; refuses 0, non-ints and |step| >= slots."""
    if isinstance(galois_steps, (str, bytes)) or not isinstance(galois_steps, Sequence):
        raise ParameterError(f"galois_steps: expected a list of ints, received {str(galois_steps)[:80]}")
    steps = set()
    for s in galois_steps:
        if isinstance(s, bool) or not isinstance(s, (int, np.integer)) or s == 0 or abs(int(s)) >= params.slots:
            raise ParameterError(f"galois_steps: expected non-zero ints with |step| < {params.slots}, received {s!r}")
        steps.add(int(s))
    return tuple(sorted(steps))


def switch_key_bytes(params: CkksParameters) -> int:
    """The most seeded bytes of one key-switching key (the relinearization key, or one Galois key) at ``params``.

    It holds, for each of the L data primes, a seeded ciphertext at the key level: one polynomial of N
    coefficients over all L + 1 primes (8 bytes each) plus its seed. zstd only shrinks that.
    """
    primes = len(params.coeff_mod_bit_sizes)
    return (primes - 1) * (params.poly_modulus_degree * primes * 8 + 4 * _SEAL_HEADER_BYTES + 64)


def max_bundle_bytes(params: CkksParameters, galois_steps: Sequence[int]) -> int:
    """The most bytes a seeded evaluation-key bundle for ``galois_steps`` can take at ``params``, plus 5 %
    (:func:`switch_key_bytes` per key); an unseeded bundle is twice as large and is refused."""
    keys = 1 + galois_key_count(params, list(galois_steps))
    groups = 1 + len(galois_groups(params, galois_steps))
    return int(keys * switch_key_bytes(params) * 1.05) + 64 * 1024 * groups  # JSON header, SEAL object headers


def galois_groups(params: CkksParameters, galois_steps: Sequence[int],
                  group_bytes: int | None = None) -> list[tuple[int, ...]]:
    """``galois_steps`` (normalized) cut into consecutive groups of at most ``group_bytes`` (default
    :data:`GALOIS_GROUP_BYTES`) seeded key bytes each (at least one key a group); steps that share a Galois
    element (-1 and slots - 1) stay together."""
    per_group = max(1, (group_bytes or GALOIS_GROUP_BYTES) // switch_key_bytes(params))
    groups: list[list[int]] = []
    seen: dict[int, int] = {}  # Galois element -> group index
    for step in normalize_steps(params, galois_steps):
        element = galois_element(params, step)
        if element in seen:
            groups[seen[element]].append(step)
            continue
        if not groups or len({galois_element(params, s) for s in groups[-1]}) >= per_group:
            groups.append([])
        groups[-1].append(step)
        seen[element] = len(groups) - 1
    return [tuple(g) for g in groups]


def galois_element(params: CkksParameters, step: int) -> int:
    """SEAL's Galois element for a left rotation by ``step`` slots (``galois_elt_from_step``)."""
    return pow(3, step % params.slots, 2 * params.poly_modulus_degree)


class GaloisSet:
    """Galois keys held as several SEAL objects (groups of steps, each under SEAL's size limit).

    ``key_for(step)`` is the ``sa.GaloisKeys`` object that holds ``step``'s key, for ``Evaluator.rotate_vector``.
    """

    def __init__(self, params: CkksParameters, groups: Sequence[tuple[tuple[int, ...], sa.GaloisKeys]]) -> None:
        self.params = params
        self.groups = list(groups)
        self._by_step = {step: keys for steps, keys in self.groups for step in steps}

    def key_for(self, step: int) -> sa.GaloisKeys:
        try:
            return self._by_step[step]
        except KeyError:
            raise MismatchError(f"galois keys: expected a key for rotation step {step}, the keys cover "
                                f"{sorted(self._by_step)}") from None

    def size(self) -> int:
        """Distinct Galois keys in all groups."""
        return sum(keys.size() for _, keys in self.groups)
