"""The same model repository on Ray Serve: veil's data plane in every replica, the OIP v2 HTTP front unchanged.

Layout on the cluster (one Serve application per model, so each model scales on its own)::

    app "veil"             route "/"                    VeilFront, 1 replica: server-wide routes, statistics board,
                                                        the gRPC front with --grpc-port (veil.engine.ray_grpc)
    app "veil-<model>"     route "/v2/models/<model>"   VeilModel x num_replicas: veil's own FastAPI app with
                                                        that one model loaded (batcher, adapters, HE, codec...)

Ray's HTTP proxy routes ``/v2/models/<model>/...`` straight to that model's replicas (longest prefix), which
answer it with the same route functions as ``veil serve``: JSON and Triton's binary tensor extension, the same
errors, so ``tritonclient.http`` works unchanged. The front answers what is server-wide (``/v2``, health,
``/v2/models/stats``, HE key registration, the repository API) and forwards ``<model>:<adapter>`` names, which the
proxy cannot route by prefix, to the model's replicas through a deployment handle.

Replicas: ``num_replicas`` is ``--replicas`` when given, else the model's ``instance_group`` count in
config.pbtxt; ``--min-replicas/--max-replicas`` turn on Ray's autoscaling (``target_ongoing_requests``). Each
replica reserves ``--replica-cpus`` CPUs and runs ONNX Runtime on that many intra-op threads (unless
``--intra-op-threads`` says otherwise); batching is veil's dynamic batcher inside each replica (config.pbtxt).

Adapters are multiplexed per replica: a request with the header ``serve_multiplexed_model_id: <adapter>`` is
routed by Ray to a replica that already holds that adapter in its LRU (``@serve.multiplexed``, capacity
``adapter_cache_size``) and runs with it (as ``<model>:<adapter>``).

HE keys: the key store is a folder every replica reads (``--he-key-dir``, default ``<repo>/.he-keys``, made
absolute), not a Ray actor: key sets are up to ~290 MiB, content-addressed and written atomically, so any
replica can register and every replica finds them without one actor holding every key in memory and copying
it through the object store on each cache miss; each replica keeps its own LRU of parsed keys. On several nodes
the folder must be shared storage (as the repository itself is).

Statistics: every replica reports its Triton statistics to the front at most every ``REPORT_S`` seconds;
``GET /v2/models[/<m>]/stats`` answers their sums plus a ``replicas`` list (replica id, pid, counts).

Example:
    >>> from ray import serve
    >>> serve.start(http_options={"host": "127.0.0.1", "port": 8000})          # doctest: +SKIP
    >>> serve.run_many(app("models/", replicas=2))                             # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import math
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from fastapi import FastAPI, Request
from ray import serve
from ray.serve.api import RunTarget
from starlette.responses import Response

from veil import __version__
from veil.config import Config, ConfigError, field

from . import proto
from .dataplane import DataPlane
from .errors import (
    DeployError,
    EngineError,
    ModelNotFound,
    ReplicaError,
    RepositoryApiDisabled,
    Unauthorized,
    add_exception_handlers,
    grpc_code,
    http_status,
)
from .http import (
    EXTENSIONS,
    _json_body,
    bearer_token,
    key_upload_bounds,
    register_key_bytes,
    spool_key_upload,
)
from .repository import check_model_name, index, read_model
from .server import ServerConfig, create_app

logger = logging.getLogger("veil.engine")
FRONT_APP, FRONT, REPORT_S = "veil", "VeilFront", 0.5
READY_PROBE_S = 2.0  # how long /v2/health/ready waits for one model's running replica to answer
DEPLOY_POLL_S = 1.0  # how often `veil serve --ray` reads serve.status() while its applications deploy
HE_WORKER_START_S = 60.0  # how long a replica waits for its HE workers to start before it serves without them
REPLICA_HEADER = b"veil-replica"  # which replica answered (response header)
MULTIPLEX_HEADER = "serve_multiplexed_model_id"


@dataclass
class RayConfig(Config):
    """Where and how wide `veil serve --ray` deploys.

    Args:
        ray_address (str): the Ray cluster to join ('auto', 'ray://host:10001'); '' starts a local one.
        replicas (int): replicas of every model; 0 takes each model's config.pbtxt instance_group count.
        min_replicas (int): with max_replicas: autoscale each model between these bounds.
        max_replicas (int): 0: fixed replica counts (no autoscaling).
        target_ongoing_requests (float): autoscaling target of in-flight requests per replica.
        replica_cpus (float): CPUs each model replica reserves (and ONNX Runtime threads, rounded up).
        max_ongoing_requests (int): requests one replica takes at once; Ray queues the rest.
        he_workers (int): evaluation workers per HE model replica (veil.engine.he_fanout); 0: none.
        he_worker_cpus (float): CPUs each HE evaluation worker reserves.
        deploy_timeout_s (float): how long `veil serve --ray` waits for every application to run before it deletes
            them and exits 2 with Ray's reason.
    """

    ray_address: str = field("", "Ray cluster to join ('auto', 'ray://HOST:10001'); empty: start a local one")
    replicas: int = field(0, "replicas per model (0: each model's config.pbtxt instance_group count)")
    min_replicas: int = field(1, "autoscaling lower bound per model (with --max-replicas)")
    max_replicas: int = field(0, "autoscaling upper bound per model (0: no autoscaling)")
    target_ongoing_requests: float = field(4.0, "autoscaling target: in-flight requests per replica")
    replica_cpus: float = field(1.0, "CPUs each model replica reserves (ONNX Runtime gets as many threads)")
    max_ongoing_requests: int = field(32, "requests one replica takes at once (Ray queues the rest)")
    he_workers: int = field(0, "Ray actors each HE model replica splits a multi-ciphertext latency request over "
                               "(0: the replica evaluates everything itself)")
    he_worker_cpus: float = field(1.0, "CPUs each HE evaluation worker reserves")
    deploy_timeout_s: float = field(300.0, "seconds `veil serve --ray` waits for every model's replicas to run "
                                           "before it stops and exits 2 with Ray's reason")

    def validate(self) -> None:
        if self.replicas < 0 or self.min_replicas < 0 or self.max_replicas < 0:
            raise ConfigError(f"RayConfig: expected replicas, min_replicas, max_replicas >= 0, received "
                              f"{self.replicas}, {self.min_replicas}, {self.max_replicas}")
        if self.max_replicas and self.min_replicas > self.max_replicas:
            raise ConfigError(f"RayConfig.min_replicas: expected <= max_replicas ({self.max_replicas}), "
                              f"received {self.min_replicas}")
        if self.replicas and self.max_replicas:
            raise ConfigError("RayConfig: expected either --replicas (fixed) or --max-replicas (autoscaling), "
                              f"received both ({self.replicas} and {self.max_replicas})")
        if self.he_workers < 0 or self.he_worker_cpus <= 0:
            raise ConfigError(f"RayConfig: expected he_workers >= 0 and he_worker_cpus > 0, received "
                              f"{self.he_workers} and {self.he_worker_cpus}")
        if self.deploy_timeout_s <= 0:
            raise ConfigError(f"RayConfig.deploy_timeout_s: expected > 0 (--ray-deploy-timeout), received "
                              f"{self.deploy_timeout_s}")
        if self.replica_cpus <= 0 or self.max_ongoing_requests < 1 or self.target_ongoing_requests <= 0:
            raise ConfigError(f"RayConfig: expected replica_cpus > 0, max_ongoing_requests >= 1 and "
                              f"target_ongoing_requests > 0, received {self.replica_cpus}, "
                              f"{self.max_ongoing_requests} and {self.target_ongoing_requests}")


def model_app_name(model: str) -> str:
    return f"{FRONT_APP}-{model}"


def replica_config(config: ServerConfig, ray: RayConfig) -> ServerConfig:
    """The replicas' server config: absolute paths (Ray workers have their own working directory), the key
    store beside the repository unless given, and as many ORT threads as the replica has CPUs."""
    repo = Path(config.repo).resolve()
    return config.replace(repo=str(repo), he_key_dir=str(Path(config.he_key_dir or repo / ".he-keys").resolve()),
                          intra_op_threads=config.intra_op_threads or math.ceil(ray.replica_cpus))


def deployment_options(repo: Path, model: str, ray: RayConfig) -> dict[str, Any]:
    """Ray deployment options of one model: fixed replicas (flag or instance_group count) or autoscaling."""
    options: dict[str, Any] = {"ray_actor_options": {"num_cpus": ray.replica_cpus},
                               "max_ongoing_requests": ray.max_ongoing_requests}
    if ray.max_replicas:
        options["autoscaling_config"] = {"min_replicas": ray.min_replicas, "max_replicas": ray.max_replicas,
                                         "target_ongoing_requests": ray.target_ongoing_requests}
    else:
        options["num_replicas"] = ray.replicas or read_model(repo / model).config.instance_count
    return options


# -- the model replicas ------------------------------------------------------------------------------------
async def _call_asgi(app: Any, method: str, path: str, query: bytes, headers: list[tuple[bytes, bytes]],
                     body: bytes, client: str) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    """One HTTP request through an ASGI app in this process -> (status, headers, body)."""
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "scheme": "http",
             "path": path, "raw_path": path.encode(), "query_string": query, "headers": headers, "root_path": "",
             "server": ("ray", 0), "client": (client, 0)}
    sent = False
    status, out_headers, chunks = 500, [], []

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if sent:
            await asyncio.Event().wait()  # nothing more arrives; the app never waits here for a finished body
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status, out_headers
        if message["type"] == "http.response.start":
            status, out_headers = message["status"], list(message.get("headers", []))
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))

    await app(scope, receive, send)
    return status, out_headers, b"".join(chunks)


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
                message = {**message, "headers": [*message.get("headers", []), (REPLICA_HEADER, tag)]}
            await send(message)

        await self.app(scope, receive, named)


@serve.ingress()
class VeilModel:
    """One replica of one model: veil's FastAPI app with that model loaded (warm-up included)."""

    def __init__(self, config: dict[str, Any], name: str, he_workers: int = 0, he_worker_cpus: float = 1.0) -> None:
        # the front serves gRPC (veil.engine.ray_grpc); a replica binding the port too would collide with it
        self.config = ServerConfig.from_dict(config).replace(grpc_port=None)
        self.name = check_model_name(name)
        self.he_workers, self.he_worker_cpus = he_workers, he_worker_cpus
        self.replica = serve.get_replica_context().replica_id.unique_id
        self.board = serve.get_deployment_handle(FRONT, app_name=FRONT_APP)
        self._reporter: asyncio.Task | None = None
        self._last: bytes = b""

    def __serve_build_asgi_app__(self) -> _ModelASGI:
        from .grpc_server import InferenceService

        self.veil = create_app(self.config, models=[self.name])  # not `app`: Ray's wrapper owns that name
        self.grpc_service = InferenceService(self.plane, self.config.admin_token, self.config.max_bytes_elements)
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
    def plane(self) -> Any:
        return self.veil.state.dataplane

    async def ready(self) -> bool:
        return self.plane.ready()

    async def forward(self, method: str, path: str, query: bytes, headers: list[tuple[bytes, bytes]], body: bytes,
                      client: str) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        """A request the front received (``<model>:<adapter>`` routes, HE keys), answered by this replica's app."""
        self.start_reporting()
        with contextlib.suppress(EngineError):  # an unknown adapter: the app below answers the same error
            await self._multiplexed_adapter()
        status, out, content = await _call_asgi(self.veil, method, path, query, headers, body, client)
        return status, [*out, (REPLICA_HEADER, self.replica.encode())], content

    async def rpc(self, method: str, payload: bytes) -> tuple[int, bytes | str]:
        """A gRPC call the front received (veil.engine.ray_grpc), answered by veil's gRPC service over this
        replica's data plane: ``(0, serialized response)``, or ``(HTTP status, message)`` for an error, which the
        front passes on with that status's gRPC code."""
        async def call() -> bytes:
            await self._multiplexed_adapter()
            request = proto.METHODS[method][0].FromString(payload)
            return (await getattr(self.grpc_service, method)(request, None)).SerializeToString()

        return await self._answer(f"gRPC {method}", call)

    async def key_bounds(self) -> tuple[int, Any]:
        """``(0, (limit, flag, key folder))`` for the front's key upload, or ``(HTTP status, message)``."""
        async def call() -> tuple[int, str, str]:
            limit, flag = key_upload_bounds(self.plane)
            return limit, flag, str(self.plane.keystore().root)

        return await self._answer("key upload bounds", call)

    async def register_key_file(self, path: str, source: str, key_secret: str | None) -> tuple[int, Any]:
        """Register the key bundle the front spooled to ``path`` in the shared key folder (the upload never passes
        through Ray's object store): ``(0, response body)`` or ``(HTTP status, message)``."""
        async def call() -> dict[str, Any]:
            store = self.plane.keystore()
            body = await asyncio.to_thread(Path(path).read_bytes)
            return await register_key_bytes(store, body, source, key_secret)

        return await self._answer("key registration", call)

    async def _answer(self, what: str, call: Any) -> tuple[int, Any]:
        """``(0, await call())``, or ``(HTTP status, message)`` for what it raised (a server fault logged once)."""
        try:
            return 0, await call()
        except Exception as exc:
            code, message = grpc_code(exc)
            if code == "INTERNAL" and not isinstance(exc, EngineError):
                logger.error("internal error on %s (Ray replica %s)", what, self.replica, exc_info=exc)
            return http_status(exc), message

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

    def _snapshot(self) -> list[dict[str, Any]]:
        rows = []
        for m in self.plane.models.get(self.name, {}).values():
            if m.metrics is not None:
                entry = m.metrics.to_triton()
                if getattr(m, "adapters", None) is not None:
                    entry["adapter_cache"] = m.adapters.stats()
                rows.append(entry)
        return rows

    async def flush(self) -> None:
        """Send this replica's statistics to the board now if they changed since the last report."""
        rows = self._snapshot()
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


# -- the front: server-wide routes -----------------------------------------------------------------------
def _proxy(result: tuple[int, list[tuple[bytes, bytes]], bytes]) -> Response:
    status, headers, body = result
    response = Response(body, status_code=status)
    response.raw_headers = [(k, v) for k, v in headers]
    return response


class _Board:
    """The statistics board: each replica's last report; answers Triton statistics summed over replicas."""

    reports: dict[str, dict[str, Any]]

    def report(self, replica: str, model: str, pid: int, rows: list[dict[str, Any]]) -> None:
        self.reports[replica] = {"model": model, "pid": pid, "rows": rows, "time": time.time()}

    def stats(self, model: str | None = None, version: str | None = None) -> list[dict[str, Any]]:
        """Triton ``model_stats`` entries (optionally one model / version), each with a ``replicas`` list."""
        merged: dict[tuple[str, str], dict[str, Any]] = {}
        for replica, rep in sorted(self.reports.items()):
            if model is not None and rep["model"] != model.partition(":")[0]:
                continue
            for row in rep["rows"]:
                if version is not None and row["version"] != version:
                    continue
                key = (row["name"], row["version"])
                total = merged.setdefault(key, {**row, "inference_count": 0, "execution_count": 0,
                                                "last_inference": 0, "replicas": [],
                                                "inference_stats": {k: {"count": 0, "ns": 0}
                                                                    for k in row["inference_stats"]}})
                total["inference_count"] += row["inference_count"]
                total["execution_count"] += row["execution_count"]
                total["last_inference"] = max(total["last_inference"], row["last_inference"])
                for k, d in row["inference_stats"].items():
                    total["inference_stats"][k]["count"] += d["count"]
                    total["inference_stats"][k]["ns"] += d["ns"]
                total["replicas"].append({"replica": replica, "pid": rep["pid"],
                                          "inference_count": row["inference_count"],
                                          "execution_count": row["execution_count"],
                                          "success_count": row["inference_stats"]["success"]["count"],
                                          **({"adapter_cache": row["adapter_cache"]} if "adapter_cache" in row else {})})
        return [merged[k] for k in sorted(merged)]


@serve.ingress()
class VeilFront(_Board):
    """Server metadata, health, summed statistics, HE key registration and the repository API."""

    async def __init__(self, config: dict[str, Any], ray: dict[str, Any]) -> None:
        self.config, self.ray = ServerConfig.from_dict(config), RayConfig.from_dict(ray)
        self.reports = {}
        self.repo = Path(self.config.repo)
        self.models: list[str] = list(index(self.repo))
        self._grpc: Any = None  # the grpc.aio server: held here, or it is garbage-collected and stops serving
        self._grpc_port: int | None = None
        if self.config.grpc_port is not None:  # the OIP gRPC front (veil.engine.ray_grpc), on this replica's loop
            from .ray_grpc import start

            self._grpc, self._grpc_port = await start(self)

    async def grpc_port(self) -> int | None:
        """The port the gRPC front bound (None: no gRPC front)."""
        return self._grpc_port

    def model_handle(self, model: str, adapter: str = "") -> Any:
        """The deployment handle of ``model``'s replicas; with ``adapter``, routed (Ray's model multiplexing)
        to a replica that already holds it."""
        handle = serve.get_app_handle(model_app_name(model))
        return handle.options(multiplexed_model_id=adapter) if adapter else handle

    async def model_states(self) -> dict[str, bool]:
        """Per deployed model: whether one of its replicas says its model is ready.

        A model without a running replica is not ready, and is not asked (a handle call would wait for a replica
        that may never start: /v2/health/ready hung while Ray waited for CPUs; issue 31 item 12); a running
        replica that does not answer within ``READY_PROBE_S`` is not ready either."""
        apps = (await asyncio.to_thread(serve.status)).applications

        async def one(name: str) -> bool:
            app = apps.get(model_app_name(name))
            if app is None or not any(running_replicas(d) for d in app.deployments.values()):
                return False
            response = self.model_handle(name).ready.remote()
            try:
                return bool(await asyncio.wait_for(asyncio.ensure_future(response), READY_PROBE_S))
            except Exception:  # timed out, or the replica is stopping: not ready
                with contextlib.suppress(Exception):
                    response.cancel()
                return False

        return dict(zip(self.models, await asyncio.gather(*(one(name) for name in self.models)), strict=True))

    def __serve_build_asgi_app__(self) -> FastAPI:
        app = FastAPI(title="veil (Ray Serve)", version=__version__, docs_url=None, redoc_url=None, openapi_url=None)
        get = ["GET", "HEAD"]
        app.add_api_route("/v2", self.server_metadata, methods=get)
        app.add_api_route("/v2/health/live", self.live, methods=get)
        app.add_api_route("/v2/health/ready", self.ready, methods=get)
        app.add_api_route("/v2/models/stats", self.all_stats, methods=get)
        app.add_api_route("/v2/models/{model}", self.forward_model, methods=[*get, "POST"])
        app.add_api_route("/v2/models/{model}/{rest:path}", self.forward_model, methods=[*get, "POST"])
        app.add_api_route("/v2/he/keys", self.he_keys, methods=["POST"])
        app.add_api_route("/v2/he/keys/{key_id}", self.he_keys, methods=["DELETE"])
        app.add_api_route("/v2/repository/index", self.repository_index, methods=["POST"])
        app.add_api_route("/v2/repository/models/{model}/load", self.repository_load, methods=["POST"])
        app.add_api_route("/v2/repository/models/{model}/unload", self.repository_unload, methods=["POST"])
        add_exception_handlers(app)
        app.state.body_timeout_s = self.config.body_timeout_s  # a key upload arriving too slowly: 408
        return app

    async def server_metadata(self, request: Request) -> Response:
        admin = self.config.admin_token is not None
        return _json({"name": "veil", "version": __version__,
                      "extensions": EXTENSIONS + ["model_repository"] * admin + ["ray_serve"]})

    async def live(self, request: Request) -> Response:
        return _json({"live": True})

    async def ready(self, request: Request) -> Response:
        """Ready when one replica of every deployed model says its model is ready."""
        states = await self.model_states()
        ok = all(states.values())
        return _json({"ready": ok, "models": states}, 200 if ok else 503)

    async def all_stats(self, request: Request) -> Response:
        return _json({"model_stats": self.stats()})

    async def _forward(self, request: Request, model: str, adapter: str = "") -> Response:
        if model not in self.models:
            raise ModelNotFound(f"model '{model}' is not loaded; loaded models: {sorted(self.models)}")
        handle = self.model_handle(model, adapter)
        client = request.client.host if request.client is not None else "unknown"
        result = await handle.forward.remote(request.method, request.url.path, request.url.query.encode(),
                                             list(request.headers.raw), await request.body(), client)
        return _proxy(result)

    async def forward_model(self, request: Request, model: str, rest: str = "") -> Response:
        """``<model>:<adapter>`` routes (the proxy routes plain names straight to the model's replicas), sent to a
        replica that already holds the adapter."""
        name, _, adapter = check_model_name(model).partition(":")
        return await self._forward(request, name, adapter)

    async def he_keys(self, request: Request, key_id: str | None = None) -> Response:
        """Key registration is done by a replica of an encrypted-inference model; the store is the shared folder.

        An upload (up to ~290 MiB) is spooled here straight into that folder and the replica registers it from the
        file, so it never passes through Ray's object store (a ~170 MiB key set stalled a 200 MiB store when it
        was forwarded as a message); a DELETE is forwarded."""
        import tempfile

        he = [m for m in self.models if read_model(self.repo / m).config.backend == "veil_he"]
        if not he:
            raise ModelNotFound("POST /v2/he/keys: no encrypted-inference (veil_he) model is loaded, so no key is "
                                "accepted")
        if request.method != "POST":
            return await self._forward(request, he[0])
        handle = self.model_handle(he[0])
        limit, flag, folder = replica_answer(await handle.key_bounds.remote())
        client = request.client.host if request.client is not None else "unknown"
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".upload-", suffix=".part") as spool:
            await spool_key_upload(request, limit, flag, spool)
            spool.flush()
            body = replica_answer(await handle.register_key_file.remote(spool.name, client, bearer_token(request)))
        return _json(body)

    def _check_admin(self, request: Request) -> None:
        token = self.config.admin_token
        if token is None:
            raise RepositoryApiDisabled("the repository API is off: start the server with --admin-token or "
                                        "VEIL_ADMIN_TOKEN")
        if not hmac.compare_digest((bearer_token(request) or "").encode(), token.encode()):
            raise Unauthorized("repository API: expected the header 'Authorization: Bearer <admin token>'")

    async def repository_index(self, request: Request) -> Response:
        self._check_admin(request)
        return _json(self.index_rows())

    async def repository_load(self, request: Request, model: str) -> Response:
        self._check_admin(request)
        body = await _json_body(request)
        params = body.get("parameters", {})
        DataPlane.check_load_parameters(params if isinstance(params, dict) else {"parameters": params})
        await self.load_model(model)
        return _json({})

    async def repository_unload(self, request: Request, model: str) -> Response:
        self._check_admin(request)
        await self.unload_model(model)
        return _json({})

    # -- the repository operations both fronts (HTTP, gRPC) call once the admin token is checked ----------------
    def index_rows(self) -> list[dict[str, str]]:
        """Triton's repository index: every model of the repository, READY when its application is running."""
        statuses = serve.status().applications
        rows = []
        for name in index(self.repo):
            app = statuses.get(model_app_name(name))
            state = "READY" if name in self.models and app is not None and app.status == "RUNNING" else "UNAVAILABLE"
            rows.append({"name": name, "state": state, **({} if state == "READY" else
                                                          {"reason": "unloaded" if app is None else str(app.status)})})
        return rows

    async def load_model(self, model: str) -> None:
        """(Re)deploy one model's application: Ray replaces its replicas one by one (the old serve meanwhile)."""
        folder = self.repo / check_model_name(model)
        if not folder.is_dir():
            raise ModelNotFound(f"model '{model}' is not in the repository {self.repo}")
        target = model_target(self.config, self.ray, model)
        await asyncio.to_thread(serve.run, target.target, name=target.name, route_prefix=target.route_prefix)
        if model not in self.models:
            self.models.append(model)

    async def unload_model(self, model: str) -> None:
        if check_model_name(model) not in self.models:
            raise ModelNotFound(f"model '{model}' is not loaded; loaded models: {sorted(self.models)}")
        self.models.remove(model)
        await asyncio.to_thread(serve.delete, model_app_name(model))


def replica_answer(answer: tuple[int, Any]) -> Any:
    """The value of a replica's ``(0, value)`` answer; its ``(status, message)`` raised as ReplicaError."""
    status, value = answer
    if status:
        raise ReplicaError(status, value)
    return value


def _json(content: Any, status_code: int = 200) -> Response:
    return Response(orjson.dumps(content), status_code=status_code, media_type="application/json")


# -- building and running the applications ------------------------------------------------------------------
def model_target(config: ServerConfig, ray: RayConfig, model: str) -> RunTarget:
    """The Serve application of one model (``config`` as :func:`replica_config` made it)."""
    deployment = serve.deployment(VeilModel, name="VeilModel", **deployment_options(Path(config.repo), model, ray))
    return RunTarget(target=deployment.bind(config.to_dict(), model, ray.he_workers, ray.he_worker_cpus),
                     name=model_app_name(model),
                     route_prefix=f"/v2/models/{model}")


def app(repo: str | Path, config: ServerConfig | None = None, ray: RayConfig | None = None,
        **ray_options: Any) -> list[RunTarget]:
    """The Serve applications of a repository: the front (with the statistics board) and one per model.

    Args:
        repo: the model repository folder.
        config: server settings (host/port are Ray's HTTP proxy's, set with ``serve.start``; ``grpc_port``: the
            front's gRPC server).
        ray: replica settings; or give them as keywords (``replicas=2``, ``max_replicas=4``...).

    Example:
        >>> serve.run_many(app("models/", replicas=2))   # doctest: +SKIP
    """
    ray = ray or RayConfig(**ray_options)
    config = replica_config((config or ServerConfig(repo=str(repo))).replace(repo=str(repo)), ray)
    models = index(Path(config.repo))
    front = serve.deployment(VeilFront, name=FRONT, num_replicas=1, ray_actor_options={"num_cpus": 0},
                             max_ongoing_requests=256).bind(config.to_dict(), ray.to_dict())
    return [RunTarget(target=front, name=FRONT_APP, route_prefix="/"),
            *(model_target(config, ray, m) for m in models)]


def required_cpus(repo: str | Path, ray: RayConfig) -> dict[str, float]:
    """model -> the CPUs its replicas reserve at start (``--replicas`` or its instance_group count, or
    ``--min-replicas`` when autoscaling, times ``--replica-cpus``; plus ``--he-workers x --he-worker-cpus`` per HE
    model replica)."""
    out = {}
    for model in index(Path(repo)):
        options = deployment_options(Path(repo), model, ray)
        replicas = options.get("num_replicas", options.get("autoscaling_config", {}).get("min_replicas", 1))
        he = read_model(Path(repo) / model).config.backend == "veil_he"
        out[model] = replicas * (ray.replica_cpus + (ray.he_workers * ray.he_worker_cpus if he else 0.0))
    return out


def check_cluster_cpus(repo: str | Path, ray: RayConfig, available: float) -> None:
    """Refuse to deploy replicas that reserve more CPUs than the cluster has: Ray would wait for them forever
    (`--replicas 2` over 5 models on 2 CPUs printed nothing for 13 minutes; issue 31 item 12).

    Raises:
        ConfigError: naming the CPUs needed per model, the cluster's and the flags to change.
    """
    need = required_cpus(repo, ray)
    total = sum(need.values())
    if total > available + 1e-9:
        per_model = ", ".join(f"{m} {c:g}" for m, c in sorted(need.items()))
        raise ConfigError(f"veil serve --ray: the replicas reserve {total:g} CPUs ({per_model}), expected at most the "
                          f"cluster's {available:g}; lower --replicas (or instance_group count), --replica-cpus or "
                          "--he-workers, or join a larger cluster with --ray-address")


def _state(value: Any) -> str:
    """A Ray status enum (or its string) as its plain value: 'RUNNING', 'DEPLOY_FAILED'..."""
    return str(getattr(value, "value", value))


def running_replicas(deployment: Any) -> int:
    """How many replicas of a ``DeploymentStatusOverview`` are RUNNING."""
    return sum(n for state, n in deployment.replica_states.items() if _state(state) == "RUNNING")


def deploy_reason(status: Any, names: list[str]) -> str:
    """One line: why the applications ``names`` are not running, in Ray's words (each application's and each
    unhealthy deployment's status message, e.g. "... replicas that have taken more than 30s to be scheduled ...
    Resources required for each replica: ..."), '' when they all run."""
    reasons = []
    for name in names:
        app = status.applications.get(name)
        if app is None:
            reasons.append(f"{name}: not deployed")
            continue
        if _state(app.status) == "RUNNING":
            continue
        parts = [app.message] if app.message else []
        for deployment, d in app.deployments.items():
            if _state(d.status) != "HEALTHY":
                parts.append(f"deployment {deployment} {_state(d.status)}, {running_replicas(d)} replicas running"
                             + (f": {d.message}" if d.message else ""))
        reasons.append(f"{name} {_state(app.status)}" + (f" ({'; '.join(parts)})" if parts else ""))
    return " ".join("; ".join(reasons).split())  # Ray's messages span lines: one line


def wait_until_running(names: list[str], timeout_s: float, stop: threading.Event) -> bool:
    """Poll serve.status() until every application in ``names`` is RUNNING (True) or ``stop`` is set (False).

    Raises:
        DeployError: an application's deploy failed, or they were not all running after ``timeout_s``; the
            message gives Ray's reason and the flag to change.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        status = serve.status()
        reason = deploy_reason(status, names)
        if not reason:
            return True
        if any(_state(getattr(status.applications.get(n), "status", "")) == "DEPLOY_FAILED" for n in names):
            raise DeployError(f"veil serve --ray: the deploy failed: {reason}")
        if time.monotonic() >= deadline:
            raise DeployError(f"veil serve --ray: the models were not running after {timeout_s:g} s "
                              f"(--ray-deploy-timeout): {reason}")
        if stop.wait(min(DEPLOY_POLL_S, max(0.0, deadline - time.monotonic()))):
            return False


def _delete_apps(names: list[str], timeout_s: float) -> None:
    """Delete veil's applications (the models first, then the front), waiting at most ``timeout_s`` for them."""
    for name in names:
        with contextlib.suppress(Exception):  # already gone
            serve.delete(name, _blocking=False)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            if not set(names) & set(serve.status().applications):
                return
        time.sleep(min(DEPLOY_POLL_S, timeout_s))
    logger.warning("veil serve --ray: applications still being deleted after %g s: %s", timeout_s, names)


def serve_ray(config: ServerConfig, ray_config: RayConfig) -> None:
    """`veil serve --ray`: join (or start) a Ray cluster, deploy the repository, wait (at most
    ``deploy_timeout_s``) for it to run, serve until SIGINT/SIGTERM, then delete veil's applications (a local
    cluster is stopped with this process).

    The first SIGINT or SIGTERM, also while deploying, stops it cleanly (Ray's driver turns SIGTERM into an exit
    inside whatever it is doing, which aborted; issue 31 item 12).

    Raises:
        ConfigError: the replicas reserve more CPUs than the cluster has (nothing is deployed).
        DeployError: the applications did not all run in time, or Ray failed them (they are deleted first).
    """
    import ray

    stop = threading.Event()
    ray.init(address=ray_config.ray_address or None, include_dashboard=False, log_to_driver=False)
    previous = {}  # signal handlers can only be set from the main thread (embedding callers stop it otherwise)
    if threading.current_thread() is threading.main_thread():
        previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    names: list[str] = []
    try:
        check_cluster_cpus(config.repo, ray_config, ray.cluster_resources().get("CPU", 0.0))
        serve.start(http_options={"host": config.host, "port": config.port})
        targets = app(config.repo, config, ray_config)
        names = [t.name for t in reversed(targets)]  # deleted in this order: the models, then the front
        print(f"veil serve --ray: deploying {len(targets) - 1} models (waiting up to {ray_config.deploy_timeout_s:g} "
              "s for their replicas, --ray-deploy-timeout)", file=sys.stderr, flush=True)
        serve.run_many(targets, wait_for_applications_running=False)
        if not wait_until_running(names, ray_config.deploy_timeout_s, stop):
            return
        grpc_port = serve.get_app_handle(FRONT_APP).grpc_port.remote().result()
        grpc = f", gRPC {config.host}:{grpc_port}" if grpc_port is not None else ""
        print(f"veil serve --ray: {len(targets) - 1} models on http://{config.host}:{config.port}{grpc} "
              f"(Ray {ray.__version__})", flush=True)
        while not stop.wait(1.0):
            pass
    finally:
        try:
            if names:
                _delete_apps(names, config.graceful_timeout_s)
        finally:
            ray.shutdown()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
