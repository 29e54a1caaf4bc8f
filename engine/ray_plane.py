"""The data plane of ``veil serve --ray``: the front replica's view of the model replicas (a :class:`Plane`).

Layout on the cluster (one Serve application per model, so each model scales on its own)::

    app "veil"             route "/"                    VeilFront, 1 replica: veil's app (the one HTTP front, and
                                                        with --grpc-port the one gRPC front) over a RayPlane;
                                                        the statistics board
    app "veil-<model>"     route "/v2/models/<model>"   VeilModel x num_replicas (veil.engine.ray_replica)

:class:`RayPlane` answers what is server-wide itself: readiness (a running replica of every model says it is ready),
the statistics board's sums over replicas, the repository API (a model's application deployed or deleted). What
concerns one model (metadata, readiness, configuration, inference, HE keys) it hands to a replica of that model as
one data-plane call (:meth:`~veil.engine.ray_replica.VeilModel.call`), routed with Ray's model multiplexing to a
replica already holding the adapter for a ``<model>:<adapter>`` name; a replica's error comes back as
:class:`~veil.engine.errors.ReplicaError` with its status and message.

Ray Serve's own gRPC proxy routes a call by an ``application`` metadata key that stock ``tritonclient.grpc`` never
sends, so the front runs veil's gRPC service itself, over this plane, on the front replica's event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI
from ray import serve

from .errors import ModelNotFound, ReplicaError
from .plane import Plane
from .protocol import InferRequest, InferResponse
from .ray_config import RayConfig, model_app_name
from .ray_replica import model_target
from .repository import check_model_name, index, read_model
from .server import create_app, open_keystore
from .server_config import ServerConfig

if TYPE_CHECKING:
    from veil.he.keystore import KeyStore

READY_PROBE_S = 2.0  # how long /v2/health/ready waits for one model's running replica to answer


class Board:
    """The statistics board: each replica's last report; answers Triton statistics summed over replicas."""

    def __init__(self) -> None:
        self.reports: dict[str, dict[str, Any]] = {}

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



def state_name(value: Any) -> str:
    """A Ray status enum (or its string) as its plain value: 'RUNNING', 'DEPLOY_FAILED'..."""
    return str(getattr(value, "value", value))


def running_replicas(deployment: Any) -> int:
    """How many replicas of a ``DeploymentStatusOverview`` are RUNNING."""
    return sum(n for state, n in deployment.replica_states.items() if state_name(state) == "RUNNING")


class RayPlane(Plane):
    """The models of a repository as Ray Serve applications (see the module docstring).

    Args:
        config: the replicas' server settings (:func:`~veil.engine.ray_config.replica_config`).
        ray: replica settings (a reloaded model is redeployed with them).
        board: the statistics board the replicas report to.
    """

    extensions = ("ray_serve",)

    def __init__(self, config: ServerConfig, ray: RayConfig, board: Board) -> None:
        self.config, self.ray, self.board = config, ray, board
        self.repo = Path(config.repo)
        self.models: list[str] = list(index(self.repo))
        self._inputs: dict[tuple[str, str | None], dict[str, str]] = {}  # per name and version, until a (re)load
        self._keystore: KeyStore | None = None

    def model_handle(self, model: str, adapter: str = "") -> Any:
        """The deployment handle of ``model``'s replicas; with ``adapter``, routed (Ray's model multiplexing)
        to a replica that already holds it."""
        handle = serve.get_app_handle(model_app_name(model))
        return handle.options(multiplexed_model_id=adapter) if adapter else handle

    async def _call(self, name: str, method: str, *args: Any) -> Any:
        """``method(*args)`` on a replica of the model ``name`` names (``<model>[:<adapter>]``).

        Raises:
            ModelNotFound: the model is not loaded. ReplicaError: what the replica raised (its status, message).
        """
        model, _, adapter = check_model_name(name).partition(":")
        if model not in self.models:
            raise ModelNotFound(f"model '{model}' is not loaded; loaded models: {sorted(self.models)}")
        status, value, replica = await self.model_handle(model, adapter).call.remote(method, *args)
        if status:
            raise ReplicaError(status, value, replica)
        return value

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

    # -- Plane: health, metadata, inference, statistics --------------------------------------------------
    async def server_ready(self) -> tuple[bool, dict[str, Any]]:
        states = await self.model_states()
        ok = all(states.values())
        return ok, {"ready": ok, "models": states}

    async def model_ready(self, name: str, version: str | None) -> dict[str, Any]:
        return await self._call(name, "model_ready", name, version)

    async def model_metadata(self, name: str, version: str | None) -> dict[str, Any]:
        return await self._call(name, "model_metadata", name, version)

    async def model_config(self, name: str, version: str | None) -> dict[str, Any]:
        return await self._call(name, "model_config", name, version)

    async def model_inputs(self, name: str, version: str | None) -> dict[str, str]:
        """Asked of a replica once per name and version (until the model is loaded or unloaded again)."""
        if (name, version) not in self._inputs:
            self._inputs[(name, version)] = await self._call(name, "model_inputs", name, version)
        return self._inputs[(name, version)]

    async def infer(self, name: str, version: str | None, request: InferRequest) -> InferResponse:
        return await self._call(name, "infer", name, version, request)

    async def statistics(self, name: str | None = None, version: str | None = None) -> list[dict[str, Any]]:
        """Summed over replicas (the board's view; each replica reports every ``REPORT_S``)."""
        if name is not None:
            model = check_model_name(name).partition(":")[0]
            if model not in self.models:
                raise ModelNotFound(f"model '{model}' is not loaded; loaded models: {sorted(self.models)}")
        return self.board.stats(name, version)

    def prometheus(self) -> bytes:
        return (b"# veil serve --ray: the model replicas' counters are summed in /v2/models/stats; Ray Serve exports "
                b"its own metrics (ray_serve_*) on Ray's metrics port\n")

    # -- Plane: the repository API ------------------------------------------------------------------------
    async def repository_index(self, ready_only: bool = False) -> list[dict[str, Any]]:
        """Triton's repository index: every model of the repository, READY when its application is running."""
        statuses = (await asyncio.to_thread(serve.status)).applications
        rows = []
        for name in index(self.repo):
            app = statuses.get(model_app_name(name))
            state = "READY" if name in self.models and app is not None and app.status == "RUNNING" else "UNAVAILABLE"
            rows.append({"name": name, "state": state, **({} if state == "READY" else
                                                          {"reason": "unloaded" if app is None else str(app.status)})})
        return [r for r in rows if r["state"] == "READY" or not ready_only]

    async def load(self, name: str, parameters: dict[str, Any] | None = None) -> None:
        """(Re)deploy one model's application: Ray replaces its replicas one by one (the old serve meanwhile)."""
        self.check_load_parameters(parameters)
        folder = self.repo / check_model_name(name)
        if not folder.is_dir():
            raise ModelNotFound(f"model '{name}' is not in the repository {self.repo}")
        target = model_target(self.config, self.ray, name)
        await asyncio.to_thread(serve.run, target.target, name=target.name, route_prefix=target.route_prefix)
        self._inputs.clear()
        if name not in self.models:
            self.models.append(name)

    async def unload(self, name: str) -> None:
        if check_model_name(name) not in self.models:
            raise ModelNotFound(f"model '{name}' is not loaded; loaded models: {sorted(self.models)}")
        self.models.remove(name)
        self._inputs.clear()
        await asyncio.to_thread(serve.delete, model_app_name(name))

    async def drain(self) -> None:
        """Nothing is queued in the front: each replica drains its own model when Ray stops it."""

    async def close(self) -> None:
        """Nothing is held in the front: each replica's process releases its own models when Ray stops it."""

    # -- Plane: HE keys (registered by a replica of an encrypted-inference model, in the shared folder) -----
    def keystore(self) -> KeyStore:
        """The shared key-store folder, read here by private ``/v2/recommend``."""
        if self._keystore is None:
            self._keystore = open_keystore(self.config)
        return self._keystore

    def _he_model(self) -> str:
        he = [m for m in self.models if read_model(self.repo / m).config.backend == "veil_he"]
        if not he:
            raise ModelNotFound("POST /v2/he/keys: no encrypted-inference (veil_he) model is loaded, so no key is "
                                "accepted")
        return he[0]

    async def key_upload_bounds(self) -> tuple[int, str, Path]:
        return await self._call(self._he_model(), "key_upload_bounds")

    async def register_keys(self, path: str, source: str, key_secret: str | None) -> dict[str, Any]:
        return await self._call(self._he_model(), "register_keys", path, source, key_secret)

    async def delete_keys(self, key_id: str, token: str | None, admin: bool) -> None:
        await self._call(self._he_model(), "delete_keys", key_id, token, admin)


@serve.ingress()
class VeilFront(Board):
    """The front replica: veil's app (HTTP, and gRPC with ``grpc_port``) over a :class:`RayPlane`, and the board."""

    def __init__(self, config: dict[str, Any], ray: dict[str, Any]) -> None:
        super().__init__()
        self.config = ServerConfig.from_dict(config)
        self.plane = RayPlane(self.config, RayConfig.from_dict(ray), self)

    def __serve_build_asgi_app__(self) -> FastAPI:
        self.veil = create_app(self.config, plane=self.plane)  # its lifespan starts the gRPC front on this loop
        return self.veil

    async def grpc_port(self) -> int | None:
        """The port the gRPC front bound (None: no gRPC front)."""
        return getattr(self.veil.state, "grpc_port", None)
