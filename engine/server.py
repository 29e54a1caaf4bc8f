"""Wiring: the FastAPI app (routes, exception handlers, lifespan) and the uvicorn server around it.

The app is the one HTTP front (:mod:`veil.engine.http`) and, with ``grpc_port``, the one gRPC front
(:mod:`veil.engine.grpc_server`) over a data plane: by default a :class:`~veil.engine.dataplane.DataPlane` that loads
the repository into this process; ``veil serve --ray`` passes its front replica's
:class:`~veil.engine.ray_plane.RayPlane` instead.

Example:
    >>> from veil.engine.server import ServerConfig, create_app
    >>> app = create_app(ServerConfig(repo="models/"))   # loads every model, warms them up
    >>> serve(ServerConfig(repo="models/", port=8000))   # blocks; Ctrl-C finishes in-flight requests first

Graceful shutdown: on SIGINT/SIGTERM uvicorn stops accepting connections and waits (up to
``graceful_timeout_s``) for in-flight requests; the lifespan's shutdown then drains every model's batcher.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import uvicorn
from fastapi import FastAPI

from veil import __version__

from . import http, recommend
from .dataplane import DataPlane
from .errors import add_exception_handlers
from .metrics import Metrics
from .plane import Plane
from .server_config import ServerConfig


def open_keystore(config: ServerConfig):  # -> veil.he.keystore.KeyStore
    """The server's HE key store (``he_key_dir``, default ``<repo>/.he-keys``) with the configured bounds."""
    from veil.he.keystore import KeyStore

    root = Path(config.he_key_dir) if config.he_key_dir else Path(config.repo) / ".he-keys"
    return KeyStore(root, quota_bytes=int(config.he_key_quota_mb * 2**20), ttl_seconds=config.he_key_ttl_s,
                    memory_items=config.he_key_cache, keys_per_source=config.he_keys_per_source)


def create_app(config: ServerConfig, models: list[str] | None = None, plane: Plane | None = None) -> FastAPI:
    """The app serving ``plane``; without one, load every model of ``config.repo`` (or only ``models``; warm-up
    included) into a :class:`~veil.engine.dataplane.DataPlane`.

    Raises:
        FileNotFoundError: the repository folder does not exist.
        ModelLoadFailed: a model cannot be loaded (the message names it and the problem).
    """
    logging.getLogger("veil.engine").setLevel(config.log_level.upper())
    if plane is None:
        plane = DataPlane(Path(config.repo), config.runtime_options(), Metrics(),
                          keystore=lambda: open_keystore(config))
        plane.load_all(models)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        grpc_server = None
        if config.grpc_port is not None:  # on this loop: both fronts share the data plane and its batchers
            from .grpc_server import InferenceService, start_grpc

            grpc_server, app.state.grpc_port = await start_grpc(
                InferenceService(plane, config.admin_token, config.max_bytes_elements), config.host, config.grpc_port,
                int(config.grpc_max_message_mb * 2**20))
        if getattr(app.state, "announce", False):  # `veil serve`: one line once ready, as uvicorn and Triton do
            print(ready_line(config, sorted(plane.models), getattr(app.state, "grpc_port", None)), file=sys.stderr,
                  flush=True)
        yield
        if grpc_server is not None:
            await grpc_server.stop(config.graceful_timeout_s)  # in-flight RPCs finish first
        await plane.drain()  # uvicorn already waited for in-flight requests; nothing is left queued
        await plane.close()

    app = FastAPI(title="veil", version=__version__, lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url=None)
    app.state.dataplane = plane
    app.state.admin_token = config.admin_token
    app.state.max_body_bytes = int(config.max_body_mb * 2**20)
    app.state.max_json_elements, app.state.body_timeout_s = config.max_json_elements, config.body_timeout_s
    app.state.max_json_bytes = int(config.max_json_mb * 2**20)
    app.state.max_bytes_elements = config.max_bytes_elements
    add_routes(app)
    add_exception_handlers(app)
    return app


GET = ["GET", "HEAD"]


def add_routes(app: FastAPI) -> None:
    """Every OIP v2 / Triton route; each model route also exists under ``/versions/{version}``; HEAD is answered
    wherever GET is (load balancers and uptime probes use it)."""
    app.add_api_route("/v2", http.server_metadata, methods=GET)
    app.add_api_route("/v2/health/live", http.live, methods=GET)
    app.add_api_route("/v2/health/ready", http.ready, methods=GET)
    app.add_api_route("/v2/models/stats", http.model_stats, methods=GET)
    for base in ("/v2/models/{model}", "/v2/models/{model}/versions/{version}"):
        app.add_api_route(base, http.model_metadata, methods=GET)
        app.add_api_route(base + "/ready", http.model_ready, methods=GET)
        app.add_api_route(base + "/infer", http.infer, methods=["POST"])
        app.add_api_route(base + "/config", http.model_config, methods=GET)
        app.add_api_route(base + "/stats", http.model_stats, methods=GET)
    app.add_api_route("/v2/recommend", recommend.recommend, methods=["POST"])
    app.add_api_route("/v2/he/keys", http.register_he_keys, methods=["POST"])
    app.add_api_route("/v2/he/keys/{key_id}", http.delete_he_keys, methods=["DELETE"])
    app.add_api_route("/v2/repository/index", http.repository_index, methods=["POST"])
    app.add_api_route("/v2/repository/models/{model}/load", http.repository_load, methods=["POST"])
    app.add_api_route("/v2/repository/models/{model}/unload", http.repository_unload, methods=["POST"])
    app.add_api_route("/metrics", http.metrics, methods=GET)


def build_server(config: ServerConfig) -> uvicorn.Server:
    """A uvicorn server for the app (not started); ``server.run()`` blocks, ``should_exit`` stops it gracefully."""
    trusted = [a.strip() for a in config.trusted_proxy.split(",") if a.strip()]
    # X-Forwarded-For is believed only from the proxies the operator names (uvicorn's default believes it from
    # 127.0.0.1, the default bind: any local client could forge its source and evict another's HE keys)
    return uvicorn.Server(uvicorn.Config(create_app(config), host=config.host, port=config.port,
                                         log_level=config.log_level, proxy_headers=bool(trusted),
                                         forwarded_allow_ips=trusted or None,
                                         timeout_graceful_shutdown=int(config.graceful_timeout_s)))


def bind(host: str, port: int) -> socket.socket:
    """A listening-ready socket bound to ``host:port`` (as uvicorn binds it).

    Raises:
        ServeError: the address is taken or cannot be bound, in one line naming it.
    """
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        sock = socket.socket(family, socket.SOCK_STREAM)
    except OSError as exc:
        raise ServeError(f"veil serve: cannot bind {host}:{port}: {exc.strerror or exc}") from None
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ServeError(f"veil serve: cannot bind {host}:{port}: {exc.strerror or exc}") from None
    sock.set_inheritable(True)
    return sock


def ready_line(config: ServerConfig, models: list[str], grpc_port: int | None) -> str:
    """The startup line: the HTTP, gRPC and metrics addresses and the models loaded (issue 33.4)."""
    host = f"[{config.host}]" if ":" in config.host else config.host
    http_url = f"http://{host}:{config.port}"
    grpc = f"gRPC {host}:{grpc_port}" if grpc_port else "gRPC off (--grpc-port P)"
    return (f"veil serve: ready: HTTP {http_url}/v2, {grpc}, metrics {http_url}/metrics; "
            f"{len(models)} model(s): {', '.join(models) or 'none'}")


class ServeError(RuntimeError):
    """The server cannot start (its address is taken); the message is one line for the terminal."""


def serve(config: ServerConfig) -> None:
    """Bind first (a busy port fails at once, before any model loads), then load, then serve until
    SIGINT/SIGTERM; in-flight requests finish first.

    Raises:
        ServeError: the port is busy or the host cannot be bound.
    """
    sock = bind(config.host, config.port)
    try:
        if config.grpc_port:  # probe it too, so a busy gRPC port also fails before any model loads
            bind(config.host, config.grpc_port).close()
        server = build_server(config)
        server.config.app.state.announce = True
        server.run(sockets=[sock])
    finally:
        sock.close()
