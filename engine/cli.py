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

from .server import ServeError, ServerConfig, serve

EXAMPLE = """example:
  veil serve --repo models/ --port 8000 --grpc-port 8001
  curl -s localhost:8000/v2/models/digits
  VEIL_ADMIN_TOKEN=s3cret veil serve --repo models/
"""


def build_parser(prog: str = "veil serve") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0], epilog=EXAMPLE,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    ServerConfig.add_arguments(parser)
    return parser


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
        serve(config)
    except ServeError as exc:  # the port is busy: one line, before any model loaded
        print(exc, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
