"""One request on every core: a :class:`~veil.he.evaluate.PlanEvaluator` whose large linear ops run on forked workers.

TenSEAL's ``sealapi`` bindings hold the GIL (two threads rotating reach ~0.97 CPU-s per wall-s), so threads do
not help; :class:`ParallelEvaluator` forks ``processes - 1`` worker processes once, *after* the plan's weight
plaintexts are encoded, so every worker shares them copy-on-write (no second copy, no second encoding). The
parent is worker 0.

Per latency-mode linear op whose cost (key switches) reaches ``min_rotations``, the op's masked-diagonal terms
are partitioned into ``processes`` shares, either by giant step (each share computes the baby rotations it
needs and its own giant groups) or by baby step (each share computes its babies and rotates its partial sum of
every giant group), whichever gives the smaller largest share by key switches. A share is a partial sum
``sum_g rot_g(sum_b rot_b(x) * pt)`` per output ciphertext; rotation is linear, so the parent adds the shares,
then folds, adds the broadcast terms and bias and rescales exactly as the serial path does. The result is the
serial result up to the order of additions (CKKS noise). A request with several independent ciphertexts sends
whole ciphertexts to the workers instead.

Only the split ops run on the workers; everything else runs once, in the parent. A *lockstep* variant (every
process running the whole plan on its own copy, exchanging only partial sums) saved the op's input crossing the pipe
but ran the unsplit rotations (block sums, folds) and products on every process at once: on 2 cores a ResNet-20's
first three requests took 155, 117 and 126 s, against 135, 104 and 108 s for this split the same day
(docs/he.md "Cores").

Workers, their pipes, keys and failures: :mod:`veil.he.pool`.

Example:
    >>> evaluator = ParallelEvaluator(plan, plan.parameters(), processes=os.cpu_count())   # doctest: +SKIP
    >>> out = evaluator.run(cts, keys)   # doctest: +SKIP
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections import OrderedDict
from typing import Any

import tenseal.sealapi as sa
from veil.he.evaluate import PlanEvaluator, _accumulate
from veil.he.keys import EvaluationKeys
from veil.he.packing import decompose, sum_steps
from veil.he.pool import ForkedPool, WorkerFailed, _Worker, default_processes
from veil.he.serialize import seal_from_bytes, seal_to_bytes

logger = logging.getLogger("veil.he")
MIN_ROTATIONS = 8  # a linear op with fewer key switches than this stays in the parent
MULTIPLY_COST = 0.05  # a plaintext product, in key switches (N = 8192..16384, measured ~1/20)
EXCHANGE_COST = 1.0  # one ciphertext across a pipe (SEAL's zstd save + parse), in key switches (~0.85)
BROADCAST = -1  # in a share's term indices: the output's broadcast terms, block-summed (PlanEvaluator._broadcast_sum)
Ct = sa.Ciphertext


class _Request(threading.local):
    """One thread's request state: concurrent requests to one model each see their own keys, op and stash."""

    keys: EvaluationKeys | None = None
    op: dict[str, Any] | None = None
    stashed: tuple[int, list[Ct]] | None = None  # a statistics pair's sumsq result, until its op asks


class ParallelEvaluator(PlanEvaluator):
    """A :class:`PlanEvaluator` whose large latency-mode linear ops (and independent ciphertexts) use processes.

    Args:
        plan, params, encoded_bytes: as :class:`PlanEvaluator`.
        processes: processes per request, the parent included (default: the cores this process may use);
            1 is the serial evaluator, no worker is forked.
        min_rotations: a linear op costing fewer key switches stays in the parent.
        pool: a :class:`ForkedPool` shared with other evaluators (its ``processes`` apply; the caller starts it
            once all are added); None: a pool of this evaluator's own, forked now.
    """

    def __init__(self, plan, params, encoded_bytes: int | None = None, *, processes: int | None = None,
                 min_rotations: int = MIN_ROTATIONS, pool: ForkedPool | None = None) -> None:
        super().__init__(plan, params, encoded_bytes)
        if pool is None:
            processes = default_processes() if processes is None else int(processes)
            if processes < 1:
                raise ValueError(f"ParallelEvaluator: processes expected >= 1, received {processes}")
        self.pool = pool or ForkedPool(processes)
        self.processes = self.pool.processes
        self.index = self.pool.add(self)
        self.min_rotations = min_rotations
        self.failures = 0  # worker failures seen (tests and metrics)
        self._in_worker = False
        self._op_index = {id(op): i for i, op in enumerate(plan.ops)}
        self._pairs = _statistics_pairs(plan.ops, self.encoded)
        self._keys: OrderedDict[int, EvaluationKeys] = OrderedDict()  # id -> keys (held, so an id is not reused)
        self._request = _Request()
        self._warned = False
        if pool is None:
            self.start()

    # -- pool ----------------------------------------------------------------------------------------------
    @property
    def workers(self) -> list[_Worker]:
        return [] if self._in_worker else self.pool.workers

    @property
    def _lock(self) -> threading.Lock:
        return self.pool.lock

    def start(self) -> None:
        """Fork the pool's workers (each inherits the encoded plaintexts copy-on-write)."""
        self.pool.start()

    def close(self) -> None:
        """Stop the pool's workers (idempotent); the evaluator stays usable, serially, until :meth:`start`."""
        self.pool.close()

    def worker_pids(self) -> list[int]:
        return [w.process.pid for w in self.workers]

    def _failed(self, exc: Exception) -> None:
        self.failures += 1
        if not self._warned:
            logger.warning("HE parallel evaluation: %s; its share is recomputed here and the %d workers are forked "
                           "again on the next request (logged once)", exc, len(self.workers))
            self._warned = True
        self.close()

    def _ensure_keys(self, worker: _Worker, keys: EvaluationKeys) -> None:
        token = id(keys)
        if token in worker.keys:
            worker.keys.move_to_end(token)
            return
        # keys the key store holds parsed only are read by the worker from their file, never sent down the pipe
        # (checked there against the key id, so a file changed since registration is refused, not evaluated with)
        blob = (str(keys.source), keys.key_id) if keys.source is not None else keys.to_bytes()
        worker.send(("keys", token, blob))
        worker.receive()
        worker.keys[token] = None
        while len(worker.keys) > self.pool.key_sets:
            worker.keys.popitem(last=False)

    # -- run -----------------------------------------------------------------------------------------------
    def run(self, cts: list[Ct], eval_keys) -> list[Ct]:
        if self._in_worker or self.processes < 2:
            return super().run(cts, eval_keys)
        if not self.workers:
            self.start()  # after a failure
        self._keys[id(eval_keys)] = eval_keys
        self._keys.move_to_end(id(eval_keys))
        while len(self._keys) > self.pool.key_sets + 1:
            self._keys.popitem(last=False)
        self._request.keys = eval_keys
        if self.plan.mode != "latency" or len(cts) < 2:
            return super().run(cts, eval_keys)
        return self._run_many(cts, eval_keys)

    def _run_many(self, cts: list[Ct], keys: EvaluationKeys) -> list[Ct]:
        """Independent ciphertexts: whole evaluations, ciphertext i on process i mod W (the parent is 0)."""
        if not self._lock.acquire(blocking=False):
            return [self._run_one([ct], keys)[0] for ct in cts]
        try:
            workers = list(self.workers)
            shares = [list(range(len(cts)))[k::len(workers) + 1] for k in range(len(workers) + 1)]
            sent = self._send(workers, shares[1:], keys, lambda share: ("run", id(keys), self.index,
                                                                         [seal_to_bytes(cts[i]) for i in share]))
            out: dict[int, Ct] = {i: self._run_one([cts[i]], keys)[0] for i in shares[0]}
            for worker, share in zip(workers, shares[1:], strict=False):
                if not share:
                    continue
                blobs = self._receive(worker, sent)
                if blobs is None:
                    out.update({i: self._run_one([cts[i]], keys)[0] for i in share})
                else:
                    out.update({i: self._load(blob) for i, blob in zip(share, blobs, strict=True)})
            return [out[i] for i in range(len(cts))]
        finally:
            self._lock.release()

    def _send(self, workers: list[_Worker], shares: list, keys, message) -> set[int]:
        """Send each worker its share (an empty share sends nothing); the ids of the workers that took theirs."""
        sent = set()
        for worker, share in zip(workers, shares, strict=False):
            if not share:
                continue
            try:
                self._ensure_keys(worker, keys)
                worker.send(message(share))
                sent.add(id(worker))
            except WorkerFailed as exc:
                self._failed(exc)
        return sent

    def _receive(self, worker: _Worker, sent: set[int]) -> Any:
        if id(worker) not in sent:
            return None
        try:
            return worker.receive()
        except WorkerFailed as exc:
            self._failed(exc)
            return None

    def _load(self, blob: bytes) -> Ct:
        return seal_from_bytes(Ct(), self.chain.ctx, blob)

    def _latency(self, op, xs, encoded, keys):
        self._request.op = op
        index = self._op_index[id(op)]
        stashed, self._request.stashed = self._request.stashed, None
        if stashed is not None and stashed[0] == index:
            return stashed[1]
        if index in self._pairs and not self._in_worker and self.workers:
            outs = self._statistics_pair(index, xs, keys)
            if outs is not None:
                return outs
        return super()._latency(op, xs, encoded, keys)

    def _statistics_pair(self, index: int, xs: list[Ct], keys: EvaluationKeys) -> list[Ct] | None:
        """A PolyNorm's statistics when its linear op does not split (a diagonal, a mean): a worker block-sums the
        mean while the parent squares the other output and block-sums that for the next op (sumsq), the two
        rotation chains at once instead of one after the other; the sumsq result waits in ``_request`` for its
        op. None (nothing done) when the op splits or another request holds the workers."""
        op, outputs, galois, chain = self.plan.ops[index], self.encoded[index], keys.galois, self.chain
        if self.partition(outputs, len(self.workers) + 1, op["window"]) is not None \
                or not self._lock.acquire(blocking=False):
            return None
        nxt, means = self.plan.ops[index + 1], self._pairs[index]
        try:
            xs = [chain.at(x, op["level"] - 1) for x in xs]
            worker = self.workers[0]
            sent = self._send([worker], [[(o, [BROADCAST]) for o in means]], keys,
                              lambda share: ("bsgs", id(keys), self.index, index, [seal_to_bytes(x) for x in xs], share))
            outs: dict[int, Ct] = {}
            babies: dict[tuple[int, int], Ct] = {}
            for o, (terms, sums, bias, folding) in enumerate(outputs):
                if o not in means:
                    outs[o] = self._complete(self._diagonal_sum(xs, terms, babies, galois),
                                             self._broadcast_sum(xs, sums, op["window"], galois), bias, folding, galois)
            square = self._square_sum(nxt, outs[op["outputs"].index(nxt["inputs"][0])], keys)
            answer = self._receive(worker, sent)
            for o in means:
                _, sums, bias, folding = outputs[o]
                mean = self._load(answer[o, BROADCAST]) if answer is not None else \
                    self._broadcast_sum(xs, sums, op["window"], galois)
                outs[o] = self._complete(None, mean, bias, folding, galois)
        finally:
            self._lock.release()
        result = [outs[o] for o in range(len(outputs))]
        mean = [result[op["outputs"].index(v)] for v in nxt["inputs"][1:]]
        self._request.stashed = (index + 1, [self._minus_mean_squares(square, nxt, mean, keys)])
        return result

    def _bsgs(self, xs: list[Ct], outputs: list, window: int, galois) -> list[Ct]:
        keys = self._request.keys
        if (self._in_worker or not self.workers or keys is None or keys.galois is not galois
                or not self._lock.acquire(blocking=False)):
            return super()._bsgs(xs, outputs, window, galois)
        try:
            shares = self.partition(outputs, len(self.workers) + 1, window)
            if shares is None:
                return super()._bsgs(xs, outputs, window, galois)
            op = self._op_index[id(self._request.op)]
            workers = list(self.workers)
            blobs = [seal_to_bytes(x) for x in xs]
            sent = self._send(workers, shares[1:], keys, lambda share: ("bsgs", id(keys), self.index, op, blobs, share))
            partials = [self.partial_sums(xs, outputs, shares[0], galois, window)]
            for worker, share in zip(workers, shares[1:], strict=False):
                if not share:
                    continue
                answer = self._receive(worker, sent)
                if answer is None:
                    partials.append(self.partial_sums(xs, outputs, share, galois, window))
                else:
                    partials.append({o: self._load(blob) for o, blob in answer.items()})
        finally:
            self._lock.release()
        return self._finish(xs, outputs, window, galois, partials)

    # -- the split --------------------------------------------------------------------------------------------
    def _switches(self, step: int) -> int:
        return 0 if step == 0 else len(decompose(step, self.keys, self.plan.key_modulus))

    def partition(self, outputs: list, shares: int, window: int | None = None
                  ) -> list[list[tuple[int, list[int]]]] | None:
        """The op's terms in ``shares`` shares, each a list of (output index, term indices); None: keep it serial.

        Two candidate splits, by giant group (output, g) or by baby (input, b); groups go to the least loaded
        share (largest first), loads in key switches plus :data:`MULTIPLY_COST` per product. With ``window``, an
        output's broadcast terms are a group too (term index :data:`BROADCAST`: their block sum, a PolyNorm's
        mean, needs only the op's inputs, so it runs beside the diagonal sums, not after them); the split whose
        largest share is smaller wins, if that share plus :data:`EXCHANGE_COST` per ciphertext that crosses a pipe
        (the op's inputs out, a share's partial sums back) is below the serial op's load."""
        babies = {(k, b) for terms, *_ in outputs for k, b, _, _ in terms}
        giants = {(o, g) for o, (terms, *_) in enumerate(outputs) for _, _, g, _ in terms}
        broadcasts = {(o, BROADCAST): sum(map(self._switches, sum_steps(window, self.period))) + MULTIPLY_COST * len(sums)
                      for o, (_, sums, *_) in enumerate(outputs) if sums and window is not None}
        switches = sum(self._switches(b) for _, b in babies) + sum(self._switches(g) for _, g in giants) + \
            sum(broadcasts.values())
        if switches < self.min_rotations:
            return None
        serial = switches + MULTIPLY_COST * sum(len(terms) for terms, *_ in outputs)
        best = None
        for by_giant in (True, False):
            groups: dict[tuple[int, int], list[tuple[int, int]]] = {}
            needs: dict[tuple[int, int], set[tuple[int, int]]] = {}  # the other kind's rotations a group needs
            for o, (terms, *_) in enumerate(outputs):
                for t, (k, b, g, _) in enumerate(terms):
                    key, other = ((o, g), (k, b)) if by_giant else ((k, b), (o, g))
                    groups.setdefault(key, []).append((o, t))
                    needs.setdefault(key, set()).add(other)
            own = {key: self._switches(key[1]) + MULTIPLY_COST * len(items) for key, items in groups.items()}
            for key, cost in broadcasts.items():
                groups[key], needs[key], own[key] = [key], set(), cost
            bins: list[list[tuple[int, int]]] = [[] for _ in range(shares)]
            loads, seen = [0.0] * shares, [set() for _ in range(shares)]
            for key in sorted(groups, key=lambda kk: -own[kk]):
                extra = [sum(self._switches(x[1]) for x in needs[key] - seen[i]) for i in range(shares)]
                i = min(range(shares), key=lambda j: loads[j] + extra[j])
                loads[i] += own[key] + extra[i]
                seen[i] |= needs[key]
                bins[i].extend(groups[key])
            if best is None or max(loads) < best[0]:
                best = (max(loads), bins)
        inputs = len({k for terms, *_ in outputs for k, *_ in terms})
        if best[0] + EXCHANGE_COST * (inputs + len(outputs) + len(broadcasts)) >= serial - 1e-9:
            return None
        out = []
        for items in best[1]:
            per: dict[int, list[int]] = {}
            for o, t in items:
                per.setdefault(o, []).append(t)
            out.append(sorted(per.items()))
        return out

    def partial_sums(self, xs: list[Ct], outputs: list, share: list[tuple[int, list[int]]], galois,
                     window: int | None = None) -> dict[Any, Ct]:
        """``sum_g rot_g(sum_b rot_b(x_k) * pt)`` over the share's terms, per output index ``o``; under the key
        ``(o, BROADCAST)``, that output's broadcast sum where the share holds it."""
        babies: dict[tuple[int, int], Ct] = {}
        out: dict[Any, Ct] = {}
        for o, indices in share:
            total = self._diagonal_sum(xs, [outputs[o][0][t] for t in indices if t != BROADCAST], babies, galois)
            if total is not None:
                out[o] = total
            if BROADCAST in indices:
                out[o, BROADCAST] = self._broadcast_sum(xs, outputs[o][1], window, galois)
        return out

    def _finish(self, xs: list[Ct], outputs: list, window: int, galois, partials: list[dict[Any, Ct]]) -> list[Ct]:
        """The shares added per output, then folding, the broadcast sum (here if no share held it), bias and
        rescale as in the serial path."""
        ev = self.chain.evaluator
        results = []
        for o, (_, sums, bias, folding) in enumerate(outputs):
            total, broadcast = None, None
            for part in partials:
                if o in part:
                    total = _accumulate(ev, total, part[o])
                broadcast = part.get((o, BROADCAST), broadcast)
            if broadcast is None and sums:
                broadcast = self._broadcast_sum(xs, sums, window, galois)
            results.append(self._complete(total, broadcast, bias, folding, galois))
        return results


def _statistics_pairs(ops: list[dict[str, Any]], encoded: list) -> dict[int, list[int]]:
    """Linear op index -> its outputs that are a mean only (broadcast terms, no diagonal), where the next op is
    the sumsq reading that op's other output and such a mean: the pairs :meth:`ParallelEvaluator._statistics_pair`
    overlaps."""
    pairs = {}
    for i, (op, nxt) in enumerate(itertools.pairwise(ops)):
        if op["op"] != "linear" or nxt["op"] != "sumsq" or len(nxt["inputs"]) != 2 \
                or not set(nxt["inputs"]) <= set(op["outputs"]):
            continue
        means = [o for o, (terms, sums, _, folding) in enumerate(encoded[i]) if sums and not terms and not folding]
        if op["outputs"].index(nxt["inputs"][1]) in means and op["outputs"].index(nxt["inputs"][0]) not in means:
            pairs[i] = means
    return pairs
