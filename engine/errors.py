"""Every way a request can fail, one exception class each, and the one function that maps them to HTTP.

Each class states its HTTP status in its docstring and carries it as ``status_code``. Handlers answer with
the Open Inference Protocol error body ``{"error": "<message>"}``. Messages name the field, the expected
and the received value, and never contain tensor payloads. :func:`add_exception_handlers` registers all
handlers in one place, the catch-all (:class:`CatchAll`, which logs once) last.
"""

from __future__ import annotations

import logging

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

logger = logging.getLogger("veil.engine")
REPLICA_HEADER = "veil-replica"  # which Ray Serve replica answered (response header)


class EngineError(Exception):
    """Base of every engine error (HTTP 500 unless a subclass says otherwise)."""

    status_code = 500


class MalformedRequest(EngineError):
    """The body is not valid JSON or not a valid OIP inference request (HTTP 400)."""

    status_code = 400


class InvalidHeaderLength(EngineError):
    """``Inference-Header-Content-Length`` is missing while binary data is present, or invalid (HTTP 400)."""

    status_code = 400


class BinarySizeMismatch(EngineError):
    """The binary tensor sizes do not add up to the body, or do not match a tensor's shape (HTTP 400)."""

    status_code = 400


class UnknownInput(EngineError):
    """The request names an input the model does not have (HTTP 400)."""

    status_code = 400


class MissingInput(EngineError):
    """The request lacks an input the model needs (HTTP 400)."""

    status_code = 400


class UnknownOutput(EngineError):
    """The request asks for an output the model does not have (HTTP 400)."""

    status_code = 400


class ShapeMismatch(EngineError):
    """A tensor's shape disagrees with the model or with its own element count (HTTP 400)."""

    status_code = 400


class DatatypeMismatch(EngineError):
    """A tensor's datatype differs from the model's, or cannot travel in the chosen encoding (HTTP 400)."""

    status_code = 400


class InferenceFailed(EngineError):
    """ONNX Runtime refused the inputs (e.g. a dimension the graph cannot reshape) (HTTP 400)."""

    status_code = 400


class ModelLoadFailed(EngineError, ValueError):
    """A model in the repository could not be loaded (bad config.pbtxt, missing or broken model.onnx) (HTTP 400)."""

    status_code = 400


class InvalidModelName(MalformedRequest):
    """A model name that is not one path component (``..``, ``/``, ``%``, NUL...) (HTTP 400)."""

    status_code = 400


class UnsupportedEncoding(EngineError):
    """A ``Content-Encoding`` other than gzip, deflate or identity (HTTP 415)."""

    status_code = 415


class RequestTimeout(EngineError):
    """The request body did not arrive within ``--body-timeout-s`` (HTTP 408)."""

    status_code = 408


class InternalError(EngineError):
    """A server fault (a bug, memory exhaustion) already logged where it happened (HTTP 500)."""

    status_code = 500


class Unauthorized(EngineError):
    """The repository API was called without the right ``Authorization: Bearer <token>`` (HTTP 401)."""

    status_code = 401


class RepositoryApiDisabled(EngineError):
    """The repository API is off because the server has no admin token (HTTP 403)."""

    status_code = 403


class ModelNotFound(EngineError):
    """No such model, or no such version of it, is loaded (HTTP 404)."""

    status_code = 404


class PayloadTooLarge(EngineError):
    """The request body (or its decompressed form, or a JSON tensor's element count) exceeds the server's limits
    (``--max-body-mb``, ``--max-json-elements``) (HTTP 413)."""

    status_code = 413


class QueueFull(EngineError):
    """The model's dynamic-batching queue is at ``max_queue_size``; retry later (HTTP 503)."""

    status_code = 503


class ModelNotReady(EngineError):
    """The model is loaded but not ready (loading, warming up or shutting down) (HTTP 503)."""

    status_code = 503


class AdapterNotFound(ModelNotFound):
    """The request names an adapter the model does not have (HTTP 404)."""


class DeployError(EngineError):
    """`veil serve --ray`: the applications did not all run (Ray said DEPLOY_FAILED, or the deploy timed out)."""

    status_code = 503


class ReplicaError(EngineError):
    """An error a model replica answered (``veil serve --ray``), passed on by the front with the replica's status
    and message, so a client sees what ``veil serve`` alone would have said; over HTTP the response names the
    replica in its ``veil-replica`` header (:data:`REPLICA_HEADER`)."""

    def __init__(self, status_code: int, message: str, replica: str = "") -> None:
        super().__init__(message)
        self.status_code, self.replica = status_code, replica


class InvalidCodecInput(InferenceFailed):
    """An image or bitstream the codec refuses: unsupported format, corrupt/foreign/truncated stream, or a bad
    coding parameter (HTTP 400)."""

    status_code = 400


class InvalidSamplerRequest(InferenceFailed):
    """A prior spec, sampling setting or observation the sampler refuses (HTTP 400)."""

    status_code = 400


def http_status(exc: BaseException) -> int:
    """The HTTP status of an error, the one mapping of the engine's failures to a protocol status.

    :class:`EngineError` subclasses and veil.he's refusals (``HEError``) carry theirs as ``status_code``; anything
    else is a server fault (500). The HTTP handlers answer with it and the gRPC server
    derives its codes from it, so a new error class needs one status, in its docstring and its attribute.
    """
    if isinstance(exc, EngineError):
        return exc.status_code
    from veil.he.errors import HEError  # lazily: veil.he loads TenSEAL

    return exc.status_code if isinstance(exc, HEError) else 500


def error_response(status_code: int, message: str) -> Response:
    """The OIP error body ``{"error": message}``."""
    return Response(orjson.dumps({"error": message}), status_code=status_code, media_type="application/json")


# HTTP status -> gRPC status code name: the gRPC front (veil.engine.grpc_server) answers every error with the
# code of the status HTTP gives it, and the same message
GRPC_CODES = {400: "INVALID_ARGUMENT", 401: "PERMISSION_DENIED", 403: "PERMISSION_DENIED", 404: "NOT_FOUND",
              408: "DEADLINE_EXCEEDED", 413: "RESOURCE_EXHAUSTED", 415: "INVALID_ARGUMENT", 503: "UNAVAILABLE"}


def grpc_code(exc: BaseException) -> tuple[str, str]:
    """The gRPC status code name (a ``grpc.StatusCode`` member) and message for ``exc``.

    Engine errors, veil.he and veil.pave refusals map by their ``status_code``; anything else is a server
    fault: ``INTERNAL`` with ``internal error: <type>`` (the caller logs it once)."""
    if isinstance(exc, EngineError):
        status = exc.status_code
    elif isinstance(getattr(exc, "status_code", None), int):
        status = exc.status_code  # type: ignore[attr-defined]
    else:
        return "INTERNAL", f"internal error: {type(exc).__name__}"
    return GRPC_CODES.get(status, "INTERNAL" if status >= 500 else "INVALID_ARGUMENT"), str(exc)


async def _engine_error(_: Request, exc: EngineError) -> Response:
    response = error_response(http_status(exc), str(exc))
    if response.status_code in (408, 413):  # the rest of the body was never read: the connection cannot be reused
        response.headers["connection"] = "close"
    if isinstance(exc, ReplicaError) and exc.replica:
        response.headers[REPLICA_HEADER] = exc.replica
    return response


async def _http_error(_: Request, exc: StarletteHTTPException) -> Response:
    return error_response(exc.status_code, str(exc.detail))


async def _validation_error(_: Request, exc: RequestValidationError) -> Response:
    where = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
    return error_response(400, f"invalid request: {where}")


class CatchAll:
    """ASGI middleware: an exception no handler took becomes a 500 ``{"error": "internal error: <type>"}``,
    logged once with its traceback (never the body; payloads are never logged).

    Starlette's own catch-all (an ``Exception`` handler) re-raises after answering so that the server logs the
    exception too: every bug cost two tracebacks, and an anonymous client could double the log flood.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except Exception as exc:
            logger.error("internal error on %s %s", scope.get("method"), scope.get("path"), exc_info=exc)
            if not started:  # otherwise the response is cut short; the client sees the connection close
                await error_response(500, f"internal error: {type(exc).__name__}")(scope, receive, send)


async def _he_error(_: Request, exc: Exception) -> Response:
    """veil.he refusals (bad envelope, unknown or expired key, secret key uploaded...) carry their status."""
    return error_response(http_status(exc), str(exc))


def add_exception_handlers(app: FastAPI) -> None:
    """Register every handler; the ``Exception`` catch-all comes last."""
    from veil.he.errors import HEError

    app.add_exception_handler(EngineError, _engine_error)
    app.add_exception_handler(HEError, _he_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_middleware(CatchAll)  # the catch-all, outside every handler above
