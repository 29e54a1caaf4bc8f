"""The OIP v2 gRPC front: ``inference.GRPCInferenceService`` over the same data plane as HTTP.

``veil serve --grpc-port P`` starts a ``grpc.aio`` server on the HTTP server's event loop, so both fronts share
one :class:`~veil.engine.plane.Plane` (in this process: models, batchers, statistics, HE key store; with
``--ray``: the front replica's view of the model replicas). Each RPC maps its message to the data plane and back,
nothing else:

    ServerLive / ServerReady / ModelReady / ServerMetadata / ModelMetadata     health and metadata
    ModelInfer            tensors in ``raw_input_contents`` (or typed ``contents``); outputs always raw
    ModelConfig           config.pbtxt as Triton's ModelConfig (+ ``parameters["veil"]``, ``["metadata"]`` JSON)
    ModelStatistics       Triton's statistics extension
    RepositoryIndex / RepositoryModelLoad / RepositoryModelUnload   behind ``authorization: Bearer <admin token>``

Errors are the engine's (:mod:`veil.engine.errors`) with the same messages as over HTTP, mapped to gRPC codes by
:func:`~veil.engine.errors.grpc_code`; a server fault is logged once and answered INTERNAL; the server keeps
serving. Message sizes are capped by ``--grpc-max-message-mb`` (RESOURCE_EXHAUSTED beyond it); a message that does
not parse is INVALID_ARGUMENT naming the message type.

Messages arrive as bytes: one larger than ``INLINE_BYTES`` is parsed and decoded in the decode pool
(:func:`~veil.engine.protocol.off_loop`), never on the event loop the HTTP front shares. A failed call keeps
nothing of its request: the answer is sent after the exception and the request are dropped (issue 31 item 1).

Example:
    >>> import tritonclient.grpc as grpcclient
    >>> c = grpcclient.InferenceServerClient("127.0.0.1:8001")
    >>> x = grpcclient.InferInput("x", [1, 4], "FP32"); x.set_data_from_numpy(np.ones((1, 4), np.float32))
    >>> c.infer("affine", [x]).as_numpy("y")
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import grpc
import numpy as np
import orjson
from google.protobuf import json_format
from google.protobuf.message import DecodeError
from grpc import aio

from . import proto
from .errors import DatatypeMismatch, EngineError, MalformedRequest, ShapeMismatch, grpc_code
from .plane import check_admin
from .protocol import (
    DATATYPES,
    Expected,
    InferRequest,
    InferResponse,
    InputTensor,
    check_shape,
    encode_bytes,
    from_binary,
    off_loop,
    output_size,
)

if TYPE_CHECKING:
    from .plane import Plane

logger = logging.getLogger("veil.engine")
msg = proto.msg
# datatype -> the InferTensorContents field that carries it when not raw (FP16/BF16 travel raw only)
CONTENTS = {"BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents",
            "INT64": "int64_contents", "UINT8": "uint_contents", "UINT16": "uint_contents",
            "UINT32": "uint_contents", "UINT64": "uint64_contents", "FP32": "fp32_contents",
            "FP64": "fp64_contents", "BYTES": "bytes_contents"}


# -- messages <-> data plane ----------------------------------------------------------------------------
def parameters(params: Any) -> dict[str, Any]:
    """A ``map<string, InferParameter>`` -> plain values (an unset parameter is refused)."""
    out = {}
    for key, value in params.items():
        which = value.WhichOneof("parameter_choice")
        if which is None:
            raise MalformedRequest(f"parameters['{key}']: expected a bool, int64, uint64, double or string value, "
                                   "received none")
        out[key] = getattr(value, which)
    return out


def decode_infer(request: Any, expected: Expected | None = None) -> InferRequest:
    """A ``ModelInferRequest`` -> the data plane's InferRequest (raw inputs read with ``np.frombuffer``, no copy).

    ``expected`` (the target model's inputs) is checked on each input's declaration before its data is read.

    Raises:
        MalformedRequest, DatatypeMismatch, ShapeMismatch, BinarySizeMismatch, UnknownInput, PayloadTooLarge:
        naming the input and the field.
    """
    if not request.inputs:
        raise MalformedRequest("ModelInferRequest.inputs: expected at least one input, received none")
    raw = request.raw_input_contents
    if raw and len(raw) != len(request.inputs):
        raise MalformedRequest(f"raw_input_contents: expected one entry per input ({len(request.inputs)}), "
                               f"received {len(raw)}")
    inputs, names = [], set()
    for i, tensor in enumerate(request.inputs):
        name, datatype, shape = tensor.name, tensor.datatype, list(tensor.shape)
        if name in names:
            raise MalformedRequest(f"inputs[{i}]: expected each input name once, received '{name}' again")
        names.add(name)
        if datatype not in DATATYPES:
            raise DatatypeMismatch(f"input '{name}': datatype expected one of {list(DATATYPES)}, received {datatype!r}")
        count = check_shape(name, shape)
        if expected is not None:
            expected.check(name, datatype, count)
        if raw:
            if tensor.HasField("contents"):
                raise MalformedRequest(f"input '{name}': expected raw_input_contents or contents, received both")
            data = from_binary(name, datatype, count, raw[i], 0, len(raw[i]))
        else:
            data = _from_contents(name, datatype, count, tensor)
        inputs.append(InputTensor(name, datatype, shape, data.reshape(shape)))
    outputs = {o.name: True for o in request.outputs} or None
    if outputs is not None and len(outputs) != len(request.outputs):
        raise MalformedRequest("outputs: expected each output name once, received a name twice")
    return InferRequest(inputs=inputs, outputs=outputs, id=request.id or None, binary_output=True,
                        parameters=parameters(request.parameters))


def _from_contents(name: str, datatype: str, count: int, tensor: Any) -> np.ndarray:
    """The typed ``contents`` of one input as an array of its datatype."""
    if datatype not in CONTENTS:
        raise DatatypeMismatch(f"input '{name}': {datatype} travels in raw_input_contents only, received it in contents")
    values = getattr(tensor.contents, CONTENTS[datatype])
    if len(values) != count:
        raise ShapeMismatch(f"input '{name}': shape {list(tensor.shape)} needs {count} elements, "
                            f"contents.{CONTENTS[datatype]} has {len(values)}")
    if datatype == "BYTES":
        out = np.empty(count, dtype=object)
        out[:] = list(values)
        return out
    return np.asarray(values, dtype=DATATYPES[datatype])


def encode_infer(result: InferResponse) -> Any:
    """The data plane's InferResponse -> a ``ModelInferResponse`` with every output in ``raw_output_contents``."""
    response = msg.ModelInferResponse(model_name=result.model_name, model_version=result.model_version,
                                      id=result.id or "")
    raw = []
    for name, array in result.outputs.items():
        datatype = result.datatypes[name]
        response.outputs.add(name=name, datatype=datatype, shape=array.shape)
        raw.append(encode_bytes(array) if datatype == "BYTES" else np.ascontiguousarray(array).tobytes())
    response.raw_output_contents.extend(raw)
    return response


# -- the service ----------------------------------------------------------------------------------------
class InferenceService:
    """One coroutine per RPC of ``inference.GRPCInferenceService``.

    Args:
        plane: the data plane the HTTP front also serves.
        admin_token: the repository API's bearer token (None: the repository RPCs answer PERMISSION_DENIED).
        max_bytes_elements: the most elements one BYTES input may declare (``--max-bytes-elements``).
    """

    def __init__(self, plane: Plane, admin_token: str | None, max_bytes_elements: int | None = None) -> None:
        self.plane, self.admin_token, self.max_bytes_elements = plane, admin_token, max_bytes_elements

    async def ServerLive(self, request: Any, context: aio.ServicerContext) -> Any:
        return msg.ServerLiveResponse(live=True)

    async def ServerReady(self, request: Any, context: aio.ServicerContext) -> Any:
        return msg.ServerReadyResponse(ready=(await self.plane.server_ready())[0])

    async def ModelReady(self, request: Any, context: aio.ServicerContext) -> Any:
        return msg.ModelReadyResponse(ready=(await self.plane.model_ready(request.name, request.version or None))["ready"])

    async def ServerMetadata(self, request: Any, context: aio.ServicerContext) -> Any:
        return msg.ServerMetadataResponse(**self.plane.server_metadata(admin=self.admin_token is not None))

    async def ModelMetadata(self, request: Any, context: aio.ServicerContext) -> Any:
        body = await self.plane.model_metadata(request.name, request.version or None)
        tensors = msg.ModelMetadataResponse.TensorMetadata
        return msg.ModelMetadataResponse(
            name=request.name, versions=body["versions"], platform=body["platform"],
            inputs=[tensors(name=t["name"], datatype=t["datatype"], shape=t["shape"]) for t in body["inputs"]],
            outputs=[tensors(name=t["name"], datatype=t["datatype"], shape=t["shape"]) for t in body["outputs"]])

    async def ModelInfer(self, request: Any, context: aio.ServicerContext) -> Any:
        name, version = request.model_name, request.model_version or None
        inputs = await self.plane.model_inputs(name, version)  # NOT_FOUND before any tensor is decoded
        expected = Expected(name.partition(":")[0], inputs, self.max_bytes_elements)
        decoded = await off_loop(request.ByteSize(), decode_infer, request, expected)
        result = await self.plane.infer(name, version, decoded)
        return await off_loop(output_size(result), encode_infer, result)

    async def ModelConfig(self, request: Any, context: aio.ServicerContext) -> Any:
        """config.pbtxt as Triton's ModelConfig; ``parameters["veil"]`` (veil.json) and ``["metadata"]`` (the
        model metadata's kind-specific parameters: HE parameters and key manifest, codec, sampler) as JSON text,
        which the OIP ModelMetadataResponse has no field for."""
        name, version = request.name, request.version or None
        config = await self.plane.model_config(name, version)
        meta = await self.plane.model_metadata(name, version)
        manifest = config.pop("veil", None)
        config["parameters"]["metadata"] = {"string_value": orjson.dumps(meta.get("parameters", {})).decode()}
        if manifest is not None:
            config["parameters"]["veil"] = {"string_value": orjson.dumps(manifest).decode()}
        out = json_format.ParseDict(config, msg.ModelConfig(), ignore_unknown_fields=True)
        return msg.ModelConfigResponse(config=out)

    async def ModelStatistics(self, request: Any, context: aio.ServicerContext) -> Any:
        rows = await self.plane.statistics(request.name or None, request.version or None)
        return msg.ModelStatisticsResponse(model_stats=[
            json_format.ParseDict(row, msg.ModelStatistics(), ignore_unknown_fields=True) for row in rows])

    async def RepositoryIndex(self, request: Any, context: aio.ServicerContext) -> Any:
        self._check_admin(context)
        rows = await self.plane.repository_index(ready_only=request.ready)
        index = msg.RepositoryIndexResponse.ModelIndex
        return msg.RepositoryIndexResponse(models=[index(name=r["name"], version=r.get("version", ""),
                                                         state=r["state"], reason=r.get("reason", "")) for r in rows])

    async def RepositoryModelLoad(self, request: Any, context: aio.ServicerContext) -> Any:
        self._check_admin(context)
        await self.plane.load(request.model_name, dict(request.parameters))
        return msg.RepositoryModelLoadResponse()

    async def RepositoryModelUnload(self, request: Any, context: aio.ServicerContext) -> Any:
        self._check_admin(context)
        await self.plane.unload(request.model_name)
        return msg.RepositoryModelUnloadResponse()

    def _check_admin(self, context: aio.ServicerContext) -> None:
        """The repository RPCs' refusals, the same as HTTP's, with the token from the ``authorization`` metadata."""
        header = dict(context.invocation_metadata() or ()).get("authorization", "")
        scheme, _, token = str(header).strip().partition(" ")
        check_admin(self.admin_token, token.strip() if scheme.lower() == "bearer" else None, "metadata 'authorization")


def parse(message_cls: Any, data: bytes) -> Any:
    """The serialized request -> its message, or MalformedRequest (INVALID_ARGUMENT) naming the message type."""
    try:
        return message_cls.FromString(data)
    except DecodeError as exc:
        raise MalformedRequest(f"request: expected a serialized inference.{message_cls.DESCRIPTOR.name}, received "
                               f"{len(data)} bytes that do not parse ({exc})") from None


async def _answer(method: str, message_cls: Any, call: Callable[[Any, aio.ServicerContext], Awaitable[Any]],
                  data: bytes, context: aio.ServicerContext) -> tuple[Any, tuple[str, str] | None]:
    """``(response, None)``, or ``(None, (code, message))`` for a failed call. The exception is dropped when this
    returns: its traceback holds the frames that hold the request, which must not outlive the call."""
    try:
        request = await off_loop(len(data), parse, message_cls, data)
        return await call(request, context), None
    except Exception as exc:
        code, message = grpc_code(exc)
        if code == "INTERNAL" and not isinstance(exc, EngineError):  # engine errors were logged where raised
            logger.error("internal error on gRPC %s", method, exc_info=exc)
        return None, (code, message)


def _guarded(method: str, message_cls: Any, call: Callable[[Any, aio.ServicerContext], Awaitable[Any]]) -> Callable:
    """The RPC over serialized requests with every error answered as a gRPC status: engine and HE errors with
    their code and message, anything else INTERNAL, logged once with its traceback."""

    async def handler(data: bytes, context: aio.ServicerContext) -> Any:
        response, error = await _answer(method, message_cls, call, data, context)
        if error is None:
            return response
        del data  # abort raises: its traceback holds this frame, so nothing of the request may stay in it
        await context.abort(getattr(grpc.StatusCode, error[0]), error[1])

    return handler


def handlers(service: Any) -> grpc.GenericRpcHandler:
    """The generic handler routing ``/inference.GRPCInferenceService/<Method>`` to ``service`` (an
    :class:`InferenceService`: one coroutine per method). Requests arrive as bytes and are parsed by :func:`_answer`."""
    table = {name: grpc.unary_unary_rpc_method_handler(_guarded(name, req, getattr(service, name)),
                                                       request_deserializer=None,
                                                       response_serializer=resp.SerializeToString)
             for name, (req, resp) in proto.METHODS.items()}
    return grpc.method_handlers_generic_handler(proto.SERVICE, table)


async def start_grpc(service: Any, host: str, port: int, max_message_bytes: int) -> tuple[aio.Server, int]:
    """Start a gRPC front answering with ``service`` (see :func:`handlers`) on the running event loop; returns
    the server and the port it bound (``port`` 0: a free one).

    Raises:
        RuntimeError: the address cannot be bound.
    """
    options = [("grpc.max_receive_message_length", max_message_bytes),
               ("grpc.max_send_message_length", max_message_bytes),
               ("grpc.so_reuseport", 0)]  # a second server on a busy port fails instead of sharing it
    server = aio.server(options=options)
    server.add_generic_rpc_handlers([handlers(service)])
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        bound = server.add_insecure_port(address)
    except RuntimeError as exc:
        raise RuntimeError(f"veil serve: cannot bind the gRPC port {address}: {exc}") from None
    if bound == 0:
        raise RuntimeError(f"veil serve: cannot bind the gRPC port {address}")
    await server.start()
    return server, bound
