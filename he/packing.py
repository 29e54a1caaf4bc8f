"""Slot layouts of the latency mode: the period, diagonals of padded matrices, BSGS split, key manifest.

Latency mode keeps one sample per ciphertext, its features zero-padded to a power-of-two period D and
replicated over all N/2 slots. Then ``y = A x`` is ``sum_i diag_i(A) * rot(x, i)`` with
``diag_i[j] = A[j, (j + i) mod D]`` (Halevi-Shoup), and the result is replicated with the same period,
ready for the next product. Biases and constants are encoded with that period too (the TenSEAL pitfall
of he.md §2.5: a bias added to the first slots only breaks the replication). Baby-step/giant-step:
``i = g B + b`` and ``y = sum_g rot(sum_b rot(diag_i, -g B) * rot(x, b), g B)``, so a D x D product
needs about 2 sqrt(D) rotations instead of D.
"""

from __future__ import annotations

import math

import numpy as np


def next_pow2(n: int) -> int:
    return 1 << max(0, math.ceil(math.log2(max(n, 1))))


def latency_period(builder) -> int:
    """The period D: a power of two >= every value's feature count (``builder`` has ``values``)."""
    return next_pow2(max(v["features"] for v in builder.values.values()))


def baby_size(period: int) -> int:
    """Baby-step count B: the power of two nearest sqrt(D) from above."""
    return next_pow2(math.isqrt(period - 1) + 1) if period > 1 else 1


def diagonals(matrix: np.ndarray, period: int) -> dict[int, np.ndarray]:
    """The non-zero generalized diagonals {i: (D,)} of ``matrix`` (m, n) zero-padded to (D, D)."""
    padded = np.zeros((period, period))
    padded[: matrix.shape[0], : matrix.shape[1]] = matrix
    rows = np.arange(period)
    table = padded[rows[None, :], (rows[None, :] + rows[:, None]) % period]  # (i, j) -> A[j, (j + i) % D]
    return {int(i): table[i] for i in np.flatnonzero(np.any(table != 0, axis=1))}


def galois_steps(plan) -> list[int]:
    """Every rotation step a latency-mode plan uses: BSGS baby and giant steps, and the slot-sum steps."""
    period = int(plan.spec["period"])
    b = baby_size(period)
    steps: set[int] = set()
    for op in plan.ops:
        if op["op"] == "linear":
            for row in op["weights"]:
                for name in row:
                    for i in diagonals(plan.tensors[name], period):
                        steps.update({i % b, (i // b) * b})
        elif op["op"] == "sumsq":
            steps.update(1 << k for k in range(int(math.log2(period))))
    return sorted(steps - {0})


def tile(vector: np.ndarray, period: int, slots: int) -> np.ndarray:
    """``vector`` zero-padded to ``period`` and repeated over ``slots`` (a scalar fills every slot)."""
    vector = np.asarray(vector, dtype=np.float64).reshape(-1)
    if vector.size == 1:
        return np.full(slots, vector[0])
    padded = np.zeros(period)
    padded[: vector.size] = vector
    return np.tile(padded, slots // period)
