"""Counters behind ``GET /metrics`` (Prometheus) and ``GET /v2/models/{m}/stats`` (Triton statistics).

Names follow Triton's where Triton has one (``nv_inference_request_success``, ``nv_inference_count``,
``nv_inference_exec_count``, ``nv_inference_*_duration_us``), exactly: no ``_total`` suffix and no ``_created``
series (:class:`CounterFamily`), so dashboards built for Triton work; the
average batch size is ``nv_inference_count / nv_inference_exec_count``. veil adds histograms
(``veil_request_duration_seconds``, ``veil_batch_size``) and ``veil_execution_provider``, a gauge whose
label is the provider ONNX Runtime really uses (with the requested one beside it). Each app has its own
registry, so several servers (and tests) in one process do not share counters. No payload is ever recorded.
"""

from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Gauge, Histogram, generate_latest
from prometheus_client.utils import floatToGoString

_LABELS = ["model", "version"]


@dataclass
class _Duration:
    count: int = 0
    ns: int = 0

    def add(self, ns: int) -> None:
        self.count += 1
        self.ns += ns


@dataclass
class ModelStats:
    """Triton's per-version statistics (ns totals); updated under a lock from the loop and worker threads."""

    inference_count: int = 0
    execution_count: int = 0
    last_inference_ms: int = 0
    success: _Duration = field(default_factory=_Duration)
    fail: _Duration = field(default_factory=_Duration)
    queue: _Duration = field(default_factory=_Duration)
    compute_input: _Duration = field(default_factory=_Duration)
    compute_infer: _Duration = field(default_factory=_Duration)
    compute_output: _Duration = field(default_factory=_Duration)


class ModelMetrics:
    """The counters of one model version, pre-bound to its labels (no label lookup per request)."""

    def __init__(self, metrics: Metrics, name: str, version: str) -> None:
        self.name, self.version = name, version
        self.stats, self._lock = ModelStats(), threading.Lock()
        labels = {"model": name, "version": version}
        self._success = metrics.success.labels(**labels)
        self._failure = metrics.failure.labels(**labels)
        self._count = metrics.count.labels(**labels)
        self._exec = metrics.exec_count.labels(**labels)
        self._request_us = metrics.request_us.labels(**labels)
        self._queue_us = metrics.queue_us.labels(**labels)
        self._input_us = metrics.input_us.labels(**labels)
        self._infer_us = metrics.infer_us.labels(**labels)
        self._output_us = metrics.output_us.labels(**labels)
        self._request_hist = metrics.request_hist.labels(**labels)
        self._batch_hist = metrics.batch_hist.labels(**labels)

    def record_request(self, ok: bool, duration_ns: int, queue_ns: int) -> None:
        """One request finished (successfully or not) after ``duration_ns``, of which ``queue_ns`` queued."""
        with self._lock:
            (self.stats.success if ok else self.stats.fail).add(duration_ns)
            if ok:
                self.stats.queue.add(queue_ns)
                self.stats.last_inference_ms = time.time_ns() // 1_000_000
        (self._success if ok else self._failure).inc()
        self._request_us.inc(duration_ns / 1e3)
        self._request_hist.observe(duration_ns / 1e9)
        if ok:
            self._queue_us.inc(queue_ns / 1e3)

    def record_execution(self, batch_size: int, requests: int, input_ns: int, infer_ns: int, output_ns: int) -> None:
        """One session run over ``batch_size`` samples from ``requests`` requests."""
        with self._lock:
            self.stats.inference_count += batch_size
            self.stats.execution_count += 1
            for duration, ns in ((self.stats.compute_input, input_ns), (self.stats.compute_infer, infer_ns),
                                 (self.stats.compute_output, output_ns)):
                duration.count += requests
                duration.ns += ns * requests
        self._count.inc(batch_size)
        self._exec.inc()
        self._input_us.inc(input_ns * requests / 1e3)
        self._infer_us.inc(infer_ns * requests / 1e3)
        self._output_us.inc(output_ns * requests / 1e3)
        self._batch_hist.observe(batch_size)

    def to_triton(self) -> dict:
        """One ``model_stats`` entry as Triton's statistics extension returns it."""
        s = self.stats

        def d(x: _Duration) -> dict[str, int]:
            return {"count": x.count, "ns": x.ns}

        return {"name": self.name, "version": self.version, "last_inference": s.last_inference_ms,
                "inference_count": s.inference_count, "execution_count": s.execution_count,
                "inference_stats": {"success": d(s.success), "fail": d(s.fail), "queue": d(s.queue),
                                    "compute_input": d(s.compute_input), "compute_infer": d(s.compute_infer),
                                    "compute_output": d(s.compute_output), "cache_hit": d(_Duration()),
                                    "cache_miss": d(_Duration())},
                "batch_stats": []}


class _CounterChild:
    """One labelled counter value (thread-safe: batcher worker threads and the event loop both count)."""

    def __init__(self) -> None:
        self.value, self._lock = 0.0, threading.Lock()

    def inc(self, amount: float = 1.0) -> None:
        if amount < 0:
            raise ValueError(f"counter increment: expected >= 0, received {amount}")
        with self._lock:
            self.value += amount


class CounterFamily:
    """A Prometheus counter exposed under exactly its name, with ``# TYPE <name> counter``.

    prometheus_client's ``Counter`` appends ``_total`` and adds a ``_created`` series, so Triton's
    ``nv_inference_request_success`` would read ``nv_inference_request_success_total``, which Triton's
    dashboards do not query. This family renders the text exposition format itself.
    """

    def __init__(self, name: str, documentation: str, labelnames: list[str]) -> None:
        self.name, self.documentation, self.labelnames = name, documentation, list(labelnames)
        self._children: dict[tuple[str, ...], _CounterChild] = {}
        self._lock = threading.Lock()

    def labels(self, **labels: str) -> _CounterChild:
        if sorted(labels) != sorted(self.labelnames):
            raise ValueError(f"{self.name} labels: expected {self.labelnames}, received {sorted(labels)}")
        key = tuple(str(labels[n]) for n in self.labelnames)
        with self._lock:
            return self._children.setdefault(key, _CounterChild())

    def render(self) -> str:
        lines = [f"# HELP {self.name} {_escape(self.documentation, help_text=True)}", f"# TYPE {self.name} counter"]
        with self._lock:
            children = sorted(self._children.items())
        for key, child in children:
            labels = ",".join(f'{n}="{_escape(v)}"' for n, v in zip(self.labelnames, key, strict=True))
            lines.append(f"{self.name}{{{labels}}} {floatToGoString(child.value)}")
        return "\n".join(lines) + "\n"


def _escape(text: str, help_text: bool = False) -> str:
    """Prometheus text-format escaping: backslash and newline (and double quotes in label values)."""
    text = text.replace("\\", "\\\\").replace("\n", "\\n")
    return text if help_text else text.replace('"', '\\"')


class Metrics:
    """The per-app Prometheus registry and its metric families."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.counters: dict[str, CounterFamily] = {}
        r = self.registry

        def counter(name: str, doc: str) -> CounterFamily:
            return self.counter(name, doc, _LABELS)

        self.success = counter("nv_inference_request_success", "Number of successful inference requests")
        self.failure = counter("nv_inference_request_failure", "Number of failed inference requests")
        self.count = counter("nv_inference_count", "Number of inferences performed (batch samples)")
        self.exec_count = counter("nv_inference_exec_count", "Number of model executions (session runs)")
        self.request_us = counter("nv_inference_request_duration_us", "Cumulative request duration (us)")
        self.queue_us = counter("nv_inference_queue_duration_us", "Cumulative time requests spent queued (us)")
        self.input_us = counter("nv_inference_compute_input_duration_us", "Cumulative compute input duration (us)")
        self.infer_us = counter("nv_inference_compute_infer_duration_us", "Cumulative compute infer duration (us)")
        self.output_us = counter("nv_inference_compute_output_duration_us", "Cumulative compute output duration (us)")
        self.request_hist = Histogram("veil_request_duration_seconds", "Server-side request duration", _LABELS,
                                      registry=r, buckets=(1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2,
                                                           5e-2, 0.1, 0.25, 0.5, 1.0, 2.5))
        self.batch_hist = Histogram("veil_batch_size", "Samples per session run", _LABELS, registry=r,
                                    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256))
        self.provider = Gauge("veil_execution_provider", "1 for the execution provider ONNX Runtime really uses",
                              [*_LABELS, "provider", "requested"], registry=r)

    def counter(self, name: str, documentation: str, labelnames: list[str]) -> CounterFamily:
        """The counter family ``name`` of this app (created on first use), rendered under exactly that name."""
        if name not in self.counters:
            self.counters[name] = CounterFamily(name, documentation, labelnames)
        return self.counters[name]

    def for_model(self, name: str, version: str, provider: str, requested: str) -> ModelMetrics:
        self.provider.labels(model=name, version=version, provider=provider, requested=requested).set(1)
        return ModelMetrics(self, name, version)

    def forget(self, name: str, version: str, provider: str, requested: str) -> None:
        """Drop the provider label of an unloaded model (counters stay, as in Triton)."""
        with contextlib.suppress(KeyError):
            self.provider.remove(name, version, provider, requested)

    def render(self) -> bytes:
        """The Prometheus text exposition: the counters (exact names), then the histograms and gauges."""
        counters = "".join(family.render() for family in self.counters.values()).encode()
        return counters + generate_latest(self.registry)
