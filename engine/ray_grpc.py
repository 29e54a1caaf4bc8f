"""The OIP v2 gRPC front of `veil serve --ray --grpc-port P`: one ``grpc.aio`` server in the front replica.

Ray Serve's own gRPC proxy routes a call by an ``application`` metadata key that stock ``tritonclient.grpc``
never sends, and veil deploys one application per model; so the front (:class:`~veil.engine.ray_serve.VeilFront`)
runs veil's gRPC service itself and routes by the request's model name:

    ModelReady / ModelMetadata / ModelInfer / ModelConfig     forwarded as serialized bytes to a replica of that
                                                              model (``VeilModel.rpc``), which answers with veil's
                                                              own :class:`~veil.engine.grpc_server.InferenceService`
                                                              over its data plane: same messages, same errors
    ServerLive / ServerReady / ServerMetadata                 answered here (ready: every model's replicas)
    ModelStatistics                                           the statistics board's sums over replicas
    RepositoryIndex / Load / Unload                           here, behind the admin token, as over HTTP

A ``<model>:<adapter>`` name is routed with Ray's multiplexing to a replica already holding that adapter.
An error a replica answered comes back as :class:`~veil.engine.errors.ReplicaError` with its status and message
(:func:`~veil.engine.ray_serve.replica_answer`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from google.protobuf import json_format
from grpc import aio

from veil import __version__

from . import proto
from .dataplane import DataPlane
from .errors import ModelNotFound
from .grpc_server import EXTENSIONS, check_admin
from .ray_serve import replica_answer
from .repository import check_model_name

if TYPE_CHECKING:
    from .ray_serve import VeilFront

msg = proto.msg


class RayInferenceService:
    """``inference.GRPCInferenceService`` on the Ray front (see the module docstring).

    Args:
        front: the front replica: its loaded models and their handles, statistics board, repository operations
            and admin token.
    """

    def __init__(self, front: VeilFront) -> None:
        self.front = front

    async def _forward(self, method: str, name: str, request: Any) -> Any:
        """``request`` answered by a replica of the model ``name`` names (``<model>[:<adapter>]``)."""
        model, _, adapter = check_model_name(name).partition(":")
        if model not in self.front.models:
            raise ModelNotFound(f"model '{model}' is not loaded; loaded models: {sorted(self.front.models)}")
        handle = self.front.model_handle(model, adapter)
        return proto.METHODS[method][1].FromString(replica_answer(await handle.rpc.remote(method, request.SerializeToString())))

    async def ServerLive(self, request: Any, context: aio.ServicerContext) -> Any:
        return msg.ServerLiveResponse(live=True)

    async def ServerReady(self, request: Any, context: aio.ServicerContext) -> Any:
        return msg.ServerReadyResponse(ready=all((await self.front.model_states()).values()))

    async def ServerMetadata(self, request: Any, context: aio.ServicerContext) -> Any:
        extensions = EXTENSIONS + ["model_repository"] * (self.front.config.admin_token is not None) + ["ray_serve"]
        return msg.ServerMetadataResponse(name="veil", version=__version__, extensions=extensions)

    async def ModelReady(self, request: Any, context: aio.ServicerContext) -> Any:
        return await self._forward("ModelReady", request.name, request)

    async def ModelMetadata(self, request: Any, context: aio.ServicerContext) -> Any:
        return await self._forward("ModelMetadata", request.name, request)

    async def ModelInfer(self, request: Any, context: aio.ServicerContext) -> Any:
        return await self._forward("ModelInfer", request.model_name, request)

    async def ModelConfig(self, request: Any, context: aio.ServicerContext) -> Any:
        return await self._forward("ModelConfig", request.name, request)

    async def ModelStatistics(self, request: Any, context: aio.ServicerContext) -> Any:
        """Summed over replicas (the board's view; each replica reports every ``REPORT_S``)."""
        model = None
        if request.name:
            model = check_model_name(request.name).partition(":")[0]
            if model not in self.front.models:
                raise ModelNotFound(f"model '{model}' is not loaded; loaded models: {sorted(self.front.models)}")
        rows = self.front.stats(model, request.version or None)
        return msg.ModelStatisticsResponse(model_stats=[
            json_format.ParseDict(row, msg.ModelStatistics(), ignore_unknown_fields=True) for row in rows])

    async def RepositoryIndex(self, request: Any, context: aio.ServicerContext) -> Any:
        check_admin(self.front.config.admin_token, context)
        index = msg.RepositoryIndexResponse.ModelIndex
        rows = [r for r in self.front.index_rows() if r["state"] == "READY" or not request.ready]
        return msg.RepositoryIndexResponse(models=[index(name=r["name"], state=r["state"], reason=r.get("reason", ""))
                                                   for r in rows])

    async def RepositoryModelLoad(self, request: Any, context: aio.ServicerContext) -> Any:
        check_admin(self.front.config.admin_token, context)
        DataPlane.check_load_parameters(dict(request.parameters))
        await self.front.load_model(request.model_name)
        return msg.RepositoryModelLoadResponse()

    async def RepositoryModelUnload(self, request: Any, context: aio.ServicerContext) -> Any:
        check_admin(self.front.config.admin_token, context)
        await self.front.unload_model(request.model_name)
        return msg.RepositoryModelUnloadResponse()


async def start(front: VeilFront) -> tuple[aio.Server, int]:
    """Start the front's gRPC server on the replica's event loop (``front.config.grpc_port``; 0: a free one)."""
    from .grpc_server import start_grpc

    config = front.config
    return await start_grpc(RayInferenceService(front), config.host, config.grpc_port,
                            int(config.grpc_max_message_mb * 2**20))

