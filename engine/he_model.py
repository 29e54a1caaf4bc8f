"""An encrypted-inference model version: a compiled HE plan served as an OIP v2 model.

Request: one BYTES input ``ciphertext`` (shape [1]) holding a veil envelope (kind "request") of the
client's ciphertexts, ``parameters.key_id`` naming evaluation keys registered with ``POST /v2/he/keys`` and
``parameters.key_secret``, the owner's secret returned at registration.
Response: one BYTES output ``ciphertext``, an envelope (kind "result") the client decrypts. The server
holds no secret key and never sees data or results; it checks the envelope's key id, parameter hash and
plan hash, the keys' owner, parameters and rotation steps, the ciphertext count against the plan's layout
(413 beyond it, before any ciphertext is parsed), and every ciphertext fully (parameters, first level,
exact scale, NTT form, size 2, not transparent) before evaluating; whatever SEAL still refuses is a 400.

Limits: a latency plan takes at most ``he_max_ciphertexts`` ciphertexts (each holding up to the plan's
``batch_capacity`` images) per request, default :data:`DEFAULT_MAX_CIPHERTEXTS`, set per model in config.pbtxt
with ``parameters { key: "he_max_ciphertexts" value { string_value: "16" } }``; a throughput plan takes exactly one
ciphertext per input feature. A key upload is capped by :func:`key_upload_limit`.

Deep plans (``segments.json`` in the version folder, see :mod:`veil.he.segments`) run in several rounds:
round k's envelope names segment k's parameter and plan hashes, and its meta carries ``round``,
``request_id`` (issued by the server at round 0, returned in every result) and the combined ``plan_hash``;
the result's meta says ``round``, ``rounds`` and ``final``. A :class:`~veil.he.rounds.RoundBook` refuses a
round replayed, out of order or for another request or key (409) before anything is evaluated.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
from veil.he.envelope import open_envelope, seal_envelope
from veil.he.errors import EnvelopeError, EvaluationFailed, HEError, MismatchError
from veil.he.evaluate import PlanEvaluator
from veil.he.galois import max_bundle_bytes
from veil.he.parallel import ParallelEvaluator
from veil.he.params import describe
from veil.he.plan import Plan
from veil.he.pool import ForkedPool, default_processes
from veil.he.rounds import RoundBook
from veil.he.segments import SegmentedPlan
from veil.he.serialize import blobs_to_bytes, ciphertext_blobs, ciphertexts_from_blobs, ciphertexts_to_bytes

from .errors import DatatypeMismatch, MissingInput, ModelLoadFailed, ShapeMismatch, UnknownInput
from .metrics import Metrics, ModelMetrics
from .protocol import InputTensor
from .repository import PbtxtConfig, TensorConfig

if TYPE_CHECKING:
    from .dataplane import DataPlane

logger = logging.getLogger("veil.engine")
CIPHERTEXT = "ciphertext"
DEFAULT_MAX_CIPHERTEXTS = 8  # latency mode: ciphertexts per request; each costs one full evaluation


class FanOut(Protocol):
    """Evaluation workers (veil.engine.he_fanout.WorkerPool): ``workers`` (one chunk each), ``ready`` (all started),
    and a call (segment index, key id, key secret, one serialized ciphertext chunk per worker) -> each chunk's
    results, in order."""

    workers: list[Any]

    @property
    def ready(self) -> bool: ...

    def __call__(self, index: int, key_id: str, key_secret: str, payloads: list[bytes]) -> list[bytes]: ...


class ServedSegment:
    """One segment as the server runs it: plan, parameters, pre-encoded evaluator, hashes, request bound."""

    def __init__(self, index: int, plan: Plan, max_ciphertexts: int, pool: ForkedPool | None = None,
                 encoded_bytes: int | None = None) -> None:
        self.index, self.plan, self.params = index, plan, plan.parameters()
        # weights encoded here (up to encoded_bytes), not per call; with a pool (--he-processes != 1) the model's
        # workers fork at its first request, once every round has encoded its own and the client's keys are held
        # (both inherited copy-on-write: veil.he.pool.ForkedPool)
        self.evaluator = (PlanEvaluator(plan, self.params, encoded_bytes) if pool is None else
                          ParallelEvaluator(plan, self.params, encoded_bytes, pool=pool))
        self.plan_hash, self.params_hash = plan.hash(), self.params.hash()
        self.max_ciphertexts = max_ciphertexts


class HeModel:
    """A ``backend: "veil_he"`` model: a plan, its pre-encoded weights and the server's key store.

    Args:
        config: the model's config.pbtxt (one BYTES input and output named ``ciphertext``).
        version: the version folder number.
        path: the version's ``plan.json``.
        manifest: veil.json (kind "he-plan").
        plane: the data plane, whose server-wide key store holds the registered evaluation keys.
    """

    def __init__(self, config: PbtxtConfig, version: int, path: Path, manifest: dict[str, Any] | None,
                 plane: DataPlane) -> None:
        self.config, self.name, self.version, self.path = config, config.name, str(version), path
        self.manifest, self.keystore = manifest, plane.keystore()
        self.processes = getattr(plane.options, "he_processes", 1)
        self.encoded_bytes = getattr(plane.options, "he_encoded_bytes", None)
        self.ready, self.session, self.scheduler = False, None, None  # no ORT session, no batcher
        self.metrics: ModelMetrics | None = None
        # set by a deployment with evaluation workers (veil.engine.ray_replica, --he-workers): a latency request's
        # ciphertexts are independent, so chunks of them evaluate on the workers at once; None: all here
        self.fan_out: FanOut | None = None
        self.inputs = {CIPHERTEXT: TensorConfig(CIPHERTEXT, "BYTES", [1])}
        self.outputs = {CIPHERTEXT: TensorConfig(CIPHERTEXT, "BYTES", [1])}

    def load(self, metrics: Metrics) -> None:
        """Read and verify the plan, encode its weights once; then ready."""
        try:
            self.segmented = SegmentedPlan.load(self.path.parent)  # a plain plan folder is one segment
            self.stages, budget = [], self.encoded_bytes  # one budget for the model, spent round by round
            pool = None if self.processes == 1 else ForkedPool(self.processes or default_processes())
            for k, plan in enumerate(self.segmented.plans):
                self.stages.append(ServedSegment(k, plan, self._max_ciphertexts(plan), pool, budget))
                budget = self.stages[-1].evaluator.encoded_bytes_left
        except (OSError, ValueError, KeyError) as exc:
            raise ModelLoadFailed(f"model '{self.name}' version {self.version}: {self.path.parent}: {exc}") from None
        first = self.stages[0]  # what the first round (and a one-segment model) takes
        self.plan, self.params, self.evaluator = first.plan, first.params, first.evaluator
        self.plan_hash, self.params_hash = self.segmented.hash(), first.params_hash
        self.max_ciphertexts = first.max_ciphertexts
        self.rounds = RoundBook(len(self.stages))
        self.key_bundle_limit = max(max_bundle_bytes(params, steps) for params, steps in self._key_sets().values())
        self.metrics = metrics.for_model(self.name, self.version, "veil_he", "veil_he")
        self.ready = True
        logger.info("HE model '%s' version %s ready (%s mode, N=%d, %d levels)", self.name, self.version,
                    self.plan.mode, self.params.poly_modulus_degree, self.plan.levels)

    def _key_sets(self) -> dict[str, tuple[Any, list[int]]]:
        """params hash -> (parameters, rotation steps of every segment using them): one key set each."""
        sets: dict[str, tuple[Any, list[int]]] = {}
        for stage in self.stages:
            steps = sets.get(stage.params_hash, (stage.params, []))[1]
            sets[stage.params_hash] = (stage.params, sorted(set(steps) | set(stage.plan.galois_steps)))
        return sets

    def _max_ciphertexts(self, plan: Plan) -> int:
        """Ciphertexts one request may carry: the input feature count (throughput), or ``he_max_ciphertexts`` (latency)."""
        if plan.mode == "throughput":
            return int(plan.spec["inputs"][0]["features"])
        raw = self.config.parameters.get("he_max_ciphertexts", str(DEFAULT_MAX_CIPHERTEXTS))
        if not raw.isascii() or not raw.isdigit() or int(raw) < 1:
            raise ModelLoadFailed(f"model '{self.name}': config.pbtxt parameters.he_max_ciphertexts expected an int >= 1, "
                                  f"received {raw!r}")
        return int(raw)

    def check_inputs(self, inputs: list[InputTensor], parameters: dict[str, Any] | None = None) -> tuple[dict[str, Any], int]:
        """One BYTES ``ciphertext`` of shape [1], and strings ``parameters.key_id`` and ``parameters.key_secret``."""
        key_id, key_secret = ((parameters or {}).get(k) for k in ("key_id", "key_secret"))
        if not isinstance(key_id, str) or not key_id:
            raise MissingInput(f"model '{self.name}': parameters.key_id expected the id returned by POST /v2/he/keys, "
                               f"received {str(key_id)[:80]!r}")
        if not isinstance(key_secret, str) or not key_secret:
            raise MissingInput(f"model '{self.name}': parameters.key_secret expected the secret returned by "
                               f"POST /v2/he/keys, received {'none' if key_secret is None else type(key_secret).__name__}")
        feeds = {}
        for tensor in inputs:
            if tensor.name != CIPHERTEXT:
                raise UnknownInput(f"model '{self.name}' has no input '{tensor.name}'; expected ['{CIPHERTEXT}']")
            if tensor.datatype != "BYTES":
                raise DatatypeMismatch(f"input '{CIPHERTEXT}': datatype expected BYTES, received {tensor.datatype}")
            if list(tensor.shape) != [1]:
                raise ShapeMismatch(f"input '{CIPHERTEXT}': shape expected [1] (one envelope), received {tensor.shape}")
            feeds[CIPHERTEXT] = bytes(tensor.data.reshape(-1)[0])
        if CIPHERTEXT not in feeds:
            raise MissingInput(f"model '{self.name}': missing inputs ['{CIPHERTEXT}']")
        return {**feeds, "key_id": key_id, "key_secret": key_secret}, 1

    async def infer(self, feeds: dict[str, Any], batch: int) -> tuple[dict[str, np.ndarray], int]:
        """Evaluate the plan on the request's ciphertexts in a worker thread (SEAL releases the GIL)."""
        return {CIPHERTEXT: np.array([await asyncio.to_thread(self._evaluate, feeds)], dtype=object)}, 0

    def _stage_for(self, data: bytes, key_id: str) -> tuple[Any, ServedSegment]:
        """Open the request envelope once (checksum included) and pick its segment (``meta.round``); its hashes are
        checked against that segment's."""
        envelope = open_envelope(data, expect_kind="request", expect_key_id=key_id)
        k = envelope.meta.get("round", 0)
        if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k < len(self.stages):
            raise EnvelopeError(f"envelope.meta.round: expected an int in 0..{len(self.stages) - 1}, received {k!r}")
        stage = self.stages[k]
        if len(self.stages) > 1 and envelope.meta.get("plan_hash") != self.plan_hash:
            raise EnvelopeError(f"envelope.meta.plan_hash: expected {self.plan_hash!r} (the model's combined plan "
                                f"hash), received {envelope.meta.get('plan_hash')!r}")
        for name, want in (("params_hash", stage.params_hash), ("plan_hash", stage.plan_hash)):
            if getattr(envelope, name) != want:  # as open_envelope's expect_* would say it
                raise EnvelopeError(f"envelope.{name}: expected {want!r}, received {getattr(envelope, name)!r}")
        return envelope, stage

    def _evaluate(self, feeds: dict[str, Any]) -> bytes:
        key_id = feeds["key_id"]
        envelope, stage = self._stage_for(feeds[CIPHERTEXT], key_id)
        keys = self.keystore.get(key_id, feeds["key_secret"])
        if keys.params.hash() != stage.params_hash:
            raise MismatchError(f"key_id {key_id}: keys were made for parameters {keys.params.hash()[:12]}, "
                                f"model '{self.name}' segment {stage.index} expects {stage.params_hash[:12]}")
        missing = sorted(set(stage.plan.galois_steps) - set(keys.galois_steps))
        if missing:
            raise MismatchError(f"key_id {key_id}: Galois keys for steps {missing} are missing (the key manifest "
                                f"of model '{self.name}' segment {stage.index} is {stage.plan.galois_steps})")
        ticket = self.rounds.begin(envelope.meta, key_id)  # 409 for a replayed / out-of-order round
        try:
            # parsed once here, to check every ciphertext before anything is evaluated; fan-out workers receive
            # their chunk's original bytes (never re-serialized) and their results travel back as bytes (issue 32)
            blobs = ciphertext_blobs(envelope.payload, max_count=stage.max_ciphertexts)
            cts = ciphertexts_from_blobs(stage.params, blobs, fresh=True)
            start = time.perf_counter()
            try:
                fanned = self._fan_out(stage, blobs, key_id, feeds["key_secret"])
                result = stage.evaluator.run(cts, keys) if fanned is None else fanned
            except HEError:
                raise
            except (RuntimeError, ValueError) as exc:  # SEAL's refusals of ciphertexts that passed every check
                logger.warning("HE model '%s': SEAL refused to evaluate key %s's ciphertexts: %s: %s", self.name,
                               key_id, type(exc).__name__, str(exc)[:200])
                raise EvaluationFailed(f"model '{self.name}': SEAL refused to evaluate the ciphertexts "
                                       f"({type(exc).__name__}: {str(exc)[:200]})") from None
            payload = ciphertexts_to_bytes(result) if fanned is None else blobs_to_bytes(result)
        except BaseException:
            self.rounds.end(ticket, ok=False)
            raise
        self.rounds.end(ticket, ok=True)
        meta = {"server_seconds": round(time.perf_counter() - start, 6), "ciphertexts": len(result),
                "batch": envelope.meta.get("batch"), "round": ticket.round, "rounds": len(self.stages),
                "final": ticket.final}
        if len(self.stages) > 1:
            meta |= {"request_id": ticket.request_id, "plan_hash": self.plan_hash}
        return seal_envelope(payload, kind="result", key_id=key_id, params_hash=stage.params_hash,
                             plan_hash=stage.plan_hash, meta=meta)

    def _fan_out(self, stage: ServedSegment, blobs: list[bytes], key_id: str, key_secret: str) -> list[bytes] | None:
        """The results' SEAL bytes, one per ciphertext, of the plan on ``blobs`` split into contiguous chunks over
        the fan-out workers; None where the request is evaluated here (no workers or not all started, throughput
        mode, whose ciphertexts are one computation, or a single ciphertext)."""
        pool = self.fan_out
        if (pool is None or stage.plan.mode != "latency" or len(blobs) < 2 or len(pool.workers) < 2
                or not pool.ready):  # workers the cluster has not placed yet: evaluate here
            return None
        chunks = np.array_split(np.arange(len(blobs)), min(len(pool.workers), len(blobs)))
        payloads = [blobs_to_bytes([blobs[i] for i in chunk]) for chunk in chunks]
        results = pool(stage.index, key_id, key_secret, payloads)
        out = [ciphertext_blobs(data, max_count=len(chunk)) for data, chunk in zip(results, chunks, strict=True)]
        if [len(part) for part in out] != [len(chunk) for chunk in chunks]:  # one result per ciphertext
            raise RuntimeError(f"HE fan-out: expected {[len(c) for c in chunks]} ciphertexts back, received "
                               f"{[len(part) for part in out]}")
        return [ct for part in out for ct in part]

    def metadata(self, versions: list[str]) -> dict[str, Any]:
        """OIP metadata plus what a client needs: parameters, key manifest, hashes and the plan's layout."""
        client_plan = {k: v for k, v in self.plan.spec.items() if k not in ("values", "ops")}
        segments = [{"index": s.index, "input": s.plan.spec["inputs"][0]["name"],
                     "output": s.plan.spec["outputs"][0]["name"], "mode": s.plan.mode, "levels": s.plan.levels,
                     "parameters": s.params.to_dict(), "params_hash": s.params_hash, "plan_hash": s.plan_hash,
                     "galois_steps": s.plan.galois_steps, "max_ciphertexts": s.max_ciphertexts,
                     "describe": describe(s.params, s.plan.galois_steps),
                     "plan": {k: v for k, v in s.plan.spec.items() if k not in ("values", "ops")}}
                    for s in self.stages]
        return {"name": self.name, "versions": versions, "platform": "veil_he",
                "inputs": [{"name": CIPHERTEXT, "datatype": "BYTES", "shape": [1]}],
                "outputs": [{"name": CIPHERTEXT, "datatype": "BYTES", "shape": [1]}],
                "parameters": {"he": {"mode": self.plan.mode, "levels": self.plan.levels,
                                      "parameters": self.params.to_dict(), "params_hash": self.params_hash,
                                      "plan_hash": self.plan_hash, "galois_steps": self.plan.galois_steps,
                                      "batch_capacity": self.plan.batch_capacity,
                                      "max_ciphertexts": self.max_ciphertexts,
                                      "key_bundle_limit_bytes": self.key_bundle_limit,
                                      "describe": describe(self.params, self.plan.galois_steps),
                                      "plan": client_plan, "rounds": len(self.stages),
                                      "cuts": self.segmented.cuts, "segments": segments},
                               "veil": self.manifest}}

    async def unload(self) -> None:
        self.ready = False
        for stage in getattr(self, "stages", []):
            if isinstance(stage.evaluator, ParallelEvaluator):
                stage.evaluator.close()  # the model's pool: the first close stops it, the rest find it stopped


def key_upload_limit(plane: DataPlane) -> int | None:
    """The largest key bundle any served HE plan's key manifest needs (None: no HE model is loaded)."""
    limits = [m.key_bundle_limit for versions in plane.models.values() for m in versions.values()
              if isinstance(m, HeModel) and m.ready]
    return max(limits, default=None)
