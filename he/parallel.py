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

Keys: a worker receives a key set's bytes (``EvaluationKeys.to_bytes()``) the first time it meets it and keeps
the last :attr:`WorkerPool.key_sets` parsed: :data:`KEY_SETS`, or as many as the pool's evaluators have parameter
sets, so a deep model's request never evicts a key set it needs again (a ResNet-20's three sets through a two-set
LRU re-sent its 1 GB N = 32768 set every request: +17 s). Input and partial ciphertexts travel serialized through a
pipe.

A deep model's rounds share one :class:`WorkerPool`: it forks once, after every round's evaluator has encoded its
plaintexts, so a worker serves every round (messages name the evaluator) and parses each key set once. One pool per
round instead forked a worker per round, each parsing the same N = 32768 key set (a ResNet-20's 10 rounds: ~17 GB).

Failures: a worker that dies or fails is logged once; its share is recomputed in the parent (the request still
gets the serial result), the pool is closed and forked again on the next request. Workers are daemon processes
reading a pipe: they exit with the parent (``atexit``) or when the pipe closes (the parent was killed).
Concurrent requests: one holds the pool per op; another evaluates that op serially meanwhile.

Example:
    >>> evaluator = ParallelEvaluator(plan, plan.parameters(), processes=os.cpu_count())   # doctest: +SKIP
    >>> out = evaluator.run(cts, keys)   # doctest: +SKIP
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import multiprocessing
import os
import threading
from collections import OrderedDict
from typing import Any

import tenseal.sealapi as sa
from veil.he.evaluate import PlanEvaluator, _accumulate
from veil.he.keys import EvaluationKeys
from veil.he.packing import decompose
from veil.he.serialize import seal_from_bytes, seal_to_bytes

logger = logging.getLogger("veil.he")
KEY_SETS = 2  # parsed key sets a worker keeps at least (LRU, mirrored by the parent; WorkerPool.key_sets)
MIN_ROTATIONS = 8  # a linear op with fewer key switches than this stays in the parent
MULTIPLY_COST = 0.05  # a plaintext product, in key switches (N = 8192..16384, measured ~1/20)
Ct = sa.Ciphertext


def default_processes() -> int:
    """The cores this process may use (``sched_getaffinity``), else ``os.cpu_count()``."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


class WorkerFailed(RuntimeError):
    """A worker process died or answered with an error (its share is recomputed in the parent)."""


class _Worker:
    """The parent's handle on one forked worker: its process, its pipe and the key sets it holds."""

    def __init__(self, process: Any, conn: Any) -> None:
        self.process, self.conn = process, conn
        self.keys: OrderedDict[int, None] = OrderedDict()  # key-set tokens the worker holds

    def send(self, message: tuple) -> None:
        try:
            self.conn.send(message)
        except (OSError, EOFError, ValueError) as exc:
            raise WorkerFailed(f"worker {self.process.pid}: send: {type(exc).__name__}: {exc}") from None

    def receive(self) -> Any:
        try:
            status, value = self.conn.recv()
        except (OSError, EOFError, ValueError) as exc:
            raise WorkerFailed(f"worker {self.process.pid} (exit code {self.process.exitcode}): receive: "
                               f"{type(exc).__name__}: {exc}") from None
        if status != "ok":
            raise WorkerFailed(f"worker {self.process.pid}: {value}")
        return value

    def close(self) -> None:
        try:
            self.conn.close()
        finally:
            if self.process.is_alive():
                self.process.terminate()
            self.process.join(timeout=5)


class WorkerPool:
    """Forked workers shared by the :class:`ParallelEvaluator` s added to it (a deep model's rounds).

    :meth:`start` forks ``processes - 1`` workers, each inheriting every added evaluator's encoded plaintexts
    copy-on-write; call it once all are added (an evaluator made without a pool owns one and starts it at once).
    ``lock``: one op at a time on the workers; a concurrent request evaluates serially meanwhile."""

    def __init__(self, processes: int) -> None:
        self.processes = int(processes)
        self.evaluators: list[ParallelEvaluator] = []
        self.parameter_sets: set[str] = set()
        self.workers: list[_Worker] = []
        self.lock = threading.Lock()
        self._exit_hook = False

    def add(self, evaluator: ParallelEvaluator) -> int:
        """Register ``evaluator``; its index names it in the workers' messages (add all before :meth:`start`)."""
        self.evaluators.append(evaluator)
        self.parameter_sets.add(evaluator.plan.parameters().hash())
        return len(self.evaluators) - 1

    @property
    def key_sets(self) -> int:
        """Parsed key sets a worker keeps: one per parameter set of the evaluators (a client's key set each), at
        least :data:`KEY_SETS`."""
        return max(KEY_SETS, len(self.parameter_sets))

    def start(self) -> None:
        """Fork the workers (each inherits the encoded plaintexts copy-on-write)."""
        if self.processes < 2 or self.workers:
            return
        context = multiprocessing.get_context("fork")
        for _ in range(self.processes - 1):
            parent_end, child_end = context.Pipe()
            process = context.Process(target=_worker_main, args=(self, child_end, parent_end),
                                      daemon=True, name="veil-he-worker")
            process.start()
            child_end.close()
            self.workers.append(_Worker(process, parent_end))
        if not self._exit_hook:
            atexit.register(self.close)
            self._exit_hook = True

    def close(self) -> None:
        """Stop the workers (idempotent); the evaluators stay usable, serially, until :meth:`start`."""
        workers, self.workers = self.workers, []
        for worker in workers:
            with contextlib.suppress(Exception):  # closing a dead worker's pipe: nothing more to do
                worker.close()


class ParallelEvaluator(PlanEvaluator):
    """A :class:`PlanEvaluator` whose large latency-mode linear ops (and independent ciphertexts) use processes.

    Args:
        plan, params, encoded_bytes: as :class:`PlanEvaluator`.
        processes: processes per request, the parent included (default: the cores this process may use);
            1 is the serial evaluator, no worker is forked.
        min_rotations: a linear op costing fewer key switches stays in the parent.
        pool: a :class:`WorkerPool` shared with other evaluators (its ``processes`` apply; the caller starts it
            once all are added); None: a pool of this evaluator's own, forked now.
    """

    def __init__(self, plan, params, encoded_bytes: int | None = None, *, processes: int | None = None,
                 min_rotations: int = MIN_ROTATIONS, pool: WorkerPool | None = None) -> None:
        super().__init__(plan, params, encoded_bytes)
        if pool is None:
            processes = default_processes() if processes is None else int(processes)
            if processes < 1:
                raise ValueError(f"ParallelEvaluator: processes expected >= 1, received {processes}")
        self.pool = pool or WorkerPool(processes)
        self.processes = self.pool.processes
        self.index = self.pool.add(self)
        self.min_rotations = min_rotations
        self.failures = 0  # worker failures seen (tests and metrics)
        self._in_worker = False
        self._op_index = {id(op): i for i, op in enumerate(plan.ops)}
        self._keys: OrderedDict[int, EvaluationKeys] = OrderedDict()  # id -> keys (held, so an id is not reused)
        self._current_keys: EvaluationKeys | None = None
        self._current_op: dict[str, Any] | None = None
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
        worker.send(("keys", token, keys.to_bytes()))
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
        self._current_keys = eval_keys
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
        self._current_op = op
        return super()._latency(op, xs, encoded, keys)

    def _bsgs(self, xs: list[Ct], outputs: list, window: int, galois) -> list[Ct]:
        keys = self._current_keys
        if (self._in_worker or not self.workers or keys is None or keys.galois is not galois
                or not self._lock.acquire(blocking=False)):
            return super()._bsgs(xs, outputs, window, galois)
        try:
            shares = self.partition(outputs, len(self.workers) + 1)
            if shares is None:
                return super()._bsgs(xs, outputs, window, galois)
            op = self._op_index[id(self._current_op)]
            workers = list(self.workers)
            blobs = [seal_to_bytes(x) for x in xs]
            sent = self._send(workers, shares[1:], keys, lambda share: ("bsgs", id(keys), self.index, op, blobs, share))
            partials = [self.partial_sums(xs, outputs, shares[0], galois)]
            for worker, share in zip(workers, shares[1:], strict=False):
                if not share:
                    continue
                answer = self._receive(worker, sent)
                if answer is None:
                    partials.append(self.partial_sums(xs, outputs, share, galois))
                else:
                    partials.append({o: self._load(blob) for o, blob in answer.items()})
        finally:
            self._lock.release()
        return self._finish(xs, outputs, window, galois, partials)

    # -- the split --------------------------------------------------------------------------------------------
    def _switches(self, step: int) -> int:
        return 0 if step == 0 else len(decompose(step, self.keys, self.plan.key_modulus))

    def partition(self, outputs: list, shares: int) -> list[list[tuple[int, list[int]]]] | None:
        """The op's terms in ``shares`` shares, each a list of (output index, term indices); None: keep it serial.

        Two candidate splits, by giant group (output, g) or by baby (input, b); groups go to the least loaded
        share (largest first), loads in key switches plus :data:`MULTIPLY_COST` per product; the split whose
        largest share is smaller wins."""
        babies = {(k, b) for terms, *_ in outputs for k, b, _, _ in terms}
        giants = {(o, g) for o, (terms, *_) in enumerate(outputs) for _, _, g, _ in terms}
        serial = sum(self._switches(b) for _, b in babies) + sum(self._switches(g) for _, g in giants)
        if serial < self.min_rotations:
            return None
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
        if best[0] >= serial - 1e-9:
            return None
        out = []
        for items in best[1]:
            per: dict[int, list[int]] = {}
            for o, t in items:
                per.setdefault(o, []).append(t)
            out.append(sorted(per.items()))
        return out

    def partial_sums(self, xs: list[Ct], outputs: list, share: list[tuple[int, list[int]]], galois) -> dict[int, Ct]:
        """``sum_g rot_g(sum_b rot_b(x_k) * pt)`` over the share's terms, per output index."""
        babies: dict[tuple[int, int], Ct] = {}
        sums = {o: self._diagonal_sum(xs, [outputs[o][0][t] for t in indices], babies, galois) for o, indices in share}
        return {o: total for o, total in sums.items() if total is not None}

    def _finish(self, xs: list[Ct], outputs: list, window: int, galois, partials: list[dict[int, Ct]]) -> list[Ct]:
        """The shares added per output, then folding, broadcast terms, bias and rescale as in the serial path."""
        ev = self.chain.evaluator
        results = []
        for o, (_, sums, bias, folding) in enumerate(outputs):
            total = None
            for part in partials:
                if o in part:
                    total = _accumulate(ev, total, part[o])
            results.append(self._complete(total, xs, sums, bias, folding, window, galois))
        return results


def _worker_main(pool: WorkerPool, conn: Any, parent_end: Any) -> None:
    """A forked worker's loop: ("keys", token, bytes) | ("bsgs", token, evaluator, op, x blobs, share) |
    ("run", token, evaluator, blobs).

    ``pool`` is the parent's object as it was at the fork (its evaluators' encoded plaintexts shared copy-on-write)."""
    parent_end.close()
    for other in pool.workers:  # the pipes of workers forked before this one
        other.conn.close()
    pool.workers = []
    for evaluator in pool.evaluators:
        evaluator._in_worker = True
    keys: OrderedDict[int, EvaluationKeys] = OrderedDict()
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            os._exit(0)  # the parent closed the pipe or died
        try:
            kind, token = message[0], message[1]
            if kind == "keys":
                keys[token] = EvaluationKeys.from_bytes(message[2])
                while len(keys) > pool.key_sets:
                    keys.popitem(last=False)
                conn.send(("ok", None))
                continue
            keys.move_to_end(token)
            evaluator = pool.evaluators[message[2]]
            ctx = evaluator.chain.ctx
            if kind == "bsgs":
                _, _, _, op, blobs, share = message
                xs = [seal_from_bytes(Ct(), ctx, blob) for blob in blobs]
                partial = evaluator.partial_sums(xs, evaluator.encoded[op], share, keys[token].galois)
                conn.send(("ok", {o: seal_to_bytes(ct) for o, ct in partial.items()}))
            elif kind == "run":
                cts = [seal_from_bytes(Ct(), ctx, blob) for blob in message[3]]
                conn.send(("ok", [seal_to_bytes(evaluator._run_one([ct], keys[token])[0]) for ct in cts]))
            else:
                conn.send(("error", f"unknown message {kind!r}"))
        except Exception as exc:  # reported to the parent, which recomputes the share itself
            conn.send(("error", f"{type(exc).__name__}: {str(exc)[:300]}"))
