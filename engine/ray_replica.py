"""One model's replicas on Ray Serve (``veil serve --ray``): each an in-process data plane with that one model.

Ray's HTTP proxy routes ``/v2/models/<model>/...`` straight to that model's replicas (longest prefix), which answer
it with veil's own app (:func:`veil.engine.server.create_app`: the same HTTP front, errors and binary tensor
extension as ``veil serve``) over a :class:`~veil.engine.dataplane.DataPlane` holding that one model (batcher,
adapters, HE, codec...). What reaches the front replica instead (gRPC, ``<model>:<adapter>`` names, HE keys) its
:class:`~veil.engine.ray_plane.RayPlane` hands to a replica as one data-plane call (:meth:`VeilModel.call`).

Adapters are multiplexed per replica: a request with the header ``serve_multiplexed_model_id: <adapter>`` (or a
plane call made for one) is routed by Ray to a replica that already holds that adapter in its LRU
(``@serve.multiplexed``, capacity ``adapter_cache_size``) and runs with it (as ``<model>:<adapter>``).

HE fan-out: with ``--he-workers W`` each replica of an encrypted-inference model starts W evaluation actors
(:mod:`veil.engine.he_fanout`) and splits multi-ciphertext requests over them. HE keys: the key store is a folder
every replica reads (``--he-key-dir``, default ``<repo>/.he-keys``, made absolute), not a Ray actor: key sets are up
to ~290 MiB, content-addressed and written atomically, so any replica can register and every replica finds them
without one actor holding every key in memory; each replica keeps its own LRU of parsed keys. On several nodes the
folder must be shared storage (as the repository itself is).

Statistics: every replica reports its Triton statistics to the front at most every ``REPORT_S`` seconds;
``GET /v2/models[/<m>]/stats`` answers their sums plus a ``replicas`` list (replica id, pid, counts).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from pathlib import Path
from typing import Any

import orjson
from fastapi import FastAPI
from ray import serve
from ray.serve.api import RunTarget
from starlette.responses import Response

from .errors import REPLICA_HEADER, EngineError, ModelNotFound, grpc_code, http_status
from .ray_config import (
    FRONT,
    FRONT_APP,
    MULTIPLEX_HEADER,
    REPORT_S,
    RayConfig,
    deployment_options,
    model_app_name,
)
from .repository import check_model_name
from .server import create_app
from .server_config import ServerConfig

logger = logging.getLogger("veil.engine")
HE_WORKER_START_S = 60.0  # how long a replica waits for its HE workers to start before it serves without them
# the data-plane methods the front's RayPlane may call on a replica (veil.engine.plane.Plane)
PLANE_CALLS = frozenset({"model_ready", "model_metadata", "model_config", "model_inputs", "infer",
                         "key_upload_bounds", "register_keys", "delete_keys"})


class _ModelASGI:
    """veil's app as Ray mounts it: the full path restored (Ray strips the route prefix through root_path),
    ``/stats`` answered with every replica's sums, the multiplexed adapter applied, the replica named."""

    def __init__(self, app: FastAPI, owner: VeilModel) -> None:
        self.app, self.owner = app, owner

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        owner = self.owner
        owner.start_reporting()
        scope = {**scope, "root_path": ""}
        path = scope["path"]
        parts = path.rstrip("/").split("/")  # ['', 'v2', 'models', m, ('versions', v,) 'stats']
        if scope["method"] in ("GET", "HEAD") and parts[-1] == "stats" and len(parts) in (5, 7):
            await owner.flush()
            version = parts[5] if len(parts) == 7 else None
            body = orjson.dumps({"model_stats": await owner.board.stats.remote(owner.name, version)})
            await Response(body, media_type="application/json")(scope, receive, send)
            return
        adapter = serve.get_multiplexed_model_id()
        if adapter:
            await owner.adapter(adapter)
            prefix = f"/v2/models/{owner.name}"
            if path.startswith(prefix + "/"):  # <model>/... -> <model>:<adapter>/...
                path = f"{prefix}:{adapter}{path[len(prefix):]}"
                scope = {**scope, "path": path, "raw_path": path.encode()}
        tag = owner.replica.encode()

        async def named(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), (REPLICA_HEADER.encode(), tag)]}
            await send(message)

        await self.app(scope, receive, named)




@serve.ingress()
class VeilModel:
    """One replica of one model: veil's app over a data plane with that model loaded (warm-up included)."""

    def __init__(self, config: dict[str, Any], name: str, he_workers: int = 0, he_worker_cpus: float = 1.0) -> None:
        # the front serves gRPC; a replica binding the port too would collide with it
        self.config = ServerConfig.from_dict(config).replace(grpc_port=None)
        self.name = check_model_name(name)
        self.he_workers, self.he_worker_cpus = he_workers, he_worker_cpus
        self.replica = serve.get_replica_context().replica_id.unique_id
        self.board = serve.get_deployment_handle(FRONT, app_name=FRONT_APP)
        self._reporter: asyncio.Task | None = None
        self._last: bytes = b""

    def __serve_build_asgi_app__(self) -> _ModelASGI:
        self.veil = create_app(self.config, models=[self.name])  # not `app`: Ray's wrapper owns that name
        if self.he_workers:
            self._start_he_workers()
        return _ModelASGI(self.veil, self)

    def _start_he_workers(self) -> None:
        """Give every loaded HE version of this model its evaluation workers (veil.engine.he_fanout)."""
        from .he_fanout import WorkerPool
        from .he_model import HeModel

        for model in self.plane.models.get(self.name, {}).values():
            if isinstance(model, HeModel):
                pool = WorkerPool(str(model.path.parent), self.config.to_dict(), self.he_workers,
                                  self.he_worker_cpus)
                pool.wait_ready(HE_WORKER_START_S)  # bounded: a cluster short of CPUs serves without them meanwhile
                model.fan_out = pool

    async def he_worker_stats(self) -> list[dict[str, Any]]:
        """Per HE version: its workers' pids and ciphertext counts (empty without --he-workers)."""
        pools = [m.fan_out for m in self.plane.models.get(self.name, {}).values() if getattr(m, "fan_out", None)]
        return [row for pool in pools for row in await asyncio.to_thread(pool.stats)]

    @property
    def plane(self) -> Any:  # -> DataPlane
        return self.veil.state.dataplane

    async def ready(self) -> bool:
        return self.plane.ready()

    async def call(self, method: str, *args: Any) -> tuple[int, Any, str]:
        """One data-plane method (:data:`PLANE_CALLS`) on this replica's plane, for the front's RayPlane:
        ``(0, value, replica)``, or ``(HTTP status, message, replica)`` for an error, which the front raises as
        :class:`~veil.engine.errors.ReplicaError` (same status, same message)."""
        async def run() -> Any:
            if method not in PLANE_CALLS:
                raise ValueError(f"method: expected one of {sorted(PLANE_CALLS)}, received {method!r}")
            self.start_reporting()
            with contextlib.suppress(EngineError):  # an unknown adapter: the plane answers the same error
                await self._multiplexed_adapter()
            return await getattr(self.plane, method)(*args)

        try:
            return 0, await run(), self.replica
        except Exception as exc:
            code, message = grpc_code(exc)
            if code == "INTERNAL" and not isinstance(exc, EngineError):
                logger.error("internal error on %s (Ray replica %s)", method, self.replica, exc_info=exc)
            return http_status(exc), message, self.replica

    async def _multiplexed_adapter(self) -> None:
        """Load the adapter Ray routed this request for (``serve_multiplexed_model_id``), if any."""
        adapter = serve.get_multiplexed_model_id()
        if adapter:
            await self.adapter(adapter)

    @serve.multiplexed(max_num_models_per_replica=64)
    async def adapter(self, adapter_id: str) -> str:
        """Load ``adapter_id`` into this replica's adapter LRU (Ray routes its requests here from now on).

        Raises:
            AdapterNotFound / ModelNotFound: the model has no such adapter, or no adapters at all.
        """
        model = self.plane.get_model(self.name)
        cache = getattr(model, "adapters", None)
        if cache is None:
            raise ModelNotFound(f"header {MULTIPLEX_HEADER}: model '{self.name}' serves no adapters, "
                                f"received {adapter_id!r}")
        await asyncio.to_thread(cache.activate, cache.check(adapter_id))
        return adapter_id

    # -- statistics --------------------------------------------------------------------------------------
    def start_reporting(self) -> None:
        if self._reporter is None:
            self._reporter = asyncio.get_running_loop().create_task(self._report_loop())

    async def flush(self) -> None:
        """Send this replica's statistics to the board now if they changed since the last report."""
        rows = await self.plane.statistics(self.name)
        encoded = orjson.dumps(rows)
        if encoded != self._last:
            await self.board.report.remote(self.replica, self.name, os.getpid(), rows)
            self._last = encoded

    async def _report_loop(self) -> None:
        while True:
            try:
                await self.flush()
            except Exception:  # the board restarting: the next round reports again
                self._last = b""
            await asyncio.sleep(REPORT_S)


def model_target(config: ServerConfig, ray: RayConfig, model: str) -> RunTarget:
    """The Serve application of one model (``config`` as :func:`~veil.engine.ray_config.replica_config` made it)."""
    deployment = serve.deployment(VeilModel, name="VeilModel", **deployment_options(Path(config.repo), model, ray))
    return RunTarget(target=deployment.bind(config.to_dict(), model, ray.he_workers, ray.he_worker_cpus),
                     name=model_app_name(model),
                     route_prefix=f"/v2/models/{model}")
