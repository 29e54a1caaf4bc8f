"""The data plane's protocol: what the two fronts (HTTP, gRPC) ask of the models, wherever they run.

KServe's shape: one data plane under exactly two fronts. :mod:`veil.engine.http` and
:mod:`veil.engine.grpc_server` map their messages to the methods of :class:`Plane` and back, nothing else; where a
model runs is the plane's business:

    DataPlane  (veil.engine.dataplane)   this process: the model registry, batchers, HE key store
    RayPlane   (veil.engine.ray_plane)   Ray Serve replicas (one application per model, multiplexed adapters,
                                         HE fan-out), each answering with a DataPlane of its own

``veil serve`` builds the first, ``veil serve --ray`` the second (in its front replica); both are served by
:func:`veil.engine.server.create_app` and its gRPC service. Every method answers plain values (dicts, lists,
:class:`~veil.engine.protocol.InferResponse`) and raises the engine's errors (:mod:`veil.engine.errors`).
Implements the Open Inference Protocol v2 (https://github.com/kserve/open-inference-protocol) and Triton's
model-configuration, statistics and model-repository extensions.
"""

from __future__ import annotations

import abc
import hmac
from collections.abc import Collection
from pathlib import Path
from typing import TYPE_CHECKING, Any

from veil import __version__

from .errors import MalformedRequest, RepositoryApiDisabled, Unauthorized
from .protocol import InferRequest, InferResponse

if TYPE_CHECKING:
    from veil.he.keystore import KeyStore

EXTENSIONS = ["binary_tensor_data", "model_configuration", "statistics", "veil_he_keys"]


def check_admin(admin_token: str | None, given: str | None, where: str) -> None:
    """The repository API's refusals, the same on both fronts: off without a token, the wrong or no bearer token.

    Args:
        admin_token: the server's token (None: the repository API is off).
        given: the bearer token the request carried (None: none).
        where: how the front carries it, for the message (``"header 'Authorization"``, ``"metadata 'authorization"``).

    Raises:
        RepositoryApiDisabled: no admin token (403 / PERMISSION_DENIED). Unauthorized: wrong token (401).
    """
    if admin_token is None:
        raise RepositoryApiDisabled("the repository API is off: start the server with --admin-token or "
                                    "VEIL_ADMIN_TOKEN")
    if not is_admin(admin_token, given):
        raise Unauthorized(f"repository API: expected the {where}: Bearer <admin token>'")


def is_admin(admin_token: str | None, given: str | None) -> bool:
    """Whether ``given`` is the admin token (compared in constant time; never with the API off)."""
    return admin_token is not None and given is not None and hmac.compare_digest(given.encode(), admin_token.encode())


class Plane(abc.ABC):
    """The data-plane protocol (see the module docstring).

    Attributes:
        repo: the model repository folder.
        models: the names of the loaded models.
        extensions: what this plane adds to the OIP server metadata's extensions.
    """

    repo: Path
    models: Collection[str]
    extensions: tuple[str, ...] = ()

    def server_metadata(self, admin: bool) -> dict[str, Any]:
        """OIP server metadata; ``admin``: the repository API is on."""
        return {"name": "veil", "version": __version__,
                "extensions": [*EXTENSIONS, *(["model_repository"] if admin else []), *self.extensions]}

    @staticmethod
    def check_load_parameters(parameters: dict[str, Any] | None) -> None:
        """A repository load request's ``parameters``: veil loads ``config.pbtxt`` and the version folders from
        the repository, so a ``config`` override or ``file:`` contents (Triton applies them) are refused rather
        than answered OK and ignored (issue 31 item 17).

        Raises:
            MalformedRequest: naming the parameters received (400 / INVALID_ARGUMENT).
        """
        if parameters:
            raise MalformedRequest(f"load parameters: expected none (veil loads config.pbtxt and the model files "
                                   f"from the repository; edit them there, then load), received "
                                   f"{sorted(str(k)[:40] for k in parameters)[:8]}")

    # -- health and metadata ----------------------------------------------------------------------------
    @abc.abstractmethod
    async def server_ready(self) -> tuple[bool, dict[str, Any]]:
        """Whether every model is ready, and the readiness body (``{"ready": ..., <details>}``)."""

    @abc.abstractmethod
    async def model_ready(self, name: str, version: str | None) -> dict[str, Any]:
        """``{"name", "version", "ready", "execution_provider"}`` of ``name`` (``<model>[:<adapter>]``).

        Raises:
            ModelNotFound (AdapterNotFound), InvalidModelName.
        """

    @abc.abstractmethod
    async def model_metadata(self, name: str, version: str | None) -> dict[str, Any]:
        """The OIP model metadata (with kind-specific ``parameters``: adapters, HE, codec, sampler)."""

    @abc.abstractmethod
    async def model_config(self, name: str, version: str | None) -> dict[str, Any]:
        """config.pbtxt as Triton's JSON model configuration, with veil.json under ``"veil"`` when there is one."""

    @abc.abstractmethod
    async def model_inputs(self, name: str, version: str | None) -> dict[str, str]:
        """Input name -> datatype: what a front checks each declared input against before decoding its data."""

    # -- inference and statistics -----------------------------------------------------------------------
    @abc.abstractmethod
    async def infer(self, name: str, version: str | None, request: InferRequest) -> InferResponse:
        """Validate, schedule (batched or not) and select the requested outputs.

        Raises:
            ModelNotFound, ModelNotReady, UnknownInput, MissingInput, UnknownOutput, ShapeMismatch,
            DatatypeMismatch, QueueFull, InferenceFailed (and veil.he's refusals for HE models).
        """

    @abc.abstractmethod
    async def statistics(self, name: str | None, version: str | None) -> list[dict[str, Any]]:
        """Triton's ``model_stats`` entries: every model, one model's versions, or one version."""

    @abc.abstractmethod
    def prometheus(self) -> bytes:
        """The Prometheus exposition text of ``GET /metrics``."""

    # -- model repository extension (the fronts check the admin token first) ----------------------------
    @abc.abstractmethod
    async def repository_index(self, ready_only: bool = False) -> list[dict[str, Any]]:
        """Triton's repository index: every model of the repository with its state (and reason)."""

    @abc.abstractmethod
    async def load(self, name: str, parameters: dict[str, Any] | None = None) -> None:
        """(Re)load a model from the repository; the old one keeps serving until the new one is ready.

        Raises:
            MalformedRequest (``parameters`` given), InvalidModelName, ModelNotFound, ModelLoadFailed.
        """

    @abc.abstractmethod
    async def unload(self, name: str) -> None:
        """Unload every version of a model; queued and running requests finish first."""

    # -- HE evaluation keys ------------------------------------------------------------------------------
    @abc.abstractmethod
    def keystore(self) -> KeyStore:
        """The store of registered HE evaluation keys (private ``/v2/recommend`` reads it)."""

    @abc.abstractmethod
    async def key_upload_bounds(self) -> tuple[int, str, Path]:
        """The largest key bundle ``POST /v2/he/keys`` accepts, the setting that bounds it (for the 413 message)
        and the key store's folder, which the front spools the upload into.

        Raises:
            ModelNotFound: no model that takes keys is loaded, so no key is accepted.
        """

    @abc.abstractmethod
    async def register_keys(self, path: str, source: str, key_secret: str | None) -> dict[str, Any]:
        """Register the key bundle spooled to ``path`` (in the store's folder) for the client address ``source``;
        ``key_secret`` renews a registered set -> ``{"key_id", "key_secret", "bytes", "ttl_seconds"}``."""

    @abc.abstractmethod
    async def delete_keys(self, key_id: str, token: str | None, admin: bool) -> None:
        """Delete a registered key set: ``token`` is its secret, or ``admin`` says it is the admin token."""

    @abc.abstractmethod
    async def drain(self) -> None:
        """Graceful shutdown: every model this process runs finishes its queued and running requests."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Shutdown, after :meth:`drain`: release what this process's models hold (an HE model's forked workers)."""
