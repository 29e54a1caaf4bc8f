"""The same model repository on Ray Serve (``veil serve --ray``): one application per model, veil's fronts unchanged.

``veil serve`` and ``veil serve --ray`` differ only in the data plane their one HTTP front and one gRPC front
serve (:mod:`veil.engine.plane`): here the front replica's :class:`~veil.engine.ray_plane.RayPlane`, which hands
each model's work to that model's replicas (:mod:`veil.engine.ray_replica`: each an in-process data plane with
that one model; Ray's HTTP proxy routes ``/v2/models/<model>/...`` straight to them). Stock ``tritonclient.http``
and ``.grpc`` work unchanged: the same routes, messages and errors.

Replicas: ``num_replicas`` is ``--replicas`` when given, else the model's ``instance_group`` count in
config.pbtxt; ``--min-replicas/--max-replicas`` turn on Ray's autoscaling (``target_ongoing_requests``). Each
replica reserves ``--replica-cpus`` CPUs and runs ONNX Runtime on that many intra-op threads (unless
``--intra-op-threads`` says otherwise); batching is veil's dynamic batcher inside each replica (config.pbtxt).
Settings and the CPU check: :mod:`veil.engine.ray_config`.

Example:
    >>> from ray import serve
    >>> serve.start(http_options={"host": "127.0.0.1", "port": 8000})          # doctest: +SKIP
    >>> serve.run_many(app("models/", replicas=2))                             # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import logging
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from ray import serve
from ray.serve.api import RunTarget

from .errors import DeployError
from .ray_config import FRONT, FRONT_APP, RayConfig, check_cluster_cpus, replica_config
from .ray_plane import VeilFront, running_replicas, state_name
from .ray_replica import model_target
from .repository import index
from .server_config import ServerConfig

logger = logging.getLogger("veil.engine")
DEPLOY_POLL_S = 1.0  # how often `veil serve --ray` reads serve.status() while its applications deploy


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
        if state_name(app.status) == "RUNNING":
            continue
        parts = [app.message] if app.message else []
        for deployment, d in app.deployments.items():
            if state_name(d.status) != "HEALTHY":
                parts.append(f"deployment {deployment} {state_name(d.status)}, {running_replicas(d)} replicas running"
                             + (f": {d.message}" if d.message else ""))
        reasons.append(f"{name} {state_name(app.status)}" + (f" ({'; '.join(parts)})" if parts else ""))
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
        if any(state_name(getattr(status.applications.get(n), "status", "")) == "DEPLOY_FAILED" for n in names):
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
