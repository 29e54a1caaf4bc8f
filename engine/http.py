"""Route functions of the OIP v2 REST API: each maps an HTTP request to the data plane and back, nothing else.

Endpoints (KServe Open Inference Protocol v2 REST, plus Triton's extensions):

    GET  /v2                                   server metadata
    GET  /v2/health/live | /v2/health/ready    liveness, readiness
    GET  /v2/models/{m}[/versions/{v}]         model metadata
    GET  /v2/models/{m}[/versions/{v}]/ready   model readiness
    POST /v2/models/{m}[/versions/{v}]/infer   inference (JSON, or JSON + binary tensors)
    GET  /v2/models/{m}[/versions/{v}]/config  Triton model_configuration extension
    GET  /v2/models[/{m}[/versions/{v}]]/stats Triton statistics extension
    POST /v2/repository/index                  Triton model_repository extension (admin token)
    POST /v2/repository/models/{m}/load|unload
    GET  /metrics                              Prometheus

The app state holds ``dataplane`` (a :class:`~veil.engine.plane.Plane`: the models in this process, or on Ray
Serve replicas), ``admin_token`` (None: repository API off) and the request bounds (``max_body_bytes``...).
"""

from __future__ import annotations

import asyncio
import functools
import tempfile
from collections.abc import AsyncIterator
from typing import Any, BinaryIO

import orjson
from fastapi import Request
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.responses import Response

from .errors import MalformedRequest, PayloadTooLarge, RequestTimeout
from .plane import Plane, check_admin, is_admin
from .protocol import INLINE_BYTES, MAX_BYTES_ELEMENTS, Expected, InferRequest, off_loop, output_size
from .rest_body import decode_request, decompress, encode_response, header_length


def _json(content: Any, status_code: int = 200) -> Response:
    return Response(orjson.dumps(content), status_code=status_code, media_type="application/json")


def _plane(request: Request) -> Plane:
    return request.app.state.dataplane


async def read_body(request: Request, limit: int | None = None, flag: str = "--max-body-mb") -> bytes:
    """The body, refused with 413 as soon as it passes ``limit`` (default ``max_body_bytes``; declared or streamed).

    ``flag`` names the limit in the 413 message (what the operator would change)."""
    limit = request.app.state.max_body_bytes if limit is None else limit
    declared = request.headers.get("content-length", "")
    if declared.isascii() and declared.isdigit() and int(declared) > limit:  # "²".isdigit() is True
        raise PayloadTooLarge(f"request body: expected at most {limit} bytes ({flag}), received {declared}")
    chunks, size = [], 0
    async for chunk in _timed_stream(request):
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"request body: expected at most {limit} bytes ({flag}), received more")
        chunks.append(chunk)
    return b"".join(chunks)


async def _timed_stream(request: Request) -> AsyncIterator[bytes]:
    """The body's chunks; 408 once reading it takes longer than ``body_timeout_s`` (a slow client holds a
    connection and its buffers only that long)."""
    timeout = getattr(request.app.state, "body_timeout_s", None)
    loop = asyncio.get_running_loop()
    deadline = None if timeout is None else loop.time() + timeout
    chunks = request.stream().__aiter__()
    while True:
        try:
            chunk = await asyncio.wait_for(chunks.__anext__(), None if deadline is None else deadline - loop.time())
        except StopAsyncIteration:
            return
        except asyncio.TimeoutError:
            raise RequestTimeout(f"request body: expected it within {timeout} s (--body-timeout-s), "
                                 "received it more slowly") from None
        yield chunk


def bearer_token(request: Request) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header (the scheme is case-insensitive, RFC 6750 §2.1)."""
    scheme, _, token = request.headers.get("authorization", "").strip().partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


# -- health and metadata ------------------------------------------------------------------------------
async def server_metadata(request: Request) -> Response:
    return _json(_plane(request).server_metadata(admin=request.app.state.admin_token is not None))


async def live(request: Request) -> Response:
    return _json({"live": True})


async def ready(request: Request) -> Response:
    ok, body = await _plane(request).server_ready()
    return _json(body, 200 if ok else 503)


async def model_metadata(request: Request, model: str, version: str | None = None) -> Response:
    return _json(await _plane(request).model_metadata(model, version))


async def model_ready(request: Request, model: str, version: str | None = None) -> Response:
    body = await _plane(request).model_ready(model, version)
    return _json(body, 200 if body["ready"] else 503)


async def model_config(request: Request, model: str, version: str | None = None) -> Response:
    return _json(await _plane(request).model_config(model, version))


async def model_stats(request: Request, model: str | None = None, version: str | None = None) -> Response:
    plane = _plane(request)
    if model is None and "stats" in plane.models:  # GET /v2/models/stats is also a model named "stats"'s
        return await model_metadata(request, "stats")  # metadata: the model wins, as for any other name
    return _json({"model_stats": await plane.statistics(model, version)})


async def metrics(request: Request) -> Response:
    return Response(_plane(request).prometheus(), media_type=CONTENT_TYPE_LATEST)


# -- inference ------------------------------------------------------------------------------------------
async def infer(request: Request, model: str, version: str | None = None) -> Response:
    plane = _plane(request)
    inputs = await plane.model_inputs(model, version)  # 404 before the body is read or decoded
    body = await read_body(request)
    state, encoding = request.app.state, request.headers.get("content-encoding")
    expected = Expected(model.partition(":")[0], inputs, getattr(state, "max_bytes_elements", MAX_BYTES_ELEMENTS))
    decode = functools.partial(_decode, body, encoding, request.headers.get("inference-header-content-length"),
                               state.max_body_bytes, getattr(state, "max_json_elements", None),
                               getattr(state, "max_json_bytes", None), expected)
    # a large (or compressed) body is decompressed and decoded (orjson, numpy) in the decode pool: health probes
    # and other clients keep being answered meanwhile; a small one costs less inline than a thread hop
    size = len(body) if encoding in (None, "identity") else INLINE_BYTES + 1
    decoded = await off_loop(size, decode)
    result = await plane.infer(model, version, decoded)
    content, binary_length = await off_loop(output_size(result), encode_response, result)
    if binary_length is None:
        return Response(content, media_type="application/json")
    return Response(content, media_type="application/octet-stream",
                    headers={"Inference-Header-Content-Length": str(binary_length)})


def _decode(body: bytes, encoding: str | None, header: str | None, limit: int, max_json_elements: int | None,
            max_json_bytes: int | None, expected: Expected | None = None) -> InferRequest:
    """Content-Encoding, then the OIP body (JSON, or JSON + binary) -> InferRequest."""
    body = decompress(body, encoding, limit)
    return decode_request(body, header_length(header, len(body)), max_json_elements, max_json_bytes, expected)


# -- model repository extension (admin) -----------------------------------------------------------------
def _check_admin(request: Request) -> None:
    check_admin(request.app.state.admin_token, bearer_token(request), "header 'Authorization")


async def _json_body(request: Request) -> dict[str, Any]:
    body = await read_body(request)
    if not body.strip():
        return {}
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise MalformedRequest(f"request body: expected a JSON object, received invalid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise MalformedRequest(f"request body: expected a JSON object, received {type(data).__name__}")
    return data


async def repository_index(request: Request) -> Response:
    _check_admin(request)
    body = await _json_body(request)
    return _json(await _plane(request).repository_index(ready_only=bool(body.get("ready", False))))


async def repository_load(request: Request, model: str) -> Response:
    _check_admin(request)
    body = await _json_body(request)
    params = body.get("parameters", {})
    if not isinstance(params, dict):
        raise MalformedRequest(f"parameters: expected a JSON object, received {type(params).__name__}")
    await _plane(request).load(model, params)
    return _json({})


async def repository_unload(request: Request, model: str) -> Response:
    _check_admin(request)
    await _json_body(request)
    await _plane(request).unload(model)
    return _json({})


# -- encrypted inference --------------------------------------------------------------------------------
async def spool_key_upload(request: Request, limit: int, flag: str, spool: BinaryIO) -> None:
    """Write the request body into ``spool`` as it arrives, never more than ``limit`` bytes (checked against the
    declared length before reading, then while reading).

    Raises:
        PayloadTooLarge: naming ``flag``, the setting that bounds it. RequestTimeout: the body arrives too slowly.
    """
    declared = request.headers.get("content-length", "")
    if declared.isascii() and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"key bundle: expected at most {limit} bytes ({flag}), received {declared}")
    size = 0
    async for chunk in _timed_stream(request):
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"key bundle: expected at most {limit} bytes ({flag}), received more")
        spool.write(chunk)


async def register_he_keys(request: Request) -> Response:
    """``POST /v2/he/keys``: a veil evaluation-key bundle (relinearization + Galois keys, no secret key)
    -> ``{"key_id", "key_secret"}`` to pass as ``parameters.key_id`` / ``parameters.key_secret`` on encrypted
    inference requests. Renewing a registered key set takes ``Authorization: Bearer <key_secret>``.

    The body is capped (:meth:`~veil.engine.plane.Plane.key_upload_bounds`) and spooled, while it arrives, into a
    temporary file in the key store's folder, which the plane registers from (on Ray: a replica, from the shared
    folder; the upload never passes through Ray's object store); the file is gone once this returns."""
    plane = _plane(request)
    limit, flag, folder = await plane.key_upload_bounds()
    source = request.client.host if request.client is not None else "unknown"
    with tempfile.NamedTemporaryFile(dir=folder, prefix=".upload-", suffix=".part") as spool:
        await spool_key_upload(request, limit, flag, spool)
        spool.flush()
        return _json(await plane.register_keys(spool.name, source, bearer_token(request)))


async def delete_he_keys(request: Request, key_id: str) -> Response:
    """``DELETE /v2/he/keys/{key_id}`` with ``Authorization: Bearer <key_secret or admin token>``."""
    token = bearer_token(request)
    await _plane(request).delete_keys(key_id, token, admin=is_admin(request.app.state.admin_token, token))
    return _json({})
