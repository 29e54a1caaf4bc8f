"""`veil serve`: serve every model of a Triton-layout repository over the Open Inference Protocol v2 (REST, gRPC).

Examples:
    veil serve --repo models/
    veil serve --repo models/ --host 127.0.0.1 --port 8000 --max-body-mb 16 --log-level warning
    veil serve --repo models/ --port 8000 --grpc-port 8001    # also inference.GRPCInferenceService
    VEIL_ADMIN_TOKEN=s3cret veil serve --repo models/      # enables /v2/repository/* behind the token

Clients: `tritonclient.http` and `.grpc`, KServe clients and curl work unchanged (JSON and the binary tensor extension);
see docs/serving.md. Logs go to stderr; request payloads are never logged.
"""

from __future__ import annotations

import argparse
import os
import sys

from veil.config import ConfigError

from .server_config import ServerConfig

EXAMPLE = """example:
  veil serve --repo models/ --port 8000 --grpc-port 8001
  curl -s localhost:8000/v2/models/digits
  VEIL_ADMIN_TOKEN=s3cret veil serve --repo models/
  veil serve --repo models/ --ray --replicas 2 --grpc-port 8001   # Ray Serve: 2 replicas per model, REST + gRPC
"""


def build_parser(prog: str = "veil serve") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0], epilog=EXAMPLE,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    ServerConfig.add_arguments(parser)
    ray = parser.add_argument_group("Ray Serve (veil.engine.ray_serve; needs `pip install 'veil[ray]'`)")
    ray.add_argument("--ray", action="store_true", help="serve the repository as Ray Serve applications "
                     "(--host/--port are Ray's HTTP proxy)")
    ray.add_argument("--ray-address", help="Ray cluster to join ('auto', 'ray://HOST:10001'); default: start a local one")
    ray.add_argument("--replicas", type=int, help="replicas per model (default: config.pbtxt instance_group count)")
    ray.add_argument("--min-replicas", type=int, help="autoscaling lower bound per model (with --max-replicas)")
    ray.add_argument("--max-replicas", type=int, help="autoscale each model up to this many replicas")
    ray.add_argument("--target-ongoing-requests", type=float, help="autoscaling target per replica (default: 4)")
    ray.add_argument("--replica-cpus", type=float, help="CPUs (and ONNX Runtime threads) per replica (default: 1)")
    ray.add_argument("--max-ongoing-requests", type=int, help="requests one replica takes at once (default: 32)")
    ray.add_argument("--he-workers", type=int, help="Ray actors each HE model replica splits a multi-ciphertext "
                     "request over (default: 0, none)")
    ray.add_argument("--he-worker-cpus", type=float, help="CPUs each HE evaluation worker reserves (default: 1)")
    ray.add_argument("--ray-deploy-timeout", type=float, dest="deploy_timeout_s", metavar="SECONDS",
                     help="seconds to wait for every model's replicas to run; then stop and exit 2 with Ray's reason "
                          "(default: 300)")
    return parser


def ray_config_from_args(argv: list[str] | None):  # -> veil.engine.ray_serve.RayConfig | None
    """The Ray Serve settings when ``--ray`` is given (None otherwise; ray is imported only then)."""
    args = build_parser().parse_args(argv)
    if not args.ray:
        return None
    try:
        from .ray_serve import RayConfig
    except ImportError as exc:
        raise ConfigError(f"--ray: expected the ray[serve] package (pip install 'veil[ray]'), received an import "
                          f"error: {exc}") from None
    return RayConfig.from_args(args)


def config_from_args(argv: list[str] | None) -> ServerConfig:
    """Flags, with the admin token from VEIL_ADMIN_TOKEN when --admin-token is not given."""
    args = build_parser().parse_args(argv)
    if args.admin_token is None and os.environ.get("VEIL_ADMIN_TOKEN"):
        args.admin_token = os.environ["VEIL_ADMIN_TOKEN"]
    return ServerConfig.from_args(args)


def main(argv: list[str] | None = None) -> int:
    """Serve until interrupted; ``--help`` and usage errors return argparse's status instead of exiting."""
    try:
        config = config_from_args(argv)
    except SystemExit as exc:  # --help (0) or a usage error (2): `veil serve` returns, the caller exits
        return exc.code if isinstance(exc.code, int) else 2
    try:
        ray = ray_config_from_args(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 2
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    from .server import ServeError, serve  # fastapi and onnxruntime: imported once the server starts

    if ray is not None:
        from .errors import DeployError
        from .ray_serve import serve_ray

        try:
            serve_ray(config, ray)
        except (ConfigError, DeployError) as exc:  # more CPUs than the cluster has (at once), or Ray's reason the
            print(exc, file=sys.stderr)             # replicas did not run within --ray-deploy-timeout: one line
            return 2
        return 0  # SIGINT / SIGTERM: stopped cleanly
    try:
        serve(config)
    except ServeError as exc:  # the port is busy: one line, before any model loaded
        print(exc, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
