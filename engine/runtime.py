"""ONNX Runtime sessions: explicit providers, verified after creation, thread defaults, warm-up, IO binding.

The session factory never hides a fallback: when CUDA is requested and ORT carries on without it (a missing
cuDNN/CUDA, onnxruntime instead of onnxruntime-gpu), :class:`Session` keeps the providers really in use,
logs a warning and reports the real provider to model metadata, ``/metrics`` and readiness. The run path
is deliberately thin: ``Session.run`` is ``InferenceSession.run`` on CPU, and an IO-binding run when the CUDA
EP is active (inputs copied once to the device, outputs bound on it and copied back).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnxruntime as ort

from .protocol import DATATYPES, ONNX_DATATYPES

logger = logging.getLogger("veil.engine")

GRAPH_LEVELS = {"disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
                "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
                "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
                "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL}
# config.pbtxt `optimization { graph { level } }`, as Triton's onnxruntime backend reads it
TRITON_GRAPH_LEVELS = {-1: "basic", 0: "all", 1: "extended"}
CUDA, CPU = "CUDAExecutionProvider", "CPUExecutionProvider"
ORT_LOG_ENV = "VEIL_ORT_LOG_SEVERITY"  # ONNX Runtime's own scale: 0 verbose, 1 info, 2 warning, 3 error, 4 fatal
ORT_DEFAULT, ORT_ERROR = -1, 3  # -1: the session follows ORT's default logger (warnings and above)


def physical_cores(cpuinfo: str = "/proc/cpuinfo") -> int:
    """Physical cores from /proc/cpuinfo's unique (physical id, core id) pairs.

    Falls back to ``os.cpu_count()`` (logical CPUs, so possibly 2x too many with SMT) where /proc/cpuinfo is
    missing or lacks the fields (macOS, Windows, some containers).
    """
    try:
        text = Path(cpuinfo).read_text()
    except OSError:
        return os.cpu_count() or 1
    cores, physical = set(), "0"
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "physical id":
            physical = value.strip()
        elif key.strip() == "core id":
            cores.add((physical, value.strip()))
    return len(cores) or os.cpu_count() or 1


def ort_log_severity(expected_warnings: bool) -> int:
    """The session's ``SessionOptions.log_severity_level``: ``VEIL_ORT_LOG_SEVERITY`` where it is set, else errors
    only for a model whose ORT warnings are expected by design, else ORT's default (warnings).

    An adapter model's LoRA (``lora.*.A``/``.B``) and head (``head.weight``/``.bias``) graph inputs have zero or
    empty initializers as their defaults, so the base runs without them; ORT warns once per such input ("Initializer
    ... appears in graph inputs and will not be treated as constant value/weight") at every session it creates.

    Raises:
        ValueError: ``VEIL_ORT_LOG_SEVERITY`` is not one of 0..4 (naming it, the expected and the received value).
    """
    raw = os.environ.get(ORT_LOG_ENV, "").strip()
    if raw:
        if raw not in ("0", "1", "2", "3", "4"):
            raise ValueError(f"{ORT_LOG_ENV}: expected one of 0 (verbose), 1 (info), 2 (warning), 3 (error), "
                             f"4 (fatal), received {raw!r}")
        return int(raw)
    return ORT_ERROR if expected_warnings else ORT_DEFAULT


def providers_for(kind: str) -> list[str]:
    """The provider list for a Triton ``instance_group.kind`` (KIND_AUTO: CUDA when this ORT build has it)."""
    if kind == "KIND_GPU" or (kind == "KIND_AUTO" and CUDA in ort.get_available_providers()):
        return [CUDA, CPU]
    return [CPU]


@dataclass
class RuntimeOptions:
    """How to build a session; config.pbtxt values override the server-wide defaults."""

    providers: list[str] = field(default_factory=lambda: [CPU])
    intra_op_threads: int = 0  # 0: physical cores
    inter_op_threads: int = 0  # 0: ORT default
    graph_level: str = "all"
    io_binding: bool | None = None  # None: on exactly when the CUDA EP is active
    he_processes: int = 1  # HE models: processes per request (veil.he.parallel); 0: every core, 1: serial
    he_encoded_bytes: int | None = None  # HE models: masks encoded at load, bytes per model (None: he.evaluate's)
    log_severity: int = ORT_DEFAULT  # ORT's SessionOptions.log_severity_level (see ort_log_severity)


class Session:
    """An ``onnxruntime.InferenceSession`` with its real providers and a thin ``run(feeds) -> outputs``.

    Args:
        path: the ``model.onnx`` file.
        options: providers, threads, graph optimization level, IO binding.
    """

    def __init__(self, path: Path, options: RuntimeOptions) -> None:
        so = ort.SessionOptions()
        so.graph_optimization_level = GRAPH_LEVELS[options.graph_level]
        so.log_severity_level = options.log_severity
        so.intra_op_num_threads = options.intra_op_threads or physical_cores()
        if options.inter_op_threads:
            so.inter_op_num_threads = options.inter_op_threads
        self.requested = list(options.providers)
        self.session = ort.InferenceSession(str(path), so, providers=self.requested)
        self.providers = self.session.get_providers()
        self.provider = self.providers[0]
        self.fell_back = self.requested[0] not in self.providers
        if self.fell_back:
            logger.warning("%s: %s was requested but ONNX Runtime runs on %s (check onnxruntime-gpu, CUDA and cuDNN)",
                           path, self.requested[0], self.providers)
        self.input_types = {i.name: ONNX_DATATYPES.get(i.type, i.type) for i in self.session.get_inputs()}
        self.input_shapes = {i.name: _dims(i.shape) for i in self.session.get_inputs()}
        self.output_types = {o.name: ONNX_DATATYPES.get(o.type, o.type) for o in self.session.get_outputs()}
        self.output_shapes = {o.name: _dims(o.shape) for o in self.session.get_outputs()}
        self.output_names = list(self.output_types)
        use_binding = self.provider == CUDA if options.io_binding is None else options.io_binding
        self.run: Callable[[dict[str, np.ndarray]], list[np.ndarray]] = self._run_bound if use_binding else self._run
        self._device = "cuda" if self.provider == CUDA else "cpu"

    def _run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        return self.session.run(self.output_names, feeds)

    def _run_bound(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        binding = self.session.io_binding()
        for name, array in feeds.items():
            binding.bind_cpu_input(name, array)  # one host->device copy per input
        for name in self.output_names:
            binding.bind_output(name, self._device)  # ORT allocates on the device; no copy inside Run()
        self.session.run_with_iobinding(binding)
        return binding.copy_outputs_to_cpu()

    def warm_up(self, batch_sizes: list[int]) -> None:
        """Run dummy inputs (zeros, empty strings) of the graph's shapes, -1/symbolic dims -> batch or 1.

        A graph that refuses the dummy shapes (e.g. a dim that must be >= 2) is reported as a warning,
        not hidden: the model still serves, only without the warm-up.
        """
        for batch in batch_sizes:
            feeds = {}
            for name, dims in self.input_shapes.items():
                shape = [(batch if i == 0 else 1) if d < 0 else d for i, d in enumerate(dims)]
                datatype = self.input_types[name]
                feeds[name] = (np.full(shape, "", dtype=object) if datatype == "BYTES"
                               else np.zeros(shape, dtype=DATATYPES.get(datatype, np.float32)))
            try:
                self.run(feeds)
            except Exception as exc:  # ORT raises several unrelated types for bad shapes
                logger.warning("warm-up at batch %d failed; the model serves without it: %s", batch, exc)
                return


def _dims(shape: list[int | str | None]) -> list[int]:
    """ORT's shape (ints, symbolic names or None) -> OIP dims with -1 for anything not fixed."""
    return [d if isinstance(d, int) and d >= 0 else -1 for d in shape]
