"""Server side: run a :class:`~veil.he.plan.Plan` on ciphertexts with SEAL (``tenseal.sealapi``).

Every weight plaintext is encoded once, at construction, at the level where it is used: in latency mode
the masks of every linear op, pre-rotated by their giant step, tiled over the image blocks. Rotations go
through the plan's key manifest (:func:`veil.he.packing.decompose`: one key switch per step that has its
own key, the power-of-two form otherwise), so the evaluator uses exactly ``plan.galois_steps``. Scales are kept
exact: a weight used at level l is encoded at scale q_l (the prime the next rescale drops), so a product
with a ciphertext at scale Delta rescales back to exactly Delta; after a ct x ct product the scale
(Delta^2 / q_l, within about 1e-7 relative of Delta at 40-bit primes) is reset to Delta.

Example:
    >>> evaluator = PlanEvaluator(plan, plan.parameters())
    >>> out = evaluator.run(keyring.encrypt(plan.encode_inputs(x)), keyring.evaluation_keys())
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tenseal.sealapi as sa
from veil.he.errors import MismatchError
from veil.he.galois import GaloisSet
from veil.he.layout import split_background
from veil.he.packing import decompose, fold_steps, residue, sum_steps, tile
from veil.he.plan import Plan

Ct = sa.Ciphertext
ENCODED_BYTES = 4 << 30  # per evaluator, masks encoded once at load up to this many bytes; the rest at each use


class Chain:
    """The SEAL objects of one parameter set, indexed by level (rescalings consumed)."""

    def __init__(self, params) -> None:
        self.params, self.ctx = params, params.seal_context()
        self.evaluator, self.encoder = sa.Evaluator(self.ctx), sa.CKKSEncoder(self.ctx)
        self.scale, self.slots = params.scale, params.slots
        data, self.parms, self.primes = self.ctx.first_context_data(), [], []
        while data is not None:
            self.parms.append(data.parms_id())
            self.primes.append(float(data.parms().coeff_modulus()[-1].value()))
            data = data.next_context_data()

    def encode(self, values: np.ndarray | float, level: int, scale: float) -> sa.Plaintext:
        pt = sa.Plaintext()
        if np.ndim(values) == 0:
            self.encoder.encode(float(values), self.parms[level], scale, pt)
        else:
            self.encoder.encode(np.asarray(values, dtype=np.float64).tolist(), self.parms[level], scale, pt)
        return pt

    def at(self, ct: Ct, level: int) -> Ct:
        """``ct`` moved down to ``level`` (a copy when it moves; itself when already there)."""
        if self.level_of(ct) == level:
            return ct
        out = Ct()
        self.evaluator.mod_switch_to(ct, self.parms[level], out)
        return out

    def level_of(self, ct: Ct) -> int:
        return len(self.parms) - 1 - self.ctx.get_context_data(ct.parms_id()).chain_index()

    def rescale(self, ct: Ct) -> Ct:
        self.evaluator.rescale_to_next_inplace(ct)
        ct.scale = self.scale
        return ct

    def product(self, a: Ct, b: Ct, relin: sa.RelinKeys) -> Ct:
        out = Ct()
        if a is b:
            self.evaluator.square(a, out)
        else:
            self.evaluator.multiply(a, b, out)
        self.evaluator.relinearize_inplace(out, relin)
        return self.rescale(out)


class PlanEvaluator:
    """Pre-encodes a plan's weights for ``params`` and runs it on ciphertexts.

    Args:
        plan: the compiled plan.
        params: CkksParameters with at least ``plan.levels`` levels and the plan's slot period.
    """

    def __init__(self, plan: Plan, params, encoded_bytes: int | None = None) -> None:
        if params.levels < plan.levels:
            raise MismatchError(f"PlanEvaluator: the plan needs {plan.levels} levels, params offer {params.levels}")
        self.plan, self.chain = plan, Chain(params)
        self.period = int(plan.spec["period"])
        if plan.mode == "latency" and (self.period > self.chain.slots or self.chain.slots % self.period):
            raise MismatchError(f"PlanEvaluator: latency period {self.period} does not divide {self.chain.slots} slots")
        cyclic = plan.mode == "latency" and plan.spec.get("window") == self.period
        if cyclic and self.period != self.chain.slots and not plan.replicated:  # replicated: every block is the same
            raise MismatchError(f"PlanEvaluator: a cyclic block sum (window {self.period}) needs exactly {self.period} "
                                f"slots, params offer {self.chain.slots}")
        self.keys = set(plan.galois_steps)
        self._budget = ENCODED_BYTES if encoded_bytes is None else encoded_bytes
        self.encoded = [self._prepare(op) for op in plan.ops]
        last_use = {v: i for i, op in enumerate(plan.ops) for v in op["inputs"]}
        last_use.pop(plan.spec["outputs"][0]["value"], None)
        self._dead_after: list[list[str]] = [[] for _ in plan.ops]
        for v, i in last_use.items():
            self._dead_after[i].append(v)

    @property
    def encoded_bytes_left(self) -> int:
        """What is left of the ``encoded_bytes`` budget after the masks encoded at load (the next stage's share)."""
        return self._budget

    # -- construction ----------------------------------------------------------------------------------
    def _prepare(self, op: dict[str, Any]) -> Any:
        chain, level = self.chain, op["level"]
        latency = self.plan.mode == "latency"
        if op["op"] == "add_const":
            const = self.plan.tensors[op["const"]]
            if latency:
                return chain.encode(tile(const, chain.slots), level, chain.scale)
            return [chain.encode(float(c), level, chain.scale) for c in const]
        if op["op"] != "linear":
            return None
        q = chain.primes[level - 1]
        biases = [self.plan.tensors[b] for b in op["biases"]]
        if not latency:  # scalar weights are encoded at run time (N * L words each; see docs/he.md)
            return [([chain.encode(float(c), level - 1, chain.scale * q) for c in bias],
                     [_dense_split(self.plan.tensors[name]) for name in row])
                    for bias, row in zip(biases, op["weights"], strict=True)]
        modulus, signed = op["split"]["modulus"], op["split"]["signed"]
        outputs = []
        folds = op.get("folds") or [None] * len(biases)
        for diagonals, broadcast, bias, fold in zip(op["diagonals"], op["broadcast"], biases, folds, strict=True):
            terms = []  # (input index, baby step, giant step, plaintext)
            for k, part in enumerate(diagonals or []):
                if part is None:
                    continue
                masks, offsets = self.plan.tensors[part["masks"]], np.asarray(part["offsets"], dtype=np.int64)
                babies = residue(offsets, modulus, signed)
                for mask, b, delta in zip(masks, babies, offsets, strict=True):
                    g = int(delta - b)
                    terms.append((k, int(b), g, self._mask(mask, g, level - 1, q)))
            sums = [(k, chain.encode(tile(self.plan.tensors[t], chain.slots), level - 1, q))
                    for k, t in enumerate(broadcast or []) if t is not None]
            outputs.append((terms, sums, chain.encode(tile(bias, chain.slots), level - 1, chain.scale * q),
                            fold_steps(fold)))
        return outputs

    def _mask(self, mask: np.ndarray, roll: int, level: int, scale: float) -> sa.Plaintext | tuple:
        """``mask`` rolled by ``roll`` and tiled over the slots, encoded now while the budget lasts; else the plan's
        own row, the roll, level and scale, encoded at use (no copy held: an encoded mask holds N x primes words,
        1.2 MB at N = 16384 and 9 primes, and a tiled float32 copy of a replicated block would hold slots / block
        times the row)."""
        size = self.chain.params.poly_modulus_degree * 8 * (len(self.chain.parms) - level)
        if size <= self._budget:
            self._budget -= size
            return self.chain.encode(tile(np.roll(mask, roll), self.chain.slots), level, scale)
        return mask, roll, level, scale

    def _plaintext(self, pt: sa.Plaintext | tuple) -> sa.Plaintext:
        """A mask's plaintext: itself if encoded at load, else encoded now (see :meth:`_mask`)."""
        if isinstance(pt, sa.Plaintext):
            return pt
        mask, roll, level, scale = pt
        return self.chain.encode(tile(np.roll(mask, roll), self.chain.slots), level, scale)

    # -- run ---------------------------------------------------------------------------------------------
    def run(self, cts: list[Ct], eval_keys) -> list[Ct]:
        """Evaluate the plan. Latency: one ciphertext per sample in and out. Throughput: one per feature.

        Raises:
            MismatchError: wrong ciphertext count, parameters, level or scale.
        """
        if self.plan.mode == "latency":
            return [self._run_one([ct], eval_keys)[0] for ct in cts]
        features = self.plan.spec["inputs"][0]["features"]
        if len(cts) != features:
            raise MismatchError(f"run: throughput mode expects one ciphertext per input feature ({features}), "
                                f"received {len(cts)}")
        return self._run_one(cts, eval_keys)

    def check_fresh(self, cts: list[Ct]) -> None:
        """Refuse ciphertexts that are not fresh: at the first level and the scale of the plan's parameters."""
        chain = self.chain
        for ct in cts:
            if ct.parms_id() != chain.parms[0] or abs(ct.scale / chain.scale - 1) > 1e-9:
                raise MismatchError("run: expected fresh ciphertexts at the first level and scale "
                                    f"2^{chain.params.scale_bits} of the plan's parameters")

    def _run_one(self, cts: list[Ct], keys) -> list[Ct]:
        chain = self.chain
        self.check_fresh(cts)
        values: dict[str, Any] = {self.plan.spec["inputs"][0]["value"]: cts if self.plan.mode == "throughput" else cts[0]}
        kernel = self._latency if self.plan.mode == "latency" else self._throughput
        output = self.plan.spec["outputs"][0]["value"]
        for index, (op, encoded) in enumerate(zip(self.plan.ops, self.encoded, strict=True)):
            outs = kernel(op, [values[v] for v in op["inputs"]], encoded, keys)
            values.update(zip(op["outputs"], outs, strict=True))
            for v in self._dead_after[index]:  # a throughput value is one ciphertext per feature: free it early
                values.pop(v, None)
        result = values[output]
        last = len(chain.parms) - 1
        return [chain.at(ct, last) for ct in (result if isinstance(result, list) else [result])]

    def _latency(self, op: dict[str, Any], xs: list[Ct], encoded: Any, keys) -> list[Ct]:
        chain, ev, level = self.chain, self.chain.evaluator, op["level"]
        kind = op["op"]
        if kind == "linear":
            return self._bsgs([chain.at(x, level - 1) for x in xs], encoded, op["window"], keys.galois)
        if kind == "mul":
            a, b = (chain.at(x, level - 1) for x in xs)
            return [chain.product(a, a if xs[0] is xs[1] else b, keys.relin)]
        if kind == "add":
            out = Ct()
            ev.add(chain.at(xs[0], level), chain.at(xs[1], level), out)
            return [out]
        if kind == "add_const":
            out = Ct()
            ev.add_plain(chain.at(xs[0], level), encoded, out)
            return [out]
        return [self._minus_mean_squares(self._square_sum(op, xs[0], keys), op, xs[1:], keys)]  # sumsq

    def _square_sum(self, op: dict[str, Any], x: Ct, keys) -> Ct:
        """A sumsq op's first half: ``x`` squared, block-summed over the window."""
        x = self.chain.at(x, op["level"] - 1)
        return self._block_sum(self.chain.product(x, x, keys.relin), op["window"], keys.galois)

    def _minus_mean_squares(self, total: Ct, op: dict[str, Any], mean: list[Ct], keys) -> Ct:
        """A sumsq op's second half: ``total - n mean^2`` when the op reads a mean (n: its input's features)."""
        if mean:
            m = self.chain.at(mean[0], op["level"] - 1)
            self.chain.evaluator.sub_inplace(total, _times(self.chain.evaluator, self.chain.product(m, m, keys.relin),
                                                           self.plan.spec["values"][op["inputs"][0]]["features"]))
        return total

    def rotate(self, ct: Ct, step: int, galois: GaloisSet) -> Ct:
        """``ct`` rotated left by ``step`` slots with the manifest's keys (a new ciphertext)."""
        out = ct
        for part in decompose(step, self.keys, self.plan.key_modulus):
            rotated = Ct()
            self.chain.evaluator.rotate_vector(out, part, galois.key_for(part), rotated)
            out = rotated
        return out

    def _block_sum(self, ct: Ct, window: int, galois: GaloisSet) -> Ct:
        """Each block's sum on every slot of [0, window] of the block (he/packing.py), in place."""
        ev = self.chain.evaluator
        for step in sum_steps(window, self.period):
            ev.add_inplace(ct, self.rotate(ct, step, galois))
        return ct

    def _bsgs(self, xs: list[Ct], outputs: list, window: int, galois: GaloisSet) -> list[Ct]:
        """Masked-diagonal products for every output of one linear op (baby rotations shared by outputs)."""
        babies: dict[tuple[int, int], Ct] = {}
        return [self._complete(self._diagonal_sum(xs, terms, babies, galois),
                               self._broadcast_sum(xs, sums, window, galois), bias, folding, galois)
                for terms, sums, bias, folding in outputs]

    def _diagonal_sum(self, xs: list[Ct], terms: list, babies: dict[tuple[int, int], Ct], galois: GaloisSet) -> Ct | None:
        """``sum_g rot_g(sum_b rot_b(x_k) * pt)`` over ``terms`` (k, b, g, mask); ``babies`` caches the rotated
        inputs across calls (every output of an op shares them). None when ``terms`` is empty."""
        ev = self.chain.evaluator
        giants: dict[int, Ct] = {}
        for k, b, g, pt in terms:
            if (k, b) not in babies:
                babies[k, b] = xs[k] if b == 0 else self.rotate(xs[k], b, galois)
            term = Ct()
            ev.multiply_plain(babies[k, b], self._plaintext(pt), term)
            giants[g] = _accumulate(ev, giants.get(g), term)
        total = giants.pop(0, None)
        for g, partial in giants.items():
            total = _accumulate(ev, total, self.rotate(partial, g, galois))
        return total

    def _broadcast_sum(self, xs: list[Ct], sums: list, window: int, galois: GaloisSet) -> Ct | None:
        """An output's broadcast terms ``sum_k x_k * pt`` summed over each block (a PolyNorm's mean, on every slot
        of the window); it reads the op's inputs only, so a worker may compute it beside the diagonal sums."""
        ev = self.chain.evaluator
        spread = None
        for k, pt in sums:
            term = Ct()
            ev.multiply_plain(xs[k], pt, term)
            spread = _accumulate(ev, spread, term)
        return None if spread is None else self._block_sum(spread, window, galois)

    def _complete(self, total: Ct | None, broadcast: Ct | None, bias: sa.Plaintext, folding: list[int],
                  galois: GaloisSet) -> Ct:
        """One output of a linear op from its diagonal sum: folded partial sums added back (p + k S to p), its
        :meth:`_broadcast_sum`, the bias, the rescale."""
        ev = self.chain.evaluator
        for step in folding:
            ev.add_inplace(total, self.rotate(total, step, galois))
        if broadcast is not None:
            total = _accumulate(ev, total, broadcast)
        ev.add_plain_inplace(total, bias)
        return self.chain.rescale(total)

    def _throughput(self, op: dict[str, Any], xs: list[list[Ct]], encoded: Any, keys) -> list[list[Ct]]:
        chain, ev, level = self.chain, self.chain.evaluator, op["level"]
        kind = op["op"]
        if kind == "linear":
            return _scalar_linear(chain, op, [[chain.at(c, level - 1) for c in x] for x in xs], encoded)
        if kind == "mul":
            a, b = ([chain.at(c, level - 1) for c in x] for x in xs)
            n = max(len(a), len(b))
            return [[chain.product(a[j % len(a)], b[j % len(b)], keys.relin) for j in range(n)]]
        if kind in ("add", "add_const"):
            a = [chain.at(c, level) for c in xs[0]]
            others = [chain.at(c, level) for c in xs[1]] if kind == "add" else encoded
            out = []
            for j in range(max(len(a), len(others))):
                ct = Ct()
                (ev.add if kind == "add" else ev.add_plain)(a[j % len(a)], others[j % len(others)], ct)
                out.append(ct)
            return [out]
        total = None  # sumsq: sum the degree-2 squares first (minus n mean^2), relinearize and rescale once
        for c in xs[0]:
            sq = Ct()
            ev.square(chain.at(c, level - 1), sq)
            total = _accumulate(ev, total, sq)
        if len(xs) == 2:
            sq = Ct()
            ev.square(chain.at(xs[1][0], level - 1), sq)
            ev.sub_inplace(total, _times(ev, sq, len(xs[0])))
        ev.relinearize_inplace(total, keys.relin)
        return [[chain.rescale(total)]]


def _times(ev: sa.Evaluator, ct: Ct, n: int) -> Ct:
    """``n * ct`` for an integer n >= 1 by doubling and adding (exact: no plaintext, no level)."""
    result, power = None, ct
    while True:
        if n & 1:
            result = power if result is None else _sum(ev, result, power)
        n >>= 1
        if not n:
            return result
        power = _sum(ev, power, power)


def _sum(ev: sa.Evaluator, a: Ct, b: Ct) -> Ct:
    out = Ct()
    ev.add(a, b, out)
    return out


def _accumulate(ev: sa.Evaluator, total: Ct | None, term: Ct) -> Ct:
    """``total + term`` in place (``term`` when there is no total yet)."""
    if total is None:
        return term
    ev.add_inplace(total, term)
    return total


def _dense_split(matrix: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """:func:`split_background` of a throughput weight matrix, its sparse part as dense rows (one per feature)."""
    rest, w = split_background(matrix, allow=True)
    return rest.toarray(), w


def _scalar_linear(chain: Chain, op: dict[str, Any], xs: list[list[Ct]], encoded: list) -> list[list[Ct]]:
    """Throughput linear op: per output feature, a plaintext-scalar multiply-add over input features.

    Each matrix is ``sparse + 1 w^T`` (:func:`veil.he.layout.split_background`; a PolyNorm centring is dense
    only through its mean): ``sum_i w_i x_i`` is computed once and added to every output feature, so the op
    costs the non-zeros of ``sparse`` plus those of ``w`` instead of the matrix's.
    """
    ev, level = chain.evaluator, op["level"] - 1
    q = chain.primes[level]

    def dot(weights: np.ndarray, x: list[Ct], total: Ct | None) -> Ct | None:
        for i in np.flatnonzero(weights):
            term = Ct()
            ev.multiply_plain(x[i], chain.encode(float(weights[i]), level, q), term)
            total = _accumulate(ev, total, term)
        return total

    outs = []
    for bias, splits in encoded:
        shared = None
        for x, (_, w) in zip(xs, splits, strict=True):
            shared = shared if w is None else dot(w, x, shared)
        feature_cts = []
        for j in range(len(bias)):
            total = None
            for x, (sparse, _) in zip(xs, splits, strict=True):
                total = dot(sparse[j], x, total)
            if total is None and shared is None:
                raise MismatchError(f"run: output feature {j} of node {op['node']!r} has no weights")
            if total is None:
                total = Ct()
                ev.add_plain(shared, bias[j], total)
            else:
                if shared is not None:
                    ev.add_inplace(total, shared)
                ev.add_plain_inplace(total, bias[j])
            feature_cts.append(chain.rescale(total))
        outs.append(feature_cts)
    return outs
