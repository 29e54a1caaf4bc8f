"""Forked worker processes shared by :class:`~veil.he.parallel.ParallelEvaluator` s: processes, pipes, key sets.

Keys: a worker receives a key set's bytes (``EvaluationKeys.to_bytes()``), or the key id and file of keys the key
store holds parsed only (``EvaluationKeys.source``), the first time it meets it. Keys the parent held when the worker
forked are its parent's, shared copy-on-write (``EvaluationKeys.held``: a ResNet-20's 2.5 GB parsed once for both
processes); others it reads from their file, checked against the key id. It keeps
the last :attr:`ForkedPool.key_sets` parsed: :data:`KEY_SETS`, or as many as the pool's evaluators have parameter
sets, so a deep model's request never evicts a key set it needs again (a ResNet-20's three sets through a two-set
LRU re-sent its 1 GB N = 32768 set every request: +17 s). Input and partial ciphertexts travel serialized through a
pipe.

A deep model's rounds share one :class:`ForkedPool`: it forks once, after every round's evaluator has encoded its
plaintexts (the server: at the first request, so the client's registered keys are inherited), so a worker serves
every round (messages name the evaluator) and parses each key set once. One pool per
round instead forked a worker per round, each parsing the same N = 32768 key set (a ResNet-20's 10 rounds: ~17 GB).

Failures: a worker that dies or fails is logged once; its share is recomputed in the parent (the request still
gets the serial result), the pool is closed and forked again on the next request. Workers are daemon processes
reading a pipe: they exit with the parent (``atexit``) or when the pipe closes (the parent was killed).
Concurrent requests: one holds the pool per op; another evaluates that op serially meanwhile.
"""

from __future__ import annotations

import atexit
import contextlib
import multiprocessing
import os
import threading
from collections import OrderedDict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import tenseal.sealapi as sa
from veil.he.keys import EvaluationKeys
from veil.he.serialize import seal_from_bytes, seal_to_bytes

if TYPE_CHECKING:
    from veil.he.parallel import ParallelEvaluator

KEY_SETS = 2  # parsed key sets a worker keeps at least (LRU, mirrored by the parent; ForkedPool.key_sets)
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


class ForkedPool:
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
        self._starting = threading.Lock()  # concurrent first requests fork one worker set, not one each
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
        with self._starting:
            if self.processes < 2 or self.workers:
                return
            context = multiprocessing.get_context("fork")
            for _ in range(self.processes - 1):
                parent_end, child_end = context.Pipe()
                process = context.Process(target=_worker_main, args=(self, child_end, parent_end),
                                          daemon=True, name="veil-he-worker")
                process.start()
                child_end.close()
                self.workers.append(_Worker(process, parent_end))  # the next child closes its pipe
            if not self._exit_hook:
                atexit.register(self.close)
                self._exit_hook = True

    def close(self) -> None:
        """Stop the workers (idempotent); the evaluators stay usable, serially, until :meth:`start`."""
        workers, self.workers = self.workers, []
        for worker in workers:
            with contextlib.suppress(Exception):  # closing a dead worker's pipe: nothing more to do
                worker.close()


def _worker_main(pool: ForkedPool, conn: Any, parent_end: Any) -> None:
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
                blob = message[2]  # (the key store's file, its key id), or the bytes of keys held in memory
                if isinstance(blob, tuple):  # the parent's, if it held them when this worker forked (shared)
                    keys[token] = EvaluationKeys.held(blob[1]) or EvaluationKeys.from_file(Path(blob[0]), blob[1])
                else:
                    keys[token] = EvaluationKeys.from_bytes(blob)
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
                partial = evaluator.partial_sums(xs, evaluator.encoded[op], share, keys[token].galois,
                                                 evaluator.plan.ops[op]["window"])
                conn.send(("ok", {o: seal_to_bytes(ct) for o, ct in partial.items()}))
            elif kind == "run":
                cts = [seal_from_bytes(Ct(), ctx, blob) for blob in message[3]]
                conn.send(("ok", [seal_to_bytes(evaluator._run_one([ct], keys[token])[0]) for ct in cts]))
            else:
                conn.send(("error", f"unknown message {kind!r}"))
        except Exception as exc:  # reported to the parent, which recomputes the share itself
            conn.send(("error", f"{type(exc).__name__}: {str(exc)[:300]}"))
