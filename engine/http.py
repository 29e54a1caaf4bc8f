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

The app state holds ``dataplane`` (:class:`~veil.engine.dataplane.DataPlane`), ``metrics``,
``admin_token`` (None: repository API off) and ``max_body_bytes``.
"""

from __future__ import annotations

import asyncio
import functools
import hmac
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, BinaryIO

import orjson
from fastapi import Request
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.responses import Response

from veil import __version__

from .adapters import adapter_metadata
from .dataplane import DataPlane
from .errors import (
    MalformedRequest,
    ModelNotFound,
    PayloadTooLarge,
    RepositoryApiDisabled,
    RequestTimeout,
    Unauthorized,
)
from .protocol import (
    INLINE_BYTES,
    MAX_BYTES_ELEMENTS,
    Expected,
    InferRequest,
    decode_request,
    decompress,
    encode_response,
    header_length,
    off_loop,
    output_size,
)

EXTENSIONS = ["binary_tensor_data", "model_configuration", "statistics", "veil_he_keys"]


def _json(content: Any, status_code: int = 200) -> Response:
    return Response(orjson.dumps(content), status_code=status_code, media_type="application/json")


def _plane(request: Request) -> DataPlane:
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
    admin = request.app.state.admin_token is not None
    return _json({"name": "veil", "version": __version__, "extensions": EXTENSIONS + ["model_repository"] * admin})


async def live(request: Request) -> Response:
    return _json({"live": True})


async def ready(request: Request) -> Response:
    plane = _plane(request)
    ok = plane.ready()
    return _json({"ready": ok, "execution_providers": plane.providers()}, 200 if ok else 503)


async def model_metadata(request: Request, model: str, version: str | None = None) -> Response:
    plane = _plane(request)
    m = plane.get_model(model, version)
    return _json(adapter_metadata(m.metadata(plane.versions(model)), getattr(m, "adapters", None), model))


async def model_ready(request: Request, model: str, version: str | None = None) -> Response:
    m = _plane(request).get_model(model, version)
    body = {"name": m.name, "version": m.version, "ready": m.ready,
            "execution_provider": m.session.provider if m.session else None}
    return _json(body, 200 if m.ready else 503)


async def model_config(request: Request, model: str, version: str | None = None) -> Response:
    m = _plane(request).get_model(model, version)
    config = m.config.to_triton_json()
    if m.manifest is not None:
        config["veil"] = m.manifest
    return _json(config)


async def model_stats(request: Request, model: str | None = None, version: str | None = None) -> Response:
    plane = _plane(request)
    if model is None and "stats" in plane.models:  # GET /v2/models/stats is also a model named "stats"'s
        return await model_metadata(request, "stats")  # metadata: the model wins, as for any other name
    if model is None:
        models = [m for versions in plane.models.values() for m in versions.values()]
    elif version is None:
        plane.get_model(model)  # 404 when unknown
        models = list(plane.models[model.partition(":")[0]].values())
    else:
        models = [plane.get_model(model, version)]
    return _json({"model_stats": [_stats(m) for m in models if m.metrics is not None]})


def _stats(m: Any) -> dict[str, Any]:
    """Triton's statistics entry, plus ``adapter_cache`` (LRU hits, misses, evictions) for adapter models."""
    entry = m.metrics.to_triton()
    if getattr(m, "adapters", None) is not None:
        entry["adapter_cache"] = m.adapters.stats()
    return entry


async def metrics(request: Request) -> Response:
    return Response(request.app.state.metrics.render(), media_type=CONTENT_TYPE_LATEST)


# -- inference ------------------------------------------------------------------------------------------
async def infer(request: Request, model: str, version: str | None = None) -> Response:
    plane = _plane(request)
    target = plane.get_model(model, version)  # 404 before the body is read or decoded
    body = await read_body(request)
    state, encoding = request.app.state, request.headers.get("content-encoding")
    expected = Expected(target.name, {n: t.datatype for n, t in target.inputs.items()},
                        getattr(state, "max_bytes_elements", MAX_BYTES_ELEMENTS))
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
    token = request.app.state.admin_token
    if token is None:
        raise RepositoryApiDisabled("the repository API is off: start the server with --admin-token or VEIL_ADMIN_TOKEN")
    given = bearer_token(request) or ""
    if not hmac.compare_digest(given.encode(), token.encode()):
        raise Unauthorized("repository API: expected the header 'Authorization: Bearer <admin token>'")


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
    return _json(_plane(request).repository_index(ready_only=bool(body.get("ready", False))))


async def repository_load(request: Request, model: str) -> Response:
    _check_admin(request)
    body = await _json_body(request)
    params = body.get("parameters", {})
    if not isinstance(params, dict):
        raise MalformedRequest(f"parameters: expected a JSON object, received {type(params).__name__}")
    DataPlane.check_load_parameters(params)
    await _plane(request).load(model)
    return _json({})


async def repository_unload(request: Request, model: str) -> Response:
    _check_admin(request)
    await _json_body(request)
    await _plane(request).unload(model)
    return _json({})


# -- encrypted inference --------------------------------------------------------------------------------
def key_upload_bounds(plane: DataPlane) -> tuple[int, str]:
    """The largest key bundle ``POST /v2/he/keys`` accepts and the setting that bounds it: what the largest served
    plan's key manifest needs (:func:`~veil.engine.he_model.key_upload_limit`) or private matching's keys
    (:func:`~veil.engine.recommend.key_bundle_limit`, when a loaded model has a PAVE spec), or the store's quota if
    smaller.

    Raises:
        ModelNotFound: no encrypted-inference model and no PAVE spec is loaded, so no key is accepted.
    """
    from .he_model import key_upload_limit
    from .recommend import key_bundle_limit

    he_limit, pave_limit = key_upload_limit(plane), key_bundle_limit(plane)
    if he_limit is None and pave_limit is None:
        raise ModelNotFound("POST /v2/he/keys: no encrypted-inference (veil_he) model and no model with a PAVE spec "
                            "(private /v2/recommend) is loaded, so no key is accepted")
    store, limit = plane.keystore(), max(x for x in (he_limit, pave_limit) if x is not None)
    if store.quota_bytes < limit:
        return store.quota_bytes, "--he-key-quota-mb"
    return limit, ("the largest served HE plan's key bundle" if limit == he_limit else
                   "private /v2/recommend's key bundle")


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


# key registrations parse in their own threads: HE evaluations (asyncio.to_thread, the default pool of
# min(32, cores + 4) threads) could otherwise take every thread and hold a registration for their whole run
_KEY_POOL = ThreadPoolExecutor(max_workers=2, thread_name_prefix="veil-keys")


async def register_key_bytes(store: Any, body: bytes, source: str, key_secret: str | None) -> dict[str, Any]:
    """Register a key bundle (off the event loop: parsing ~100 MiB of keys takes seconds) -> the response body.

    It runs in a pool of its own (``_KEY_POOL``), never behind HE evaluations in the default one."""
    register = functools.partial(store.register, body, source=source, key_secret=key_secret)
    reg = await asyncio.get_running_loop().run_in_executor(_KEY_POOL, register)
    return {"key_id": reg.key_id, "key_secret": reg.key_secret, "bytes": reg.size, "ttl_seconds": store.ttl_seconds}


async def register_he_keys(request: Request) -> Response:
    """``POST /v2/he/keys``: a veil evaluation-key bundle (relinearization + Galois keys, no secret key)
    -> ``{"key_id", "key_secret"}`` to pass as ``parameters.key_id`` / ``parameters.key_secret`` on encrypted
    inference requests. Renewing a registered key set takes ``Authorization: Bearer <key_secret>``.

    The body is capped (:func:`key_upload_bounds`) and spooled to an unnamed file while it arrives."""
    import tempfile

    plane = _plane(request)
    limit, flag = key_upload_bounds(plane)
    store = plane.keystore()
    with tempfile.TemporaryFile(dir=store.root) as spool:  # unnamed where the OS allows; never in memory whole
        await spool_key_upload(request, limit, flag, spool)
        spool.seek(0)
        body = spool.read()
    source = request.client.host if request.client is not None else "unknown"
    return _json(await register_key_bytes(store, body, source, bearer_token(request)))


async def delete_he_keys(request: Request, key_id: str) -> Response:
    """``DELETE /v2/he/keys/{key_id}`` with ``Authorization: Bearer <key_secret or admin token>``."""
    token, admin = bearer_token(request), request.app.state.admin_token
    is_admin = token is not None and admin is not None and hmac.compare_digest(token.encode(), admin.encode())
    _plane(request).keystore().delete(key_id, token, admin=is_admin)
    return _json({})
