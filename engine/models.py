"""One served model version: load (session, config auto-complete, warm-up), ready, check inputs, infer.

The flow for a request is ``check_inputs`` (names, datatypes, shapes against the config) then ``infer``
(through the model's :class:`~veil.engine.batcher.Scheduler`). A model reports ready only after its session
exists, its providers are verified and its warm-up ran.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np

from .adapters import AdapterCache, AdapterScheduler, is_adapter_model, load_adapters
from .batcher import Scheduler
from .errors import DatatypeMismatch, MissingInput, ModelLoadFailed, ShapeMismatch, UnknownInput
from .metrics import Metrics, ModelMetrics
from .protocol import InputTensor
from .repository import PbtxtConfig, TensorConfig
from .runtime import TRITON_GRAPH_LEVELS, RuntimeOptions, Session, ort_log_severity, providers_for

logger = logging.getLogger("veil.engine")


class OnnxModel:
    """An ONNX model version served through ONNX Runtime.

    Args:
        config: the model's ``config.pbtxt`` (inputs/outputs may be empty: filled from the graph on load).
        version: the version folder number.
        path: the ``model.onnx`` file.
        manifest: the optional ``veil.json`` content.
        defaults: server-wide runtime options; config.pbtxt values override them.
    """

    def __init__(self, config: PbtxtConfig, version: int, path: Path, manifest: dict[str, Any] | None,
                 defaults: RuntimeOptions) -> None:
        self.config, self.name, self.version, self.path = config, config.name, str(version), path
        self.manifest, self.defaults = manifest, defaults
        self.ready = False
        self.session: Session | None = None
        self.scheduler: Scheduler | None = None
        self.adapters: AdapterCache | None = None  # LoRA adapters (adapters/*.onnx_adapter), see veil.engine.adapters
        self.metrics: ModelMetrics | None = None
        self.inputs: dict[str, TensorConfig] = {}
        self.outputs: dict[str, TensorConfig] = {}

    def runtime_options(self) -> RuntimeOptions:
        """Server defaults, overridden by ``instance_group.kind``, ``parameters`` and ``optimization``."""
        params, cfg = self.config.parameters, self.config
        try:
            intra = int(params.get("intra_op_thread_count", self.defaults.intra_op_threads))
            inter = int(params.get("inter_op_thread_count", self.defaults.inter_op_threads))
        except ValueError as exc:
            raise ModelLoadFailed(f"model '{self.name}': parameters intra/inter_op_thread_count: {exc}") from None
        level = self.defaults.graph_level if cfg.graph_level is None else TRITON_GRAPH_LEVELS.get(cfg.graph_level)
        if level is None:
            raise ModelLoadFailed(f"model '{self.name}': optimization.graph.level expected one of "
                                  f"{list(TRITON_GRAPH_LEVELS)}, received {cfg.graph_level}")
        providers = self.defaults.providers if cfg.instance_kind == "KIND_AUTO" and self.defaults.providers \
            else providers_for(cfg.instance_kind)
        try:  # an adapter model's zero-default LoRA inputs make ORT warn once per input at every session
            severity = ort_log_severity(is_adapter_model(self.path.parent.parent))
        except ValueError as exc:
            raise ModelLoadFailed(f"model '{self.name}': {exc}") from None
        return RuntimeOptions(providers, intra, inter, level, self.defaults.io_binding, log_severity=severity)

    def load(self, metrics: Metrics) -> None:
        """Create the session, complete and check the config against the graph, warm up; then ready.

        Raises:
            ModelLoadFailed: naming the model and the problem.
        """
        options = self.runtime_options()
        try:
            self.session = session = Session(self.path, options)
        except Exception as exc:  # ORT raises its own Fail/InvalidGraph/NoSuchFile types
            raise ModelLoadFailed(f"model '{self.name}' version {self.version}: {self.path}: {exc}") from None
        cfg, batched = self.config, self.config.max_batch_size > 0
        if not cfg.inputs:  # Triton's auto-complete: take inputs/outputs from the graph
            cfg.inputs = [TensorConfig(n, t, session.input_shapes[n][batched:]) for n, t in session.input_types.items()]
        if not cfg.outputs:
            cfg.outputs = [TensorConfig(n, t, session.output_shapes[n][batched:]) for n, t in session.output_types.items()]
        self._check_against_graph(session)
        if cfg.batching is not None and not batched:
            raise ModelLoadFailed(f"model '{self.name}': dynamic_batching needs max_batch_size > 0, received 0")
        session.warm_up([1, cfg.max_batch_size] if cfg.batching is not None and cfg.max_batch_size > 1 else [1])
        self.metrics = metrics.for_model(self.name, self.version, session.provider, options.providers[0])
        self.adapters = load_adapters(self.path.parent.parent, cfg.parameters, metrics, self.name, self.version)
        if self.adapters is None:
            self.scheduler = Scheduler(session.run, session.output_names, cfg.max_batch_size, cfg.batching,
                                       cfg.instance_count, self.metrics)
        else:
            self.scheduler = AdapterScheduler(session, self.adapters, cfg.max_batch_size, cfg.batching,
                                              cfg.instance_count, self.metrics)
        self.inputs = {t.name: t for t in cfg.inputs}
        self.outputs = {t.name: t for t in cfg.outputs}
        self.ready = True
        logger.info("model '%s' version %s ready on %s", self.name, self.version, session.provider)

    def _check_against_graph(self, session: Session) -> None:
        for declared, types, kind in ((self.config.inputs, session.input_types, "input"),
                                      (self.config.outputs, session.output_types, "output")):
            for t in declared:
                if t.name not in types:
                    raise ModelLoadFailed(f"model '{self.name}': config.pbtxt {kind} '{t.name}' is not in the graph; "
                                          f"the graph has {sorted(types)}")
                if types[t.name] != t.datatype:
                    raise ModelLoadFailed(f"model '{self.name}': {kind} '{t.name}' data_type expected "
                                          f"{types[t.name]} (the graph's), received {t.datatype}")
        missing = sorted(set(session.input_types) - {t.name for t in self.config.inputs})
        if missing:
            raise ModelLoadFailed(f"model '{self.name}': config.pbtxt lacks the graph inputs {missing}")

    def shape(self, tensor: TensorConfig) -> list[int]:
        """The full OIP shape: -1 for the batch dim (when max_batch_size > 0) and for variable dims."""
        return ([-1] if self.config.max_batch_size > 0 else []) + list(tensor.dims)

    def check_inputs(self, inputs: list[InputTensor], parameters: dict[str, Any] | None = None) -> tuple[dict[str, np.ndarray], int]:
        """Validate request inputs against the config; returns the feeds and the batch size (1 if unbatched).

        ``parameters`` (the request's) are not used by ONNX models; HE models read ``key_id`` from them.

        Raises:
            UnknownInput, MissingInput, DatatypeMismatch, ShapeMismatch: naming the input, expected and received.
        """
        feeds, batch = {}, None
        for tensor in inputs:
            spec = self.inputs.get(tensor.name)
            if spec is None:
                raise UnknownInput(f"model '{self.name}' has no input '{tensor.name}'; expected {sorted(self.inputs)}")
            if tensor.datatype != spec.datatype:
                raise DatatypeMismatch(f"input '{tensor.name}': datatype expected {spec.datatype}, "
                                       f"received {tensor.datatype}")
            expected = self.shape(spec)
            if len(tensor.shape) != len(expected) or any(e not in (-1, r) for e, r in zip(expected, tensor.shape, strict=True)):
                raise ShapeMismatch(f"input '{tensor.name}': shape expected {expected} (-1: any), received {tensor.shape}")
            if self.config.max_batch_size > 0:
                if batch is not None and tensor.shape[0] != batch:
                    raise ShapeMismatch(f"input '{tensor.name}': batch dim expected {batch} (as the other inputs), "
                                        f"received {tensor.shape[0]}")
                batch = tensor.shape[0]
                if not 1 <= batch <= self.config.max_batch_size:
                    raise ShapeMismatch(f"input '{tensor.name}': batch dim expected 1..{self.config.max_batch_size} "
                                        f"(max_batch_size), received {batch}")
            feeds[tensor.name] = _utf8(tensor) if spec.datatype == "BYTES" else tensor.data
        missing = sorted(set(self.inputs) - set(feeds))
        if missing:
            raise MissingInput(f"model '{self.name}': missing inputs {missing}; expected {sorted(self.inputs)}")
        return feeds, batch or 1

    async def infer(self, feeds: dict[str, np.ndarray], batch: int,
                    adapter: str | None = None) -> tuple[dict[str, np.ndarray], int]:
        """Run through the scheduler (with ``adapter`` active, None: the base); returns every output and the ns queued."""
        if self.scheduler is None:
            raise RuntimeError(f"model '{self.name}': call load() before infer()")
        if adapter is not None and isinstance(self.scheduler, AdapterScheduler):
            return await self.scheduler.submit(feeds, batch, adapter)
        return await self.scheduler.submit(feeds, batch)

    def metadata(self, versions: list[str]) -> dict[str, Any]:
        """OIP model metadata, plus the real execution provider and the veil.json manifest as parameters."""
        if self.session is None:
            raise RuntimeError(f"model '{self.name}': call load() before metadata()")

        def tensors(specs: list[TensorConfig]) -> list[dict[str, Any]]:
            return [{"name": t.name, "datatype": t.datatype, "shape": self.shape(t)} for t in specs]

        parameters: dict[str, Any] = {"execution_provider": self.session.provider,
                                      "requested_providers": self.session.requested,
                                      "max_batch_size": self.config.max_batch_size}
        if self.manifest is not None:
            parameters["veil"] = self.manifest
        return {"name": self.name, "versions": versions, "platform": "onnxruntime_onnx",
                "inputs": tensors(self.config.inputs), "outputs": tensors(self.config.outputs),
                "parameters": parameters}

    async def unload(self) -> None:
        """Stop taking requests, let the queued ones finish, release the session."""
        self.ready = False
        if self.scheduler is not None:
            await self.scheduler.drain()
            self.scheduler.close()


def _utf8(tensor: InputTensor) -> np.ndarray:
    """BYTES elements -> str: ONNX string tensors are UTF-8 and ORT takes Python str."""
    try:
        return np.vectorize(lambda b: b.decode("utf-8"), otypes=[object])(tensor.data)
    except UnicodeDecodeError as exc:
        raise DatatypeMismatch(f"input '{tensor.name}': BYTES for an ONNX string tensor must be UTF-8: {exc}") from None
