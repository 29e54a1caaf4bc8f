"""Encrypted-inference evaluation workers on Ray: one request's ciphertexts evaluated by several processes at once.

A latency-mode HE request carries up to ``he_max_ciphertexts`` ciphertexts (each a block of images), and each is
a whole, independent evaluation of the plan (seconds at N = 16384). A replica deployed with ``--he-workers W``
(:mod:`veil.engine.ray_replica`) starts W :class:`HeWorker` Ray actors and splits such a request into W contiguous
chunks, one per worker (:meth:`veil.engine.he_model.HeModel._fan_out`); the replica opens and checks the envelope,
the round, the keys' owner and every ciphertext as always, and only the ciphertext chunks travel: each chunk is the
client's own bytes of its ciphertexts (never re-serialized by the replica), parsed once by its worker, and the
results come back as bytes that the replica puts into the result envelope unparsed. A throughput-mode request (one
ciphertext per input feature, all of them one computation) is evaluated in the replica, unsplit.

Each worker loads the model's plan from the repository (its weights encoded once per segment, on first use) and
reads the evaluation keys from the same key-store folder as the replicas (``he_key_dir``, shared storage on a
multi-node cluster), checking the owner's secret again; it keeps its own LRU of parsed keys, so a key set is
parsed once per worker, not shipped through the object store with every request. Workers hold no secret key:
the store refuses bundles with one. Ray is imported only by :class:`WorkerPool`.

Workers that the cluster cannot place yet (not enough CPUs) never hold a request: until every worker has started,
:attr:`WorkerPool.ready` is False and the replica evaluates requests itself (logged once).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from veil.he.evaluate import PlanEvaluator
from veil.he.segments import SegmentedPlan
from veil.he.serialize import ciphertexts_from_bytes, ciphertexts_to_bytes

from .server import open_keystore
from .server_config import ServerConfig

logger = logging.getLogger("veil.engine")


class HeWorker:
    """A Ray actor evaluating chunks of one HE model's latency requests (see the module docstring).

    Args:
        plan_folder: the model version's folder (``plan.json``, or ``segments.json`` and its segments).
        config: the replicas' server settings (``ServerConfig.to_dict()``): the key-store folder and bounds.
    """

    def __init__(self, plan_folder: str, config: dict[str, Any]) -> None:
        self.segmented = SegmentedPlan.load(Path(plan_folder))
        self.keystore = open_keystore(ServerConfig.from_dict(config))
        self._evaluators: dict[int, tuple[Any, PlanEvaluator]] = {}
        self.ciphertexts = 0

    def _stage(self, index: int) -> tuple[Any, PlanEvaluator]:
        if index not in self._evaluators:
            plan = self.segmented.plans[index]
            params = plan.parameters()
            self._evaluators[index] = (params, PlanEvaluator(plan, params))
        return self._evaluators[index]

    def evaluate(self, index: int, key_id: str, key_secret: str, payload: bytes) -> bytes:
        """Segment ``index`` of the plan on a serialized chunk of fresh ciphertexts; returns the results' bytes.

        Raises:
            veil.he.errors.HEError: unknown or expired keys, a wrong secret, malformed ciphertexts (the replica
                checked all of these already; they are checked again because the worker trusts no caller).
        """
        params, evaluator = self._stage(index)
        keys = self.keystore.get(key_id, key_secret)
        cts = ciphertexts_from_bytes(params, payload, fresh=True)
        out = ciphertexts_to_bytes(evaluator.run(cts, keys))
        self.ciphertexts += len(cts)
        return out

    def stats(self) -> dict[str, int]:
        """This worker's process id and how many ciphertexts it has evaluated (tests and benchmarks count them)."""
        return {"pid": os.getpid(), "ciphertexts": self.ciphertexts}


class WorkerPool:
    """W :class:`HeWorker` actors of one model version; calling it is a :data:`~veil.engine.he_model.FanOut`.

    Args:
        plan_folder: the model version's folder.
        config: the replicas' server settings (``ServerConfig.to_dict()``).
        workers: how many actors (each reserves ``cpus`` CPUs on the cluster).
        cpus: CPUs each actor reserves.
    """

    def __init__(self, plan_folder: str, config: dict[str, Any], workers: int, cpus: float) -> None:
        import ray

        self._ray = ray
        actor = ray.remote(num_cpus=cpus)(HeWorker)
        self.workers = [actor.remote(plan_folder, config) for _ in range(workers)]
        self._started = [w.stats.remote() for w in self.workers]  # answered once each worker is placed and built
        self._ready, self._warned = False, False

    def wait_ready(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for every worker to start; returns :attr:`ready`."""
        self._ray.wait(self._started, num_returns=len(self._started), timeout=timeout_s)
        return self.ready

    @property
    def ready(self) -> bool:
        """Whether every worker has started (never blocks); until then requests are evaluated in the replica."""
        if not self._ready:
            done, _ = self._ray.wait(self._started, num_returns=len(self._started), timeout=0)
            self._ready = len(done) == len(self._started)
            if not self._ready and not self._warned:
                logger.warning("HE fan-out: %d of %d workers not started yet (is the cluster short of CPUs?); "
                               "the replica evaluates requests itself until they are", len(self._started) - len(done),
                               len(self._started))
                self._warned = True
        return self._ready

    def __call__(self, index: int, key_id: str, key_secret: str, payloads: list[bytes]) -> list[bytes]:
        """Chunk k to worker k (blocking: the replica calls this from its evaluation thread)."""
        if len(payloads) > len(self.workers):
            raise ValueError(f"payloads: expected at most {len(self.workers)} chunks (one per worker), "
                             f"received {len(payloads)}")
        return self._ray.get([w.evaluate.remote(index, key_id, key_secret, p)
                              for w, p in zip(self.workers, payloads, strict=False)])

    def stats(self) -> list[dict[str, int]]:
        return self._ray.get([w.stats.remote() for w in self.workers])
