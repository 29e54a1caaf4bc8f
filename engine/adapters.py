"""Per-request LoRA adapters on an adapter-as-input model (`veil export adapters`): selection, LRU cache, grouping.

A model folder with ``adapters/<id>.onnx_adapter`` files serves its base graph plus one adapter per request,
chosen by ``"parameters": {"adapter_id": "<id>"}`` (LoRAX style) or by the model name ``<model>:<id>``
(vLLM style, so unmodified OIP clients can pick one). Adapters are ONNX Runtime ``LoraAdapter`` objects, loaded on
first use and kept in an LRU cache of ``parameters { key: "adapter_cache_size" }`` entries (default 8).

ONNX Runtime activates one adapter set per ``run``, so the dynamic batcher groups the requests of a batch by
adapter id and runs each group once with ``RunOptions.add_active_adapter`` (requests without an adapter form the
base group). This is the CPU path; a fused mixed-adapter GPU path (SGMV-style kernels) comes with the GPU-kernel
issue. Adapter runs use ``InferenceSession.run``: ORT ignores active adapters in ``run_with_iobinding``.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Hashable
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from .batcher import Scheduler
from .errors import AdapterNotFound, MalformedRequest, ModelLoadFailed
from .metrics import CounterFamily, Metrics, ModelMetrics
from .repository import BatchingConfig
from .runtime import Session

SUFFIX = ".onnx_adapter"
DEFAULT_CACHE_SIZE = 8


def _families(metrics: Metrics) -> dict[str, CounterFamily]:
    """The adapter-cache counters of an app (``veil_adapter_cache_{hits,misses,evictions}_total``, no ``_created``)."""
    return {kind: metrics.counter(f"veil_adapter_cache_{kind}_total", f"Adapter cache {kind} (LRU of loaded "
                                  "ORT LoraAdapters)", ["model", "version"]) for kind in ("hits", "misses", "evictions")}


class AdapterCache:
    """The adapters of one model version: known ids, and an LRU of loaded ``RunOptions`` (adapter active).

    Args:
        folder: the model's ``adapters/`` folder (``<id>.onnx_adapter`` files).
        capacity: adapters kept loaded; the least recently used one is dropped beyond it.
        metrics: the app's metrics (hits, misses and evictions are counted per model version).
        name / version: labels of the counters.
    """

    def __init__(self, folder: Path, capacity: int, metrics: Metrics, name: str, version: str) -> None:
        self.folder, self.capacity, self.name = folder, capacity, name
        self.ids = sorted(p.name[:-len(SUFFIX)] for p in folder.glob(f"*{SUFFIX}"))
        # id -> (adapter, run options): RunOptions holds a raw pointer, so the LoraAdapter must stay referenced
        self._loaded: collections.OrderedDict[str, tuple[ort.LoraAdapter, ort.RunOptions]] = collections.OrderedDict()
        self._lock = threading.Lock()
        self.hits = self.misses = self.evictions = 0
        self._counters = {k: c.labels(model=name, version=version) for k, c in _families(metrics).items()}

    def check(self, adapter_id: str) -> str:
        """``adapter_id`` if the model has it.

        Raises:
            AdapterNotFound: naming the model and its adapter ids.
        """
        if adapter_id not in self.ids:
            raise AdapterNotFound(f"model '{self.name}' has no adapter '{adapter_id}'; known adapters: {self.ids}")
        return adapter_id

    def activate(self, adapter_id: str) -> tuple[ort.LoraAdapter, ort.RunOptions]:
        """The loaded adapter and run options with it active (load on a miss, evict the least recently used).

        Keep the adapter referenced for the whole run: an eviction by another thread must not free it mid-run.
        """
        with self._lock:
            entry = self._loaded.get(adapter_id)
            if entry is not None:
                self._loaded.move_to_end(adapter_id)
                self.hits += 1
                self._counters["hits"].inc()
                return entry
            adapter = ort.LoraAdapter()
            adapter.Load(str(self.folder / f"{adapter_id}{SUFFIX}"))  # memory-mapped
            options = ort.RunOptions()
            options.add_active_adapter(adapter)
            self._loaded[adapter_id] = entry = (adapter, options)
            self.misses += 1
            self._counters["misses"].inc()
            while len(self._loaded) > self.capacity:
                self._loaded.popitem(last=False)
                self.evictions += 1
                self._counters["evictions"].inc()
            return entry

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {"capacity": self.capacity, "adapters": self.ids, "loaded": list(self._loaded),
                    "hits": self.hits, "misses": self.misses, "evictions": self.evictions}


def is_adapter_model(model_dir: Path) -> bool:
    """Whether the model folder holds ``adapters/*.onnx_adapter`` files (served with an :class:`AdapterCache`)."""
    folder = model_dir / "adapters"
    return folder.is_dir() and any(folder.glob(f"*{SUFFIX}"))


def load_adapters(model_dir: Path, parameters: dict[str, str], metrics: Metrics, name: str,
                  version: str) -> AdapterCache | None:
    """The model's AdapterCache, or None when ``<model>/adapters/`` holds no ``.onnx_adapter`` file.

    Raises:
        ModelLoadFailed: ``adapter_cache_size`` is not an integer >= 1.
    """
    if not is_adapter_model(model_dir):
        return None
    folder = model_dir / "adapters"
    raw = parameters.get("adapter_cache_size", str(DEFAULT_CACHE_SIZE))
    if not raw.isdigit() or int(raw) < 1:
        raise ModelLoadFailed(f"model '{name}': parameters adapter_cache_size expected an integer >= 1, received {raw!r}")
    return AdapterCache(folder, int(raw), metrics, name, version)


def select_adapter(cache: AdapterCache | None, model: str, from_name: str | None,
                   parameters: dict[str, Any] | None) -> str | None:
    """The adapter a request asks for (``<model>:<id>`` or ``parameters.adapter_id``), checked; None: the base.

    Raises:
        MalformedRequest: adapter_id is not a string, or the name and the parameter disagree.
        AdapterNotFound: the model has no such adapter (or no adapters at all).
    """
    from_param = (parameters or {}).get("adapter_id")
    if from_param is not None and not isinstance(from_param, str):
        raise MalformedRequest(f"parameters.adapter_id: expected a string, received {from_param!r}")
    if from_name and from_param and from_name != from_param:
        raise MalformedRequest(f"parameters.adapter_id: expected '{from_name}' (as in the model name "
                               f"'{model}:{from_name}') or nothing, received '{from_param}'")
    adapter = from_name or from_param
    if not adapter:
        return None
    if cache is None:
        raise AdapterNotFound(f"model '{model}' has no adapter '{adapter}'; known adapters: [] (not an adapter model)")
    return cache.check(adapter)


class AdapterScheduler(Scheduler):
    """The dynamic batcher with one session run per adapter group of each batch (the ORT path).

    Requests carry their adapter id as the batcher's tag (:meth:`Scheduler.submit`), so a batch groups by adapter
    and each adapter group runs through the ``run_tagged`` hook with that adapter active.

    Args:
        session: the model's session; base groups use ``session.run``, adapter groups ``InferenceSession.run``.
        cache: the model's adapters.
        The other arguments are :class:`~veil.engine.batcher.Scheduler`'s.
    """

    def __init__(self, session: Session, cache: AdapterCache, max_batch_size: int, batching: BatchingConfig | None,
                 instances: int, metrics: ModelMetrics) -> None:
        super().__init__(session.run, session.output_names, max_batch_size, batching, instances, metrics,
                         run_tagged=self._run_adapter)
        self._session, self._cache = session, cache

    def _run_adapter(self, feeds: dict[str, np.ndarray], adapter: Hashable) -> list[np.ndarray]:
        """Worker thread: one run of ``feeds`` with ``adapter`` active."""
        _loaded, options = self._cache.activate(str(adapter))  # _loaded stays referenced until the run returns
        return self._session.session.run(self._session.output_names, feeds, run_options=options)


def adapter_metadata(body: dict[str, Any], cache: AdapterCache | None, requested: str) -> dict[str, Any]:
    """Model metadata for ``<model>:<id>`` (name as requested, the adapter in parameters) or with the adapter list."""
    if cache is None:
        return body
    _, _, adapter = requested.partition(":")
    body["parameters"]["adapters"] = cache.ids
    if adapter:
        body["name"], body["parameters"]["adapter_id"] = requested, adapter
    return body
