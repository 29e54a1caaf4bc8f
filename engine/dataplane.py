"""The in-process data plane: the model registry (the only way to a model) and protocol-agnostic inference.

:class:`DataPlane` implements :class:`~veil.engine.plane.Plane` with the models loaded in this process (``veil
serve``, and each Ray Serve replica of ``veil serve --ray``). The fronts (:mod:`veil.engine.http`,
:mod:`veil.engine.grpc_server`) decode their messages and call the methods here; nothing in this module knows about
a transport. Implements the Open Inference Protocol v2 semantics (https://github.com/kserve/open-inference-protocol,
REST spec) and Triton's model-repository extension.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import importlib
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from veil.atomic import sweep_stale

from .adapters import adapter_metadata, select_adapter
from .errors import ModelLoadFailed, ModelNotFound, ModelNotReady, UnknownOutput
from .metrics import Metrics
from .models import OnnxModel
from .plane import Plane
from .protocol import InferRequest, InferResponse
from .repository import CUSTOM_BACKENDS, check_model_name, index, read_model
from .runtime import RuntimeOptions

if TYPE_CHECKING:
    from veil.he.keystore import KeyStore

logger = logging.getLogger("veil.engine")


class DataPlane(Plane):
    """Loads the models of a repository and answers metadata, readiness and inference for them.

    Args:
        repo: the model repository folder.
        options: server-wide runtime defaults (config.pbtxt values override them per model).
        metrics: the app's metrics (Prometheus registry and Triton statistics).
        keystore: builds the key store of registered HE evaluation keys (called once, when first needed).
    """

    def __init__(self, repo: Path, options: RuntimeOptions, metrics: Metrics,
                 keystore: Callable[[], KeyStore] | None = None) -> None:
        if not repo.is_dir():
            raise FileNotFoundError(f"--repo: expected a model repository folder, received {str(repo)!r}")
        self.repo, self.options, self.metrics = repo, options, metrics
        self.models: dict[str, dict[str, OnnxModel]] = {}  # name -> version -> model
        self.unavailable: dict[str, str] = {}  # name -> reason (unloaded, load error)
        self._keystore_factory, self._keystore = keystore, None

    def keystore(self) -> KeyStore:
        """The HE key store (created on first use; HE models and key registration share it)."""
        if self._keystore is None:
            if self._keystore_factory is None:
                raise ModelLoadFailed("encrypted-inference models need a key store; start the server with --he-key-dir")
            self._keystore = self._keystore_factory()
        return self._keystore

    def load_all(self, names: list[str] | None = None) -> None:
        """Load every model in the repository, or only ``names`` (a Ray Serve replica serves one model), at
        startup; a failure stops the server, as Triton does.

        First the temporaries that killed exporters left in the repository are swept (a read-only repository
        is left as it is): an interrupted export leaves nothing behind once the server starts."""
        names = index(self.repo) if names is None else names
        for folder in (self.repo, *(self.repo / check_model_name(name) for name in names)):
            try:
                sweep_stale(folder)
            except OSError as exc:
                logger.warning("could not sweep stale temporaries in %s: %s", folder, exc)
        for name in names:
            self.models[name] = self._load_versions(name)

    def _load_versions(self, name: str) -> dict[str, OnnxModel]:
        folder = self.repo / check_model_name(name)  # one path component: never outside the repository
        if not folder.is_dir():
            raise ModelNotFound(f"model '{name}' is not in the repository {self.repo}")
        source = read_model(folder)
        loaded: dict[str, OnnxModel] = {}
        for version, path in source.versions.items():
            # each version gets its own copy of the config: auto-complete fills it from that version's graph
            config = copy.deepcopy(source.config)
            if config.backend in CUSTOM_BACKENDS:
                spec = CUSTOM_BACKENDS[config.backend]
                model_cls = getattr(importlib.import_module(spec.module), spec.cls)
                model = model_cls(config, version, path, source.manifest, self)
            else:
                model = OnnxModel(config, version, path, source.manifest, self.options)
            model.load(self.metrics)
            loaded[model.version] = model
        return loaded

    # -- registry -------------------------------------------------------------------------------------
    def get_model(self, name: str, version: str | None = None) -> OnnxModel:
        """The model (latest loaded version when ``version`` is None); ``<model>:<adapter>`` names its base model.

        Raises:
            ModelNotFound: no such model or version is loaded (AdapterNotFound: no such adapter).
            InvalidModelName: the name is not one path component.
        """
        name, _, adapter = name.partition(":")
        model = self._get_model(check_model_name(name), version)
        if adapter:
            select_adapter(getattr(model, "adapters", None), name, adapter, None)
        return model

    def _get_model(self, name: str, version: str | None) -> OnnxModel:
        versions = self.models.get(name)
        if not versions:
            raise ModelNotFound(f"model '{name}' is not loaded; loaded models: {sorted(self.models)}")
        if version is None:
            return versions[max(versions, key=int)]
        if version not in versions:
            raise ModelNotFound(f"model '{name}' has no loaded version '{version}'; loaded versions: "
                                f"{sorted(versions, key=int)}")
        return versions[version]

    def versions(self, name: str) -> list[str]:
        return sorted(self.models.get(name.partition(":")[0], {}), key=int)

    def ready(self) -> bool:
        """Server readiness: every loaded model version is ready (loaded, providers verified, warmed up)."""
        return all(m.ready for versions in self.models.values() for m in versions.values())

    def providers(self) -> dict[str, str]:
        """``name/version`` -> the execution provider really in use."""
        return {f"{m.name}/{m.version}": m.session.provider if m.session is not None else m.config.backend
                for versions in self.models.values() for m in versions.values()}

    # -- health and metadata (Plane) ------------------------------------------------------------------
    async def server_ready(self) -> tuple[bool, dict[str, Any]]:
        ok = self.ready()
        return ok, {"ready": ok, "execution_providers": self.providers()}

    async def model_ready(self, name: str, version: str | None) -> dict[str, Any]:
        m = self.get_model(name, version)
        return {"name": m.name, "version": m.version, "ready": m.ready,
                "execution_provider": m.session.provider if m.session else None}

    async def model_metadata(self, name: str, version: str | None) -> dict[str, Any]:
        m = self.get_model(name, version)
        return adapter_metadata(m.metadata(self.versions(name)), getattr(m, "adapters", None), name)

    async def model_config(self, name: str, version: str | None) -> dict[str, Any]:
        m = self.get_model(name, version)
        config = m.config.to_triton_json()
        if m.manifest is not None:
            config["veil"] = m.manifest
        return config

    async def model_inputs(self, name: str, version: str | None) -> dict[str, str]:
        return {n: t.datatype for n, t in self.get_model(name, version).inputs.items()}

    async def statistics(self, name: str | None = None, version: str | None = None) -> list[dict[str, Any]]:
        """Triton's statistics entries, plus ``adapter_cache`` (LRU hits, misses, evictions) for adapter models."""
        if name is None:
            models = [m for versions in self.models.values() for m in versions.values()]
        elif version is None:
            self.get_model(name)  # 404 when unknown
            models = list(self.models[name.partition(":")[0]].values())
        else:
            models = [self.get_model(name, version)]
        rows = []
        for m in models:
            if m.metrics is not None:
                rows.append(m.metrics.to_triton())
                if getattr(m, "adapters", None) is not None:
                    rows[-1]["adapter_cache"] = m.adapters.stats()
        return rows

    def prometheus(self) -> bytes:
        return self.metrics.render()

    # -- inference ------------------------------------------------------------------------------------
    async def infer(self, name: str, version: str | None, request: InferRequest) -> InferResponse:
        """Validate, schedule (batched or not) and select the requested outputs.

        Raises:
            ModelNotFound, ModelNotReady, UnknownInput, MissingInput, UnknownOutput, ShapeMismatch,
            DatatypeMismatch, QueueFull, InferenceFailed.
        """
        model = self.get_model(name, version)
        if not model.ready or model.metrics is None:
            raise ModelNotReady(f"model '{name}' version {model.version} is not ready")
        start = time.perf_counter_ns()
        try:
            requested = request.outputs if request.outputs is not None else \
                dict.fromkeys(model.outputs, request.binary_output)
            unknown = sorted(set(requested) - set(model.outputs))
            if unknown:
                raise UnknownOutput(f"model '{name}' has no outputs {unknown}; expected {sorted(model.outputs)}")
            adapter = select_adapter(getattr(model, "adapters", None), model.name, name.partition(":")[2] or None,
                                     request.parameters)
            feeds, batch = model.check_inputs(request.inputs, request.parameters)
            outputs, queue_ns = await (model.infer(feeds, batch) if adapter is None else model.infer(feeds, batch, adapter))
        except BaseException:  # client errors and server faults alike count as failed (as in Triton)
            model.metrics.record_request(False, time.perf_counter_ns() - start, 0)
            raise
        model.metrics.record_request(True, time.perf_counter_ns() - start, queue_ns)
        return InferResponse(model_name=name, model_version=model.version,
                             outputs={n: outputs[n] for n in requested},
                             datatypes={n: model.outputs[n].datatype for n in requested},
                             binary=requested, id=request.id)

    # -- model repository extension -------------------------------------------------------------------
    async def repository_index(self, ready_only: bool = False) -> list[dict[str, Any]]:
        """Triton's repository index: every model folder with its versions' state."""
        rows: list[dict[str, Any]] = []
        for name in sorted(set(index(self.repo)) | set(self.models)):
            versions = self.models.get(name, {})
            rows += [{"name": name, "version": v, "state": "READY" if m.ready else "UNAVAILABLE"}
                     for v, m in sorted(versions.items(), key=lambda kv: int(kv[0]))]
            if not versions and not ready_only:
                rows.append({"name": name, "state": "UNAVAILABLE", "reason": self.unavailable.get(name, "unloaded")})
        return [r for r in rows if r["state"] == "READY"] if ready_only else rows

    async def load(self, name: str, parameters: dict[str, Any] | None = None) -> None:
        """(Re)load a model from disk; the old versions keep serving until the new ones are ready.

        Raises:
            MalformedRequest (``parameters`` given), InvalidModelName, ModelNotFound, ModelLoadFailed.
        """
        self.check_load_parameters(parameters)
        check_model_name(name)
        try:
            new = await asyncio.get_running_loop().run_in_executor(None, self._load_versions, name)
        except ModelLoadFailed as exc:
            self.unavailable[name] = str(exc)
            raise
        old = self.models.get(name, {})
        self.models[name] = new
        self.unavailable.pop(name, None)
        for model in old.values():
            await self._retire(model)

    async def unload(self, name: str) -> None:
        """Unload every version of a model; queued and running requests finish first.

        Raises:
            InvalidModelName: the name is not one path component. ModelNotFound: the model is not loaded.
        """
        versions = self.models.pop(check_model_name(name), None)
        if versions is None:
            raise ModelNotFound(f"model '{name}' is not loaded; loaded models: {sorted(self.models)}")
        self.unavailable[name] = "unloaded"
        for model in versions.values():
            await self._retire(model)

    async def _retire(self, model: OnnxModel) -> None:
        await model.unload()
        if model.session is not None and model.version not in self.models.get(model.name, {}):
            self.metrics.forget(model.name, model.version, model.session.provider, model.session.requested[0])

    async def drain(self) -> None:
        """Graceful shutdown: every model finishes its queued and running requests."""
        await asyncio.gather(*(m.scheduler.drain() for versions in self.models.values() for m in versions.values()
                               if m.scheduler is not None))

    async def close(self) -> None:
        """Shutdown, after :meth:`drain`: every model releases what it holds (an HE model's forked workers, which
        would otherwise live on in a process that keeps running, as a test's or an embedding application's does)."""
        for versions in self.models.values():
            for model in versions.values():
                await model.unload()

    # -- HE evaluation keys (Plane) ---------------------------------------------------------------------
    async def key_upload_bounds(self) -> tuple[int, str, Path]:
        """The largest key bundle accepted: what the largest served plan's key manifest needs
        (:func:`~veil.engine.he_model.key_upload_limit`) or private matching's keys
        (:func:`~veil.engine.recommend.key_bundle_limit`, when a loaded model has a PAVE spec), or the store's
        quota if smaller; the setting that bounds it; the store's folder.

        Raises:
            ModelNotFound: no encrypted-inference model and no PAVE spec is loaded, so no key is accepted.
        """
        from .he_model import key_upload_limit
        from .recommend import key_bundle_limit

        he_limit, pave_limit = key_upload_limit(self), key_bundle_limit(self)
        if he_limit is None and pave_limit is None:
            raise ModelNotFound("POST /v2/he/keys: no encrypted-inference (veil_he) model and no model with a PAVE "
                                "spec (private /v2/recommend) is loaded, so no key is accepted")
        store, limit = self.keystore(), max(x for x in (he_limit, pave_limit) if x is not None)
        if store.quota_bytes < limit:
            return store.quota_bytes, "--he-key-quota-mb", store.root
        return limit, ("the largest served HE plan's key bundle" if limit == he_limit else
                       "private /v2/recommend's key bundle"), store.root

    async def register_keys(self, path: str, source: str, key_secret: str | None) -> dict[str, Any]:
        body = await asyncio.to_thread(Path(path).read_bytes)
        return await register_key_bytes(self.keystore(), body, source, key_secret)

    async def delete_keys(self, key_id: str, token: str | None, admin: bool) -> None:
        self.keystore().delete(key_id, token, admin=admin)


# key registrations parse in their own threads: HE evaluations (asyncio.to_thread, the default pool of
# min(32, cores + 4) threads) could otherwise take every thread and hold a registration for their whole run
_KEY_POOL = ThreadPoolExecutor(max_workers=2, thread_name_prefix="veil-keys")


async def register_key_bytes(store: KeyStore, body: bytes, source: str, key_secret: str | None) -> dict[str, Any]:
    """Register a key bundle (off the event loop: parsing ~100 MiB of keys takes seconds) -> the response body.

    It runs in a pool of its own (``_KEY_POOL``), never behind HE evaluations in the default one."""
    register = functools.partial(store.register, body, source=source, key_secret=key_secret)
    reg = await asyncio.get_running_loop().run_in_executor(_KEY_POOL, register)
    return {"key_id": reg.key_id, "key_secret": reg.key_secret, "bytes": reg.size, "ttl_seconds": store.ttl_seconds}
