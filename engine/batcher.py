"""Per-model request scheduling: Triton-style dynamic batching, or one session run per request.

Modelled on Triton's dynamic batcher (``dynamic_batching { max_queue_delay_microseconds
default_queue_policy { max_queue_size } }`` with ``max_batch_size``): one asyncio loop per model takes the
first waiting request once an instance is free, then gathers the queued ones; while such a batch is forming (two
or more requests) it waits up to ``max_queue_delay_microseconds`` for more, until it holds ``max_batch_size``
samples. Batching never costs a lone request: one that finds the queue empty and an instance free runs at once,
without passing through the loop (issue 20: +0.0 ms at concurrency 1). The window is timed by polling the event
loop (``asyncio.sleep(0)``) for its last millisecond: the stock loop's timers round up to the next millisecond
(a 0.5 ms window waited 1.2 ms) and libuv's (uvloop) round down to zero (it never waited).
Requests whose tags (:meth:`Scheduler.submit`), non-batch dims and dtypes match are concatenated along dim 0 and
run as one call; the outputs are split back. Requests that do not match run separately. The run happens in a worker thread (ONNX Runtime releases the GIL), so the event loop
keeps reading requests meanwhile. A full queue is refused with :class:`QueueFull` (HTTP 503); a run that fails
on its inputs is a 400, one that fails for any other reason a 500 logged once (:meth:`Scheduler._classify`).
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import time
from collections.abc import Callable, Hashable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
from onnxruntime.capi import onnxruntime_pybind11_state as ort_state

from .errors import EngineError, InferenceFailed, InternalError, ModelNotReady, QueueFull
from .metrics import ModelMetrics
from .repository import BatchingConfig

Feeds = dict[str, np.ndarray]
logger = logging.getLogger("veil.engine")
# ONNX Runtime's errors for inputs the graph refuses (the client's fault); its other types are the server's
_ORT_INPUT_ERRORS = (ort_state.InvalidArgument, ort_state.RuntimeException, ort_state.Fail)


@dataclass
class _Pending:
    feeds: Feeds
    batch: int  # samples in this request (dim 0), 1 for models without a batch dim
    future: asyncio.Future
    tag: Hashable = None  # requests run together only with requests of the same tag (e.g. an adapter id)
    enqueued_ns: int = field(default_factory=time.perf_counter_ns)
    queue_ns: int = 0

    @property
    def key(self) -> tuple:
        """Requests with equal keys can be concatenated along dim 0."""
        return (self.tag, *((name, a.dtype.str, a.shape[1:]) for name, a in self.feeds.items()))


class Scheduler:
    """Runs a model's requests on ``instances`` worker threads, batching them when ``batching`` is set.

    Args:
        run: ``feeds -> list of outputs`` (one session run), called in a worker thread for untagged requests.
        output_names: the names of ``run``'s outputs, in order.
        max_batch_size: the largest batch one run may take (config.pbtxt ``max_batch_size``).
        batching: the ``dynamic_batching`` block, or None to run every request on its own.
        instances: concurrent runs (config.pbtxt ``instance_group.count``).
        metrics: where executions are counted.
        run_tagged: ``(feeds, tag) -> list of outputs``: the grouped-execution hook, called in a worker thread
            for each group of requests submitted with the same non-None ``tag`` (one run per tag and shape,
            e.g. one ORT run per LoRA adapter: :class:`veil.engine.adapters.AdapterScheduler`).
    """

    def __init__(self, run: Callable[[Feeds], list[np.ndarray]], output_names: list[str], max_batch_size: int,
                 batching: BatchingConfig | None, instances: int, metrics: ModelMetrics,
                 run_tagged: Callable[[Feeds, Hashable], list[np.ndarray]] | None = None) -> None:
        self._run, self._run_tagged, self._names, self._metrics = run, run_tagged, output_names, metrics
        self.max_batch_size, self.batching, self.instances = max(max_batch_size, 1), batching, instances
        self._executor = ThreadPoolExecutor(max_workers=instances, thread_name_prefix=f"veil-{metrics.name}")
        self._pending: collections.deque[_Pending] = collections.deque()
        self._inflight: set[asyncio.Task] = set()
        self._task: asyncio.Task | None = None
        self._closing, self._active, self._forming = False, 0, False
        self._reset_primitives()

    def _reset_primitives(self) -> None:
        # asyncio primitives bind to the loop that first waits on them; a new server loop gets new ones
        self._arrived, self._free = asyncio.Event(), asyncio.Semaphore(self.instances)

    @property
    def active(self) -> int:
        """Requests queued or running now."""
        return self._active

    async def submit(self, feeds: Feeds, batch: int, tag: Hashable = None) -> tuple[dict[str, np.ndarray], int]:
        """Schedule one request; returns its outputs (name -> array) and the ns it spent queued.

        ``tag``: requests are batched only with requests of the same tag; a non-None tag runs through
        ``run_tagged(feeds, tag)``.

        Raises:
            ValueError: a tag was given but the scheduler has no ``run_tagged`` hook.
            QueueFull: the dynamic-batching queue is at ``max_queue_size``.
            ModelNotReady: the model is draining for unload or shutdown.
            InferenceFailed: ONNX Runtime refused the inputs.
        """
        if self._closing:
            raise ModelNotReady(f"model '{self._metrics.name}' is unloading")
        if tag is not None and self._run_tagged is None:
            raise ValueError(f"model '{self._metrics.name}': tag {tag!r} given, but the scheduler has no run_tagged")
        pending = _Pending(feeds, batch, asyncio.get_running_loop().create_future(), tag)
        self._active += 1
        try:
            return await self._schedule(pending), pending.queue_ns
        finally:
            self._active -= 1

    async def _schedule(self, pending: _Pending) -> dict[str, np.ndarray]:
        # a lone request (nothing queued, no batch forming, an instance free) runs at once: batching never costs
        lone = not self._pending and not self._forming and not self._free.locked()
        if self.batching is None or lone:
            async with self._free:
                await self._execute([pending])
        else:
            if self.batching.max_queue_size and len(self._pending) >= self.batching.max_queue_size:
                raise QueueFull(f"model '{self._metrics.name}': queue is full (max_queue_size "
                                f"{self.batching.max_queue_size}); retry later")
            if self._task is None:
                delay = self.batching.max_queue_delay_us / 1e6
                self._task = asyncio.get_running_loop().create_task(self._loop(delay))
            self._pending.append(pending)
            self._arrived.set()
        return await pending.future

    async def _next(self, timeout: float | None) -> _Pending | None:
        """The oldest waiting request; None once ``timeout`` seconds pass with none."""
        while not self._pending:
            self._arrived.clear()
            try:
                await asyncio.wait_for(self._arrived.wait(), timeout)
            except asyncio.TimeoutError:
                return None
        return self._pending.popleft()

    async def _loop(self, delay: float) -> None:
        loop = asyncio.get_running_loop()
        while True:
            first = await self._next(None)
            self._forming = True  # from here on, arrivals queue behind this batch instead of running alone
            await self._free.acquire()  # wait for an instance: meanwhile more requests queue up
            batch, size, deadline = [first], first.batch, time.perf_counter() + delay
            while size < self.max_batch_size:
                nxt = self._next_nowait()
                if nxt is None and len(batch) > 1:  # a batch is forming: wait for more, up to the window
                    nxt = await self._wait_next(deadline)
                if nxt is None:
                    break
                if size + nxt.batch > self.max_batch_size:
                    self._pending.appendleft(nxt)  # starts the next batch
                    break
                batch.append(nxt)
                size += nxt.batch
            self._forming = False
            task = loop.create_task(self._execute(batch, release=True))
            self._inflight.add(task)
            task.add_done_callback(self._inflight.discard)

    async def _wait_next(self, deadline: float) -> _Pending | None:
        """The next arrival before ``deadline`` (a ``perf_counter`` time), or None: a timer for all but the last
        millisecond, then polling the loop (timers are millisecond-granular, rounding up or down by loop)."""
        while not self._pending:
            left = deadline - time.perf_counter()
            if left <= 0:
                return None
            if left > 0.002:
                nxt = await self._next(left - 0.001)
                if nxt is not None:
                    return nxt
            else:
                await asyncio.sleep(0)  # one loop iteration: reads sockets, runs ready callbacks
        return self._pending.popleft()

    def _next_nowait(self) -> _Pending | None:
        return self._pending.popleft() if self._pending else None

    async def _execute(self, batch: list[_Pending], release: bool = False) -> None:
        """Run ``batch`` (grouped by matching shapes) in a worker thread and resolve its futures."""
        try:
            groups: dict[tuple, list[_Pending]] = {}
            for p in batch:
                groups.setdefault(p.key, []).append(p)
            loop = asyncio.get_running_loop()
            for group in groups.values():
                start = time.perf_counter_ns()
                for p in group:
                    p.queue_ns = start - p.enqueued_ns
                try:
                    results = await loop.run_in_executor(self._executor, self._run_group, group, group[0].tag)
                except Exception as exc:
                    error = self._classify(exc, len(group))
                    for p in group:
                        if not p.future.done():
                            p.future.set_exception(error)
                    continue
                for p, outputs in zip(group, results, strict=True):
                    if not p.future.done():  # the client may have gone away
                        p.future.set_result(outputs)
        finally:
            if release:
                self._free.release()

    def _classify(self, exc: Exception, requests: int) -> EngineError:
        """The error a failed run gives its requests: the client's fault (4xx) or the server's (500, logged once).

        ONNX Runtime's InvalidArgument / RuntimeException / Fail mean "these inputs" (a shape the graph cannot
        reshape, a wrong rank); an engine error keeps its own status; anything else (a bug, MemoryError, a device
        failure) is a server fault: logged here once for the whole group, and a 500 for each request.
        """
        if isinstance(exc, EngineError):
            return exc
        if isinstance(exc, _ORT_INPUT_ERRORS):
            return InferenceFailed(f"model '{self._metrics.name}': ONNX Runtime failed on these inputs: {exc}")
        logger.error("model '%s': run failed for %d request(s)", self._metrics.name, requests, exc_info=exc)
        return InternalError(f"internal error: {type(exc).__name__} while running model '{self._metrics.name}'")

    def _run_group(self, group: list[_Pending], tag: Hashable) -> list[dict[str, np.ndarray]]:
        """Worker thread: concatenate along dim 0, one run (``run``, or ``run_tagged`` for a tag), split the
        outputs back per request."""
        t0 = time.perf_counter_ns()
        if len(group) == 1:
            feeds = group[0].feeds
        else:
            feeds = {name: np.concatenate([p.feeds[name] for p in group]) for name in group[0].feeds}  # (sum B, ...)
        t1 = time.perf_counter_ns()
        outputs = self._run(feeds) if tag is None else self._run_tagged(feeds, tag)  # type: ignore[misc]
        t2 = time.perf_counter_ns()
        if len(group) == 1:
            results = [dict(zip(self._names, outputs, strict=True))]
        else:
            bounds = np.cumsum([0] + [p.batch for p in group])
            results = [{n: o[a:b] for n, o in zip(self._names, outputs, strict=True)} for a, b in itertools.pairwise(bounds)]
        t3 = time.perf_counter_ns()
        self._metrics.record_execution(sum(p.batch for p in group), len(group), t1 - t0, t2 - t1, t3 - t2)
        return results

    async def drain(self) -> None:
        """Refuse new requests, let queued and running ones finish, then stop the loop."""
        self._closing = True
        while self._active or self._inflight:
            await asyncio.sleep(0.001)
        if self._task is not None:
            self._task.cancel()
            self._task = None
        self._reset_primitives()
        self._closing = False

    def close(self) -> None:
        self._executor.shutdown(wait=True)
