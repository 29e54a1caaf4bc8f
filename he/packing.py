"""Slot arithmetic of latency plans: blocks, masked diagonals, the baby-step/giant-step split, key manifests.

Latency mode packs each image into its own *block* of D slots (D a power of two; image b of a request in
slots [b D, (b + 1) D), ``slots // D`` images per ciphertext, more ciphertexts for a larger batch), no
replication. Every value has slot *positions* inside the block (:mod:`veil.he.layout` chooses them), and a
linear map ``y = A x`` is a sum of signed, masked rotations in slot space:

    y = sum_delta mask_delta (.) rot(x, delta),    delta = p_in[c] - p_out[r],  mask_delta[p_out[r]] = A[r, c]

with the masks tiled over the blocks. A mask is zero wherever the source slot is not one of x's positions
of the same image, so rotations never mix images, and zero padding, row and channel boundaries need no
special case. Only the non-zero (delta, row) pairs are ever built (from ``np.nonzero``), never a D x D
slot matrix. A 3 x 3 convolution over a channel-multiplexed layout has offsets
``{(ci - co) S + g (di W0 + dj)}``: k^2 taps times (C_in + C_out - 1) channel shifts.

Baby-step/giant-step: every offset splits as ``delta = g + b`` with the baby b the residue of delta modulo
m (unsigned in [0, m) or signed in [-m/2, m/2)); ``y = sum_g rot(sum_b rot(mask_delta, -g) (.) rot(x, b), g)``
rotates each input once per distinct baby (shared by every output) and each output once per distinct giant.
:func:`best_split` tries every power of two and the layout's channel and row strides as m, both signs, and
keeps the fewest rotations: k^2 + C_in + C_out - 2 for a convolution (modulus S), about 2 sqrt(D) for a
dense layer.

A one-feature value (a PolyNorm statistic) is *broadcast*: the block sum of the masked products, valid on
every slot of the window [0, E] of each block, with E the power of two above every position. It costs
log2 E + 1 rotations and no level: rotate-and-add over 1, 2, ..., E/2 gives window sums of length E, plus
the same sums rotated by -E; that needs blocks of D >= 2E (the cost of this trick: half the images per
ciphertext, instead of one more level for a mask). Slots outside a value's positions may then hold
leftovers (a dense centring ``-E[x]`` is evaluated as a broadcast, not a dense matrix); masks never read
them and every sum of squares reads only clean values (see :mod:`veil.he.layout`).

Rotation keys: ``"exact"`` asks one Galois key per distinct step (fewest key switches), ``"pow2"`` only the
signed powers of two its steps decompose into (non-adjacent form: popcount key switches per rotation, at
most 2 log2(N/2) keys), ``"binary"`` only positive powers of two (the binary digits of the step modulo
N/2: the fewest keys, at most log2(N/2), more key switches for negative steps), ``"budget:K"`` exact
keys for the K most used steps and signed powers of two for the rest. The key manifest is exactly the
set of steps :func:`decompose` returns for the plan's rotations.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable

import numpy as np

KEY_MODES = ("exact", "pow2", "binary", "budget:K")


def next_pow2(n: int) -> int:
    return 1 << max(0, math.ceil(math.log2(max(n, 1))))


def residue(deltas: np.ndarray, modulus: int, signed: bool) -> np.ndarray:
    """The baby steps ``b`` of ``delta = g + b`` (g a multiple of ``modulus``)."""
    deltas = np.asarray(deltas, dtype=np.int64)
    if signed:
        half = modulus // 2
        return (deltas + half) % modulus - half
    return deltas % modulus


def split_cost(per_input: list[np.ndarray], per_output: list[np.ndarray], modulus: int, signed: bool) -> int:
    """Rotations of one linear op: distinct non-zero babies per input + distinct non-zero giants per output."""
    babies = sum(np.count_nonzero(np.unique(residue(d, modulus, signed))) for d in per_input if len(d))
    giants = sum(np.count_nonzero(np.unique(d - residue(d, modulus, signed))) for d in per_output if len(d))
    return int(babies + giants)


def best_split(per_input: list[np.ndarray], per_output: list[np.ndarray],
               strides: Iterable[int] = ()) -> tuple[int, int, bool]:
    """(rotations, modulus, signed) of the cheapest split over powers of two and the given strides."""
    span = max((int(np.abs(d).max()) for d in per_input if len(d)), default=0)
    moduli = {1 << k for k in range(int(math.log2(2 * span + 2)) + 2)} | {int(s) for s in strides if s > 1}
    best = None
    for m in sorted(moduli):
        for signed in (False, True):
            cost = split_cost(per_input, per_output, m, signed)
            if best is None or cost < best[0]:
                best = (cost, m, signed)
    return best  # type: ignore[return-value]


def sum_steps(window: int, period: int) -> list[int]:
    """Rotations of a block sum broadcast over [0, window]: 1, 2, ..., window / 2, then -window.

    A window as large as the block (``window == period``: one block filling the whole ring, the layout's
    last resort) is summed cyclically: 1, 2, ..., window / 2 alone leave the block's sum on every slot."""
    return [1 << k for k in range(int(math.log2(window)))] + ([] if window == period else [-window])


def fold_steps(fold: tuple[int, int] | list[int] | None) -> list[int]:
    """The rotations that add a folded output's K partial sums back (he/layout.py): S, 2 S, ..., K S / 2."""
    if not fold:
        return []
    stride, count = fold
    return [int(stride) << k for k in range(int(math.log2(count)))]


def block_vector(values: np.ndarray, positions: np.ndarray, period: int) -> np.ndarray:
    """A (period,) block with ``values`` at ``positions`` (a single value fills only its positions)."""
    out = np.zeros(period)
    out[np.asarray(positions, dtype=np.int64)] = np.broadcast_to(np.asarray(values, dtype=np.float64).reshape(-1),
                                                                 (len(positions),))
    return out


def tile(block: np.ndarray, slots: int) -> np.ndarray:
    """A block repeated over ``slots`` (a one-element block fills every slot)."""
    block = np.asarray(block, dtype=np.float64).reshape(-1)
    if block.size == 1:
        return np.full(slots, block[0])
    return np.tile(block, slots // block.size)


# -- rotation keys -------------------------------------------------------------------------------------
def naf(n: int) -> list[int]:
    """Non-adjacent form of ``n``: the fewest signed powers of two summing to it (low digits first)."""
    digits, k = [], 0
    while n:
        if n & 1:
            d = 2 - (n % 4)  # +1 or -1
            digits.append(d << k)
            n -= d
        n >>= 1
        k += 1
    return digits


def pow2_steps(step: int, slots: int) -> list[int]:
    """``step`` as signed powers of two with |2^k| < slots; of step and step -/+ slots, the shorter NAF."""
    step %= slots
    options = [[d for d in naf(s) if abs(d) < slots] for s in (step, step - slots)]
    return min(options, key=lambda ds: (len(ds), ds != options[0]))


def binary_steps(step: int, slots: int) -> list[int]:
    """``step`` modulo slots as positive powers of two (its binary digits)."""
    step %= slots
    return [1 << k for k in range(step.bit_length()) if step >> k & 1]


def parse_key_mode(rotation_keys: str) -> tuple[str, int]:
    """("exact" | "pow2" | "binary" | "budget", K); refuses anything else naming the field."""
    if rotation_keys in ("exact", "pow2", "binary"):
        return rotation_keys, 0
    if isinstance(rotation_keys, str) and rotation_keys.startswith("budget:") and rotation_keys[7:].isdigit():
        return "budget", int(rotation_keys[7:])
    raise ValueError(f"rotation_keys: expected one of {list(KEY_MODES)} (K an int >= 0), received {rotation_keys!r}")


def key_manifest(uses: Counter, rotation_keys: str, slots: int) -> list[int]:
    """The Galois steps a plan needs for its rotations ``uses`` (step -> times per ciphertext)."""
    mode, budget = parse_key_mode(rotation_keys)
    steps = {s % slots: n for s, n in uses.items() if s % slots}  # steps equal modulo slots share a key
    exact = set(steps) if mode == "exact" else set()
    if mode == "budget":
        exact = set(sorted(steps, key=lambda s: (-steps[s], min(s, slots - s)))[:budget])
    keys = {_signed(s, slots) for s in exact}
    for s in steps:
        if s not in exact:
            keys.update(binary_steps(s, slots) if mode == "binary" else pow2_steps(s, slots))
    return sorted(keys)


def decompose(step: int, keys: set[int], slots: int) -> list[int]:
    """The key steps a rotation by ``step`` is done with: itself when it has a key, else its non-adjacent
    form when every digit has a key, else its binary digits."""
    step %= slots
    if step == 0:
        return []
    have = {k % slots for k in keys}
    if step in have:
        return [_signed(step, slots)]
    for parts in (pow2_steps(step, slots), binary_steps(step, slots)):
        if all(p % slots in have for p in parts):
            return parts
    raise ValueError(f"rotation by {_signed(step, slots)}: Galois keys for steps {pow2_steps(step, slots)} are not "
                     f"in the manifest {sorted(keys)}")


def _signed(step: int, slots: int) -> int:
    """The representative of ``step`` modulo slots in (-slots/2, slots/2]."""
    step %= slots
    return step - slots if step > slots // 2 else step


def rotation_uses(ops: list[dict], period: int) -> Counter:
    """Rotation step -> times a latency plan (block ``period``) rotates one ciphertext by it (as the evaluator)."""
    uses: Counter = Counter()
    for op in ops:
        if op["op"] == "linear":
            for steps in op["baby_steps"] + op["giant_steps"]:
                uses.update(steps)
            for part in op["broadcast"]:
                if part is not None:
                    uses.update(sum_steps(op["window"], period))
            for fold in op.get("folds") or []:
                uses.update(fold_steps(fold))
        elif op["op"] == "sumsq":
            uses.update(sum_steps(op["window"], period))
    return uses


def rotation_counts(ops: list[dict], period: int, galois_steps: list[int], slots: int) -> dict[str, int]:
    """Rotations per ciphertext and the key switches they take with the manifest ``galois_steps``."""
    keys, uses = set(galois_steps), rotation_uses(ops, period)
    return {"rotations": sum(uses.values()),
            "key_switches": sum(n * len(decompose(s, keys, slots)) for s, n in uses.items())}
