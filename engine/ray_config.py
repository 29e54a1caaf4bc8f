"""`veil serve --ray`'s settings and what follows from them without a cluster: replica counts, CPUs, paths.

Nothing here imports Ray, so the settings are checked (and tested) before a cluster is joined. The deployment
itself is :mod:`veil.engine.ray_serve`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from veil.config import Config, ConfigError, field

from .repository import index, read_model
from .server_config import ServerConfig

FRONT_APP, FRONT = "veil", "VeilFront"  # the front's Serve application and deployment
REPORT_S = 0.5  # how often (at most) a replica reports its statistics to the front
MULTIPLEX_HEADER = "serve_multiplexed_model_id"  # Ray's header routing a request to a replica holding the adapter


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
    """The Serve application of one model (its route prefix is ``/v2/models/<model>``)."""
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
